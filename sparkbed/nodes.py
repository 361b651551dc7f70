"""
The nodes: each one's identity and stand-ins in its overlay root, its systemd-nspawn container,
the supervisor that restarts it when it reboots (resetting the fabric port), and what the rest of
the bed does with a running node (``container_pid``, ``node_exec``, ``wait_running``, ``reboot``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .cache import BASE, IMAGE_ROOTFS, IMAGE_ROOTFS_IN_NODE, VLLM_TREE_IN_NODE, vllm_tree
from .controller import ssh_config
from .layout import (CMA_KIB, KERNEL_RELEASE, MGMT_NS, SHAPES, STANDINS, SimNode, _enter_own_cgroup, log, node_dir,
                     read_state, run)
from .network import in_netns, power_on_network


# Each node's root: the shared base, its own upper layer, its identity
# --------------------------------------------------------------------


def _write_identity(node: SimNode, root: Path, pubkey: str) -> None:
    """Per-node identity in the node's upper layer: hostname, machine-id, host keys, user, stand-ins."""
    (root / "etc/hostname").write_text(f"{node.name}\n")
    (root / "etc/hosts").write_text(
        f"127.0.0.1 localhost\n127.0.1.1 {node.name}\n::1 localhost ip6-localhost\n"
    )
    (root / "etc/machine-id").write_text(os.urandom(16).hex() + "\n")
    run(
        "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{node.name}",
        "-f", str(root / "etc/ssh/ssh_host_ed25519_key"),
    )
    run("chroot", str(root), "useradd", "--create-home", "--shell", "/bin/bash", node.user)
    (root / f"etc/sudoers.d/{node.user}").write_text(f"{node.user} ALL=(ALL) NOPASSWD:ALL\n")
    os.chmod(root / f"etc/sudoers.d/{node.user}", 0o440)
    home = root / "home" / node.user
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(pubkey)
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    uid_gid = run("chroot", str(root), "id", "-u", node.user, capture=True).stdout.strip()
    gid = run("chroot", str(root), "id", "-g", node.user, capture=True).stdout.strip()
    for path in (home, ssh_dir, ssh_dir / "authorized_keys"):
        os.chown(path, int(uid_gid), int(gid))
    # Stand-ins for the GPU/RDMA tools, and the unit that keeps the fake RDMA sysfs live.
    for tool in ("show_gids", "ibv_devinfo", "ibdev2netdev", "ib_write_bw", "nvidia-smi", "uname"):
        dest = root / "usr/local/bin" / tool
        shutil.copy(STANDINS / tool, dest)
        dest.chmod(0o755)
    lib = root / "usr/local/lib/sparkbed"
    lib.mkdir(parents=True, exist_ok=True)
    shutil.copy(STANDINS / "rdma_standin.py", lib / "rdma_standin.py")
    shutil.copy(STANDINS / "sparkbed-rdma.service", root / "etc/systemd/system/sparkbed-rdma.service")
    # The kernel a node shows (uname -r, /proc/meminfo's CMA area): files a fault can change.
    shutil.copy(STANDINS / "kernel_standin.py", lib / "kernel_standin.py")
    shutil.copy(STANDINS / "sparkbed-kernel.service", root / "etc/systemd/system/sparkbed-kernel.service")
    facts = root / "etc/sparkbed"
    facts.mkdir(parents=True, exist_ok=True)
    (facts / "kernel-release").write_text(KERNEL_RELEASE + "\n")
    (facts / "cma-kib").write_text(f"{CMA_KIB}\n")
    form = SHAPES[node.shape]  # the stand-in's RDMA devices, each with its own netdev: this node's shape
    dropin = root / "etc/systemd/system/sparkbed-rdma.service.d"
    dropin.mkdir(parents=True, exist_ok=True)
    pairs = " ".join(f"{dev}={netdev}" for netdev, dev in form.pairs)
    (dropin / "shape.conf").write_text(f"[Service]\nEnvironment=\"SPARKBED_RDMA_PAIRS={pairs}\"\n")
    shutil.copy(STANDINS / "sparkbed-cgroups.service", root / "etc/systemd/system/sparkbed-cgroups.service")
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for unit in ("sparkbed-rdma.service", "sparkbed-cgroups.service", "sparkbed-kernel.service"):
        link = wants / unit
        if not link.exists():
            link.symlink_to(f"/etc/systemd/system/{unit}")
    # The drop_caches stand-in: a plain file bound over /proc/sys/vm/drop_caches (one kernel).
    (lib / "drop_caches").write_text("")


