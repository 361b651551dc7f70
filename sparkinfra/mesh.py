"""
The head's SSH mesh over the fabric: its own key, each worker's user and host key.
"""

from __future__ import annotations

from .settings import Cluster

MESH_KEY = "/root/.ssh/sparkinfra_fabric"
MESH_KNOWN_HOSTS = "/root/.ssh/sparkinfra_known_hosts"
MESH_CONFIG = "/root/.ssh/config"  # the head's entries sit in a marked block (files.block)
MESH_CONFIG_MARKER = "# {mark} sparkinfra fabric mesh"
HOST_KEY = "/etc/ssh/ssh_host_ed25519_key.pub"


def mesh_config(cluster: Cluster) -> str:
    """The head's SSH config entries: one per worker fabric IP, with that worker's user."""
    blocks = []
    for worker in cluster.workers:
        blocks.append(
            f"Host {worker.fabric_ip}\n"
            f"    User {worker.ssh_user}\n"
            f"    IdentityFile {MESH_KEY}\n"
            f"    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {MESH_KNOWN_HOSTS}\n"
            f"    StrictHostKeyChecking yes\n"
            f"    BatchMode yes"
        )
    return "\n".join(blocks)
