"""
The head's SSH mesh over the fabric: its key, authorized on each worker, the workers' host keys.
"""

from __future__ import annotations

import re
from pathlib import Path

from pyinfra import host
from pyinfra.api import (
    QuoteString,
    StringCommand,
    operation,
)
from pyinfra.facts.files import File, FileContents
from pyinfra.facts.server import Home
from pyinfra.operations import files

from ..facts.mesh import AuthorizedKeys
from ..facts.reading import gathered, gathered_each
from ..node.paths import MESH_KEY, MESH_KNOWN_HOSTS
from ..settings import Cluster
from .files import file_content, preparing, refuse

HOST_KEY = "/etc/ssh/ssh_host_ed25519_key.pub"
MESH_KEX = "curve25519-sha256,curve25519-sha256@libssh.org,sntrup761x25519-sha512@openssh.com"
MESH_CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com"


def mesh_config(cluster: Cluster) -> str:
    """
    The head's SSH config entries: one per worker fabric IP, with that worker's user. On the
    fabric's point-to-point link, the key exchange prefers curve25519 over OpenSSH's post-quantum
    default (sntrup761x25519, still accepted): ~75 ms less for every session's start, which each
    staging pull and image load pays; and the cipher AES-GCM over the default chacha20-poly1305
    (still accepted): AES runs in hardware on both x86 and the Spark's Arm cores, ~1.8x the
    stream's rate (449 against 252 MB/s on the bed's machine).
    """
    blocks = []
    for worker in cluster.workers:
        blocks.append(
            f"Host {worker.fabric_ip}\n"
            f"    User {worker.ssh_user}\n"
            f"    IdentityFile {MESH_KEY}\n"
            f"    IdentitiesOnly yes\n"
            f"    KexAlgorithms {MESH_KEX}\n"
            f"    Ciphers {MESH_CIPHERS}\n"
            f"    UserKnownHostsFile {MESH_KNOWN_HOSTS}\n"
            f"    StrictHostKeyChecking yes\n"
            f"    BatchMode yes"
        )
    return "\n".join(blocks)


@operation()
def ssh_key_present(path: str, comment: str = "", present: bool = True):
    """
    Ensure an ed25519 key pair exists (generated here; the private key never leaves the host).

    + path: the private key; the public key is ``path + ".pub"``
    + comment: the key's comment
    + present: whether the pair must exist (``False``: both files removed)
    """
    if not present:
        for each in (path, f"{path}.pub"):
            yield from file_content._inner(path=each, present=False)
        return
    if gathered(host, File, path=path) and gathered(host, File, path=f"{path}.pub"):
        host.noop(f"{path} exists")
        return
    yield StringCommand("mkdir", "-p", "-m", "700", QuoteString(str(Path(path).parent)))
    yield StringCommand("rm", "-f", QuoteString(path), QuoteString(f"{path}.pub"))
    yield StringCommand("ssh-keygen", "-q", "-t", "ed25519", "-N", "''", "-C", QuoteString(comment), "-f", QuoteString(path))


@operation()
def ssh_key_authorized(user: str, key_host, key_path: str, from_ip: str, present: bool = True):
    """
    Ensure another host's public key is authorized for ``user`` here, from ``from_ip`` only.

    + user: the local user the key logs in as
    + key_host: the pyinfra host holding the key (read when this operation runs)
    + key_path: the public key file on ``key_host``
    + from_ip: the only source address the key is accepted from (the head's fabric IP)
    + present: whether it must be authorized; ``False`` removes every line holding the key (found
      by the key itself: run it before the key goes from ``key_host``)
    """
    pubkey = (gathered(key_host, FileContents, path=key_path) or [""])[0].strip()
    if not pubkey and not present:
        host.noop(f"no key {key_path} on {key_host.name}: none of it to remove")
        return
    if not pubkey:
        if preparing():
            yield StringCommand("echo", f"the key {key_path} of {key_host.name} is generated first")
            return
        yield from refuse(f"{host.name}: no public key {key_path} on {key_host.name}")
        return
    line = f'from="{from_ip}" {pubkey}'
    now = gathered(host, AuthorizedKeys, user=user) if present else None
    if now and now["ssh_dir"] == ["directory", user, user, "700"] and now["file"] == ["file", user, user, "600"]:
        holding = [held for held in now["lines"] if pubkey.split()[1] in held]
        if holding and all(held == line for held in holding):
            host.noop(f"{key_host.name}'s key is authorized for {user} from {from_ip}")
            return
    home = gathered(host, Home, user=user)
    # grep/sed read a basic regex: the key's base64 '+' is literal there (re.escape's '\+' is not).
    match = ".*" + re.sub(r"([\\.\[\]*^$])", r"\\\1", pubkey.split()[1]) + ".*"
    if not present:  # nothing created on the way (no .ssh folder, no empty file)
        yield from files.line._inner(path=f"{home}/.ssh/authorized_keys", line=match, present=False)
        return
    yield from files.directory._inner(path=f"{home}/.ssh", user=user, group=user, mode="700")
    yield from files.line._inner(
        path=f"{home}/.ssh/authorized_keys",
        line=match,
        replace=line,
        present=present,
    )
    yield from files.file._inner(path=f"{home}/.ssh/authorized_keys", user=user, group=user, mode="600")


@operation()
def known_hosts(path: str, workers: list, present: bool = True):
    """
    Ensure the head's known_hosts for the fabric holds each worker's ed25519 host key under its
    fabric IP, read from the worker itself when this operation runs.

    + path: the known_hosts file
    + workers: ``(pyinfra host, fabric IP)`` pairs
    + present: whether the file must exist (``False``: removed; ``workers`` unused)
    """
    if not present:
        yield from file_content._inner(path=path, present=False)
        return
    contents = gathered_each([w for w, _ in workers], FileContents, path=HOST_KEY)
    lines = []
    for (worker, ip), content in zip(workers, contents):
        key = " ".join(" ".join(content or []).split()[:2])
        if not key:
            yield from refuse(f"{worker.name}: no SSH host key at {HOST_KEY}")
            return
        lines.append(f"{ip} {key}\n")
    yield from file_content._inner(path=path, content="".join(lines), mode="600")