def _mount_root(node: SimNode) -> Path:
    d = node_dir(node.name)
    for sub in ("upper", "work", "root", "docker"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    root = d / "root"
    if not os.path.ismount(root):
        run(
            "mount", "-t", "overlay", "overlay",
            "-o", f"lowerdir={BASE},upperdir={d / 'upper'},workdir={d / 'work'}",
            str(root),
        )
    return root


# Supervisor: one per node, restarts the container on reboot
# ----------------------------------------------------------


def nspawn_command(node: SimNode) -> list[str]:
    root = node_dir(node.name) / "root"
    return [
        "systemd-nspawn",
        "--boot",
        "--quiet",
        f"--directory={root}",
        f"--machine={node.name}",
        "--register=no",
        "--keep-unit",
        "--private-network",
        f"--network-namespace-path=/run/netns/{node.netns}",
        "--system-call-filter=@keyring",
        "--capability=all",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        "--console=read-only",
        f"--bind={node_dir(node.name) / 'docker'}:/var/lib/docker",
        f"--bind-ro={IMAGE_ROOTFS}:{IMAGE_ROOTFS_IN_NODE}",
        *([f"--bind-ro={tree}:{VLLM_TREE_IN_NODE}"] if (tree := vllm_tree()) else []),
        "--bind=/usr/local/lib/sparkbed/drop_caches:/proc/sys/vm/drop_caches",
    ]


def supervise(name: str) -> int:
    """Run one node: start its container, restart it after a reboot (exit 133), stop on SIGTERM."""
    node = _node_by_name(name)
    _enter_own_cgroup(node.name)
    child: subprocess.Popen | None = None
    stopping = False

    def _stop(signum, frame):
        nonlocal stopping
        stopping = True
        if child and child.poll() is None:
            child.send_signal(signal.SIGTERM)  # nspawn powers the container off cleanly

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log_path = node_dir(node.name) / "console.log"
    boots = 0
    while not stopping:
        if boots:
            power_on_network(node)
        boots += 1
        with open(log_path, "a") as console:
            console.write(f"--- boot {boots} at {time.strftime('%H:%M:%S')}\n")
            console.flush()
            child = subprocess.Popen(
                nspawn_command(node), stdin=subprocess.DEVNULL, stdout=console, stderr=console
            )
        (node_dir(node.name) / "nspawn.pid").write_text(f"{child.pid}\n")
        code = child.wait()
        if code != 133:  # 133: the container asked for a reboot
            break
    return 0


def _node_by_name(name: str) -> SimNode:
    state = read_state()
    for entry in state.get("nodes", []):
        if entry["name"] == name:
            return SimNode(**entry)
    raise SystemExit(f"no such bed node: {name}")


def container_pid(name: str) -> int | None:
    """PID (in the root namespace) of the node's PID 1 (systemd), if it runs."""
    try:
        nspawn = int((node_dir(name) / "nspawn.pid").read_text())
        children = Path(f"/proc/{nspawn}/task/{nspawn}/children").read_text().split()
    except (OSError, ValueError):
        return None
    return int(children[0]) if children else None


def node_exec(name: str, *args: str, check: bool = True, capture: bool = True,
              input: str | None = None) -> subprocess.CompletedProcess:
    """Run a command inside a node (all its namespaces), as root; ``input``: its stdin."""
    pid = container_pid(name)
    if pid is None:
        raise RuntimeError(f"{name} is not running")
    return run("nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "--", *args, check=check, capture=capture,
               input=input)


def wait_running(name: str, timeout: float = 90.0) -> str:
    """Wait until systemd in the node reports running (or degraded), and sshd listens."""
    deadline = time.monotonic() + timeout
    status = "no container"
    while time.monotonic() < deadline:
        if container_pid(name) is not None:
            result = node_exec(name, "systemctl", "is-system-running", check=False)
            status = result.stdout.strip() or result.stderr.strip()
            if status in ("running", "degraded"):
                return status
        time.sleep(0.3)
    raise RuntimeError(f"{name} did not boot within {timeout:.0f}s (systemd says {status!r})")


def _start_supervisor(node: SimNode) -> int:
    log_file = open(node_dir(node.name) / "supervisor.log", "a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkbed", "supervise", node.name],
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=log_file,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    (node_dir(node.name) / "supervisor.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def _wait_ssh(node: SimNode, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = in_netns(
            MGMT_NS, "ssh", "-F", str(ssh_config()), "-o", "ConnectTimeout=2", node.name, "true",
            check=False, capture=True,
        )
        if result.returncode == 0:
            return
        time.sleep(0.3)
    raise RuntimeError(f"{node.name}: ssh did not answer within {timeout:.0f}s: {result.stderr.strip()}")


def reboot(name: str, timeout: float = 90.0) -> None:
    """Reboot a node from inside (``systemctl reboot``) and wait until it is back."""
    node = _node_by_name(name)
    old = container_pid(name)
    node_exec(name, "systemctl", "reboot", check=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = container_pid(name)
        if pid is not None and pid != old:
            break
        time.sleep(0.2)
    wait_running(name, timeout)
    _wait_ssh(node)
    log(f"{name} rebooted")
