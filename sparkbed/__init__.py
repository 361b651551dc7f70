"""
The test bed: simulated DGX Sparks on one Linux machine.

Each node is a systemd-nspawn container (systemd as PID 1, sshd, dockerd) over one shared
debootstrapped base, in a network namespace of its own with:

- ``mgmt0`` on the management network, reached from the ``sparkbed-mgmt`` namespace where the
  controller (pyinfra, pytest, ssh) runs;
- a GB10's ConnectX-7 netdevs (shape ``gb10``; ``site2`` names them otherwise): two QSFP ports of two
  PCIe functions ("twins") each, each with its own RDMA device. The cabled port's twins
  (``enp1s0f0np0``, the fabric interface, and ``enP2p1s0f0np0``) are a veth pair each for 2 nodes,
  or ports of a switch (one bridge per twin) for more; the other port's two never get a carrier.

GPU/RDMA tools are stand-ins (``standins/``) that follow the node's live link state, each RDMA
device its own netdev's. A per-node supervisor restarts the container when it reboots, resetting
what a reboot loses (addresses flushed, MTU 1500, links down), as a real machine would come back.
The hub also serves a Python package index (``NCCL_INDEX_URL``) of ``nvidia-nccl-cu13`` wheels, and
git repositories (read-only, as GitHub): the bed's build repository (``BUILD_REPO_URL``). What the
network decides moves as upstream authors move it: ``hub_move_main``/``hub_reset_main`` (the tiny
model's ``main`` on the hub), ``build_repo_commit`` (the build repository's ``main``).

Everything lives in namespaces the bed creates; ``unreachable`` routes for its subnet are
installed in the root namespace first and removed last.

The parts: ``layout`` (addresses, folders, the nodes as data), ``network`` (namespaces, guard route,
fabric, cable), ``cache`` (base, image rootfs, tiny model: ``build``), ``controller`` (SSH, secrets,
NCCL stand-ins, the hub's process), ``nodes`` (containers, supervisor, ``node_exec``, ``reboot``),
``lifecycle`` (``up``, ``down``), ``snapshots`` (HF-cache snapshots), ``upstream`` (the hub's model
branch and the build repository: ``sparkbed/build-repo/`` and ``images/sparkbed-lane``); ``hub``
serves the model, the index and the git repositories.
"""

from .cache import (BASE, BASE_PACKAGES, IMAGE, IMAGE_BUILD, IMAGE_ROOTFS, IMAGE_ROOTFS_IN_NODE, SIM_MODEL,
                    SIM_REVISION, TINY_MODEL, TINY_SCRIPT, VLLM_TREE_IN_NODE, apt_mirror, base_is_current, build,
                    build_base, build_image_rootfs, build_tiny_model, vllm_tree)
from .cache import IMAGE_NCCL, IMAGE_NCCL_KEY
from .controller import (API_KEY_ENV, BUILD_REPO_NAME, BUILD_REPO_URL, GIT_ROOT, LOCKS, lock_path, HUB_DOWNLOADS,
                         HUB_PORT, HUB_ROOT,
                         HUB_TOKEN_ENV, HUB_URL, NCCL_INDEX_URL,
                         NCCL_STANDIN_VERSIONS, NCCL_WHEEL_PROJECT, NCCL_WHEELS, PYPI_ROOT, api_key_file,
                         build_nccl_standins, build_nccl_wheels, controller_env, controller_key, hub_token_file,
                         known_hosts, nccl_index_downloads, nccl_standin, nccl_wheel, sim_hosts, ssh_config)
from .layout import (CACHE, CGROUP_ROOTS, CMA_KIB, CONTROLLER_DIR, DEFAULT_SHAPE, FABRIC_NET, KERNEL_RELEASE,
                     MGMT_GATEWAY, MGMT_NET, MGMT_NS, NODES_DIR, PREFIX, SHAPES, STANDINS, STATE, SUBNET, SWITCH_NS,
                     NodeShape, SimNode,
                     compile_nccl_standin, elf_build_id, log, node_dir, read_state, run, sim_nodes, state_file)
from .lifecycle import _bed_mounts as _bed_mounts  # read by the e2e layer's teardown check
from .lifecycle import _our_pids as _our_pids
from .lifecycle import clear_stale, down, ensure, up
from .network import UNPLUGGED_NS, cable, in_netns, install_guard_routes, ip, power_on_network, remove_guard_routes
from .nodes import container_pid, node_exec, nspawn_command, reboot, supervise, wait_running
from .snapshots import make_snapshot
from .upstream import (BUILD_REPO, BUILD_REPO_BRANCH, BUILD_REPO_MOD_GROUP, BUILD_REPO_MODS, BUILD_REPO_PRODUCES,
                       GREETING_FLAG, build_repo_commit, build_repo_head, fresh_upstream, hub_move_main,
                       hub_reset_main, make_build_repo)

__all__ = [
    # cache
    "BASE", "BASE_PACKAGES", "IMAGE", "IMAGE_BUILD", "IMAGE_ROOTFS", "IMAGE_ROOTFS_IN_NODE", "SIM_MODEL",
    "SIM_REVISION", "TINY_MODEL", "TINY_SCRIPT", "VLLM_TREE_IN_NODE", "apt_mirror", "base_is_current", "build",
    "build_base", "build_image_rootfs", "build_tiny_model", "vllm_tree", "IMAGE_NCCL", "IMAGE_NCCL_KEY",
    # controller
    "API_KEY_ENV", "BUILD_REPO_NAME", "BUILD_REPO_URL", "GIT_ROOT", "LOCKS", "lock_path", "HUB_DOWNLOADS", "HUB_PORT", "HUB_ROOT",
    "HUB_TOKEN_ENV", "HUB_URL", "NCCL_INDEX_URL",
    "NCCL_STANDIN_VERSIONS", "NCCL_WHEEL_PROJECT", "NCCL_WHEELS", "PYPI_ROOT", "api_key_file",
    "build_nccl_standins", "build_nccl_wheels", "controller_env", "controller_key", "hub_token_file", "known_hosts",
    "nccl_index_downloads", "nccl_standin", "nccl_wheel", "sim_hosts", "ssh_config",
    # layout
    "CACHE", "CGROUP_ROOTS", "CMA_KIB", "CONTROLLER_DIR", "DEFAULT_SHAPE", "FABRIC_NET", "KERNEL_RELEASE",
    "MGMT_GATEWAY", "MGMT_NET",
    "MGMT_NS", "NODES_DIR", "PREFIX", "SHAPES", "STANDINS", "STATE", "SUBNET", "SWITCH_NS", "NodeShape", "SimNode",
    "compile_nccl_standin", "elf_build_id", "log", "node_dir", "read_state", "run", "sim_nodes", "state_file",
    # lifecycle
    "clear_stale", "down", "ensure", "up",
    # network
    "UNPLUGGED_NS", "cable", "in_netns", "install_guard_routes", "ip", "power_on_network", "remove_guard_routes",
    # nodes
    "container_pid", "node_exec", "nspawn_command", "reboot", "supervise", "wait_running",
    # snapshots
    "make_snapshot",
    # upstream
    "BUILD_REPO", "BUILD_REPO_BRANCH", "BUILD_REPO_MOD_GROUP", "BUILD_REPO_MODS", "BUILD_REPO_PRODUCES",
    "GREETING_FLAG", "build_repo_commit", "build_repo_head", "fresh_upstream", "hub_move_main", "hub_reset_main",
    "make_build_repo",
]
