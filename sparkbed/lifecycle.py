"""
The bed up and down: ``up`` clears what an earlier (killed) run left, then builds the networks,
mounts and identities, puts the hub's repositories as at first (``upstream``), starts the hub and
one supervisor per node and waits for them; ``down`` stops every process in the bed's cgroups and
removes namespaces, mounts, cgroups, node state (the hub's git repositories too), and last the
guard route.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import asdict
from pathlib import Path

from .cache import build_base, build_image_rootfs
from .controller import GIT_ROOT, LOCKS, _start_hub, build_nccl_standins, controller_key, known_hosts, ssh_config
from .layout import (CGROUP_ROOTS, CONTROLLER_DIR, DEFAULT_SHAPE, MGMT_NS, NODES_DIR, PREFIX, SHAPES, STATE, log, run, sim_nodes,
                     read_state, state_file)
from .network import _make_networks, install_guard_routes, remove_guard_routes
from .nodes import _mount_root, _start_supervisor, _wait_ssh, _write_identity, container_pid, wait_running
from .upstream import fresh_upstream


# Up
# --


def up(count: int = 2, shape: str = DEFAULT_SHAPE) -> dict:
    """Bring up ``count`` nodes of ``shape`` (a key of ``SHAPES``: netdevs and their RDMA devices,
    the cabled port, users), clearing whatever an earlier, killed run left, and wait for them."""
    if count < 2:
        raise SystemExit("the bed needs at least 2 nodes")
    if shape not in SHAPES:
        raise SystemExit(f"no such shape {shape!r}: one of {', '.join(sorted(SHAPES))}")
    started = time.monotonic()
    install_guard_routes()
    clear_stale()
    install_guard_routes()
    build_base()
    build_image_rootfs()
    nodes = sim_nodes(count, shape)
    STATE.mkdir(parents=True, exist_ok=True)
    CONTROLLER_DIR.mkdir(parents=True, exist_ok=True)
    key = controller_key()
    if not key.exists():
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparkbed-controller", "-f", str(key))
    pubkey = key.with_suffix(".pub").read_text()
    build_nccl_standins()
    state = {"nodes": [asdict(n) for n in nodes], "started": time.time()}
    state_file().write_text(json.dumps(state, indent=2) + "\n")

    host_lines = []
    config_lines = []
    for node in nodes:
        root = _mount_root(node)
        _write_identity(node, root, pubkey)
        host_key = (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
        host_lines.append(f"{node.mgmt_ip} {' '.join(host_key)}\n")
        config_lines.append(
            f"Host {node.name} {node.mgmt_ip}\n  HostName {node.mgmt_ip}\n  User {node.user}\n"
            f"  IdentityFile {key}\n  UserKnownHostsFile {known_hosts()}\n"
            "  StrictHostKeyChecking yes\n  IdentitiesOnly yes\n  BatchMode yes\n"
        )
    known_hosts().write_text("".join(host_lines))
    ssh_config().write_text("".join(config_lines))
    _make_networks(nodes)
    fresh_upstream()  # the hub's model (main on SIM_REVISION) and the build repository, as at first
    _start_hub()
    for node in nodes:
        _start_supervisor(node)
    for node in nodes:
        status = wait_running(node.name)
        _wait_ssh(node)
        log(f"{node.name}: {status}, ssh {node.user}@{node.mgmt_ip} (from netns {MGMT_NS})")
    log(f"{count} nodes up in {time.monotonic() - started:.1f}s")
    return state


def ensure(count: int = 2, shape: str = DEFAULT_SHAPE) -> bool:
    """The bed with ``count`` nodes of ``shape``: the running one, as it is, if it is that bed and
    every node runs; else a fresh one (``up``). True when this call brought it up (the caller
    takes it down after), False when it was already up (the caller leaves it up)."""
    nodes = read_state().get("nodes") or []
    if (len(nodes) == count and all(n.get("shape", DEFAULT_SHAPE) == shape for n in nodes)
            and all(container_pid(n["name"]) for n in nodes)):
        log(f"{count} nodes ({shape}) already up: used as they are")
        return False
    up(count, shape)
    return True


# Down
# ----


def _our_pids() -> list[int]:
    """Every process in the bed's cgroups (started by the bed, in this or a killed earlier run)."""
    pids: set[int] = set()
    for root in CGROUP_ROOTS:
        for dirpath, _, files in os.walk(root / PREFIX):  # cgroups come and go: errors ignored
            if "cgroup.procs" in files:
                try:
                    pids.update(int(p) for p in Path(dirpath, "cgroup.procs").read_text().split())
                except OSError:
                    pass
    return sorted(pids)


def _supervisor_pids() -> list[int]:
    pids = []
    if NODES_DIR.is_dir():
        for pidfile in NODES_DIR.glob("*/supervisor.pid"):
            try:
                pid = int(pidfile.read_text())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except (OSError, ValueError):
                continue
            if "sparkbed" in cmdline and "supervise" in cmdline:
                pids.append(pid)
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _stop_processes() -> None:
    """Supervisors power their containers off; whatever is left in the bed's cgroups is killed."""
    for pid in _supervisor_pids():
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(p) for p in _supervisor_pids()):
        time.sleep(0.2)
    for pid in _supervisor_pids() + _our_pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in _our_pids()):
        time.sleep(0.2)


def _bed_mounts() -> list[str]:
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if target.startswith(str(STATE) + "/") or target.startswith(f"/run/netns/{PREFIX}-"):
            mounts.append(target)
    return mounts


def clear_stale() -> None:
    """Remove everything a bed run (this one or a killed earlier one) left: processes, mounts, ..."""
    _stop_processes()
    for target in sorted(_bed_mounts(), key=len, reverse=True):
        run("umount", "-l", target, check=False, capture=True)
    listed = run("ip", "netns", "list", capture=True).stdout.split("\n")
    for line in listed:
        name = line.split(" ")[0]
        if name.startswith(f"{PREFIX}-"):
            run("ip", "netns", "delete", name, check=False, capture=True)
    for root in CGROUP_ROOTS:
        for dirpath, _, _ in sorted(os.walk(root / PREFIX), key=lambda w: len(w[0]), reverse=True):
            try:
                os.rmdir(dirpath)  # empty now: every process in it was stopped above
            except FileNotFoundError:
                pass
    for folder in (NODES_DIR, GIT_ROOT, LOCKS):  # the locks pin this bed's upstream
        if folder.exists():
            shutil.rmtree(folder)
    for path in (state_file(), STATE / "hub.pid"):
        path.unlink(missing_ok=True)


def down() -> None:
    """Stop every node by PID and remove namespaces, mounts, cgroups, node state, then the guard."""
    started = time.monotonic()
    clear_stale()
    remove_guard_routes()
    log(f"bed down in {time.monotonic() - started:.1f}s")
