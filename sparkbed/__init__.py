"""
The test bed: simulated DGX Sparks on one Linux machine.

Each node is a systemd-nspawn container (systemd as PID 1, sshd, dockerd) over one shared
debootstrapped base, in a network namespace of its own with:

- ``mgmt0`` on the management network, reached from the ``sparkbed-mgmt`` namespace where the
  controller (pyinfra, pytest, ssh) runs;
- the fabric port (``enp1s0f0np0``, or another shape's name): a veth pair for 2 nodes, a bridge ("switch") for more.

GPU/RDMA tools are stand-ins (``standins/``) that follow the node's live link state. A per-node
supervisor restarts the container when it reboots, resetting what a reboot loses (fabric
addresses flushed, MTU 1500, link down), as a real machine would come back.

Everything lives in namespaces the bed creates; ``unreachable`` routes for its subnet are
installed in the root namespace first and removed last.

The parts: ``layout`` (addresses, folders, the nodes as data), ``network`` (namespaces, guard route,
fabric, cable), ``cache`` (base, image rootfs, tiny model: ``build``), ``controller`` (SSH, secrets,
NCCL stand-ins, the hub's process), ``nodes`` (containers, supervisor, ``node_exec``, ``reboot``),
``lifecycle`` (``up``, ``down``), ``snapshots`` (HF-cache snapshots); ``hub`` serves the model.
"""

from .cache import (BASE, BASE_PACKAGES, IMAGE, IMAGE_BUILD, IMAGE_ROOTFS, IMAGE_ROOTFS_IN_NODE, SIM_MODEL,
                    SIM_REVISION, TINY_MODEL, TINY_SCRIPT, VLLM_TREE_IN_NODE, apt_mirror, build,
                    build_base, build_image_rootfs, build_tiny_model, vllm_tree)
from .controller import (API_KEY_ENV, HUB_PORT, HUB_ROOT, HUB_TOKEN_ENV, HUB_URL, NCCL_STANDIN_VERSIONS,
                         api_key_file, build_nccl_standins, controller_env, controller_key, hub_token_file,
                         known_hosts, nccl_standin, sim_hosts, ssh_config)
from .layout import (CACHE, CGROUP_ROOTS, CONTROLLER_DIR, FABRIC_NET, MGMT_GATEWAY, MGMT_NET, MGMT_NS,
                     NODES_DIR, PREFIX, SHAPES, STANDINS, STATE, SUBNET, SWITCH_NS, NodeShape, SimNode, log, node_dir, read_state, run,
                     sim_nodes, state_file)
from .lifecycle import _bed_mounts as _bed_mounts  # read by the e2e layer's teardown check
from .lifecycle import _our_pids as _our_pids
from .lifecycle import clear_stale, down, up
from .network import cable, in_netns, install_guard_routes, ip, power_on_network, remove_guard_routes
from .nodes import container_pid, node_exec, nspawn_command, reboot, supervise, wait_running
from .snapshots import make_snapshot

__all__ = [
    # cache
    "BASE", "BASE_PACKAGES", "IMAGE", "IMAGE_BUILD", "IMAGE_ROOTFS", "IMAGE_ROOTFS_IN_NODE", "SIM_MODEL",
    "SIM_REVISION", "TINY_MODEL", "TINY_SCRIPT", "VLLM_TREE_IN_NODE", "apt_mirror", "build",
    "build_base", "build_image_rootfs", "build_tiny_model", "vllm_tree",
    # controller
    "API_KEY_ENV", "HUB_PORT", "HUB_ROOT", "HUB_TOKEN_ENV", "HUB_URL", "NCCL_STANDIN_VERSIONS", "api_key_file",
    "build_nccl_standins", "controller_env", "controller_key", "hub_token_file", "known_hosts", "nccl_standin",
    "sim_hosts", "ssh_config",
    # layout
    "CACHE", "CGROUP_ROOTS", "CONTROLLER_DIR", "FABRIC_NET", "MGMT_GATEWAY", "MGMT_NET", "MGMT_NS",
    "NODES_DIR", "PREFIX", "SHAPES", "STANDINS", "STATE", "SUBNET", "SWITCH_NS", "NodeShape", "SimNode", "log", "node_dir", "read_state",
    "run", "sim_nodes", "state_file",
    # lifecycle
    "clear_stale", "down", "up",
    # network
    "cable", "in_netns", "install_guard_routes", "ip", "power_on_network", "remove_guard_routes",
    # nodes
    "container_pid", "node_exec", "nspawn_command", "reboot", "supervise", "wait_running",
    # snapshots
    "make_snapshot",
]
