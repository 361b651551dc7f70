"""
Where the bed is: its subnets and namespaces, its folders (``CACHE``, what is built once;
``STATE``, what goes with ``down``), its nodes as data (``SimNode``, ``sim_nodes``), the state file
that names the running ones, the cgroups its processes run in, and the two helpers every part
uses (``log``, ``run``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path

PREFIX = "sparkbed"
SUBNET = IPv4Network("10.213.0.0/16")  # every address the bed uses; guarded in the root namespace
MGMT_NET = IPv4Network("10.213.0.0/24")
MGMT_GATEWAY = "10.213.0.1"
FABRIC_NET = IPv4Network("10.213.1.0/24")
MGMT_NS = f"{PREFIX}-mgmt"
SWITCH_NS = f"{PREFIX}-switch"

CACHE = Path("/var/cache/sparkinfra-bed")
STATE = Path("/var/lib/sparkinfra-bed")
NODES_DIR = STATE / "nodes"
CONTROLLER_DIR = STATE / "controller"
CGROUP_ROOTS = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"))
STANDINS = Path(__file__).parent / "standins"
# The DGX OS kernel a node shows (the uname and meminfo stand-ins): a release the field runs
# ConnectX-7 RDMA on, with a CMA area (its size is the bed's, not a measured GB10's). A fault writes
# the node's /etc/sparkbed/kernel-release or cma-kib.
KERNEL_RELEASE = "6.17.0-1031-nvidia"
CMA_KIB = 65536


@dataclass(frozen=True)
class NodeShape:
    """
    What differs between sites' Sparks, as the bed builds them: the ConnectX-7's netdevs, each with
    its own RDMA device (``pairs``: ``(netdev, RDMA device)``; a GB10 shows each of its two QSFP
    ports as two PCIe functions, "twins", so four pairs), which port's twins the cable is on
    (``cabled``: ``(fabric netdev, twin netdev)``), and the login users (``{i}``: the node's
    number). A cluster's settings name the same (``fabric_interface``, ``rdma_devices``): nothing
    in the tool may assume the seeds' names.
    """

    pairs: tuple[tuple[str, str], ...]
    cabled: tuple[str, str]
    head_user: str
    worker_user: str

    def __post_init__(self) -> None:
        netdevs = [netdev for netdev, _ in self.pairs]
        if len(set(netdevs)) != len(netdevs) or len({dev for _, dev in self.pairs}) != len(self.pairs):
            raise ValueError("every netdev and every RDMA device appears once")
        if len(self.cabled) != 2 or not set(self.cabled) <= set(netdevs) or self.cabled[0] == self.cabled[1]:
            raise ValueError(f"cabled {self.cabled} must name two of the shape's netdevs")

    @property
    def fabric(self) -> str:
        """The cabled port's first twin: the fabric interface (the fabric IP goes here)."""
        return self.cabled[0]

    @property
    def twin(self) -> str:
        """The cabled port's other twin (link-local IPv4, same MTU)."""
        return self.cabled[1]

    @property
    def netdevs(self) -> tuple[str, ...]:
        return tuple(netdev for netdev, _ in self.pairs)

    @property
    def uncabled(self) -> tuple[str, ...]:
        """The other port's twins: present, never a carrier."""
        return tuple(netdev for netdev in self.netdevs if netdev not in self.cabled)

    def rdma_of(self, netdev: str) -> str:
        return dict(self.pairs)[netdev]

    @property
    def rdma(self) -> tuple[str, ...]:
        """The cabled port's RDMA devices: the fabric interface's, then its twin's."""
        return (self.rdma_of(self.fabric), self.rdma_of(self.twin))


SHAPES = {
    # A GB10 as it is (the seeds' names): ``ibdev2netdev`` prints these four pairs; the cable on f0.
    "gb10": NodeShape(
        (("enp1s0f0np0", "rocep1s0f0"), ("enp1s0f1np1", "rocep1s0f1"),
         ("enP2p1s0f0np0", "roceP2p1s0f0"), ("enP2p1s0f1np1", "roceP2p1s0f1")),
        ("enp1s0f0np0", "enP2p1s0f0np0"), "nvidia", "spark{i}",
    ),
    # Another site's naming: mlx5_N devices, the cable on f1, the P2 twin carrying the fabric address.
    "site2": NodeShape(
        (("enp1s0f0np0", "mlx5_0"), ("enp1s0f1np1", "mlx5_1"),
         ("enP2p1s0f0np0", "mlx5_2"), ("enP2p1s0f1np1", "mlx5_3")),
        ("enP2p1s0f1np1", "enp1s0f1np1"), "ubuntu", "dgx{i}",
    ),
}
DEFAULT_SHAPE = "gb10"


@dataclass(frozen=True)
class SimNode:
    """One simulated node: what an inventory needs to reach it."""

    name: str
    index: int  # 1-based
    user: str
    mgmt_ip: str
    fabric_ip: str
    shape: str = DEFAULT_SHAPE  # a key of SHAPES

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.name}"

    @property
    def rank(self) -> int:
        return self.index - 1

    @property
    def fabric(self) -> str:
        """The fabric port's name."""
        return SHAPES[self.shape].fabric

    @property
    def twin(self) -> str:
        """The fabric port's twin netdev."""
        return SHAPES[self.shape].twin


def sim_nodes(count: int = 2, shape: str = DEFAULT_SHAPE) -> list[SimNode]:
    """The bed's nodes: ``spark-1`` .. ``spark-N`` of ``shape``; users differ per node, as in the field."""
    form = SHAPES[shape]
    return [
        SimNode(
            name=f"spark-{i}",
            index=i,
            user=form.head_user if i == 1 else form.worker_user.format(i=i),
            mgmt_ip=str(MGMT_NET.network_address + 10 + i),
            fabric_ip=str(FABRIC_NET.network_address + i),
            shape=shape,
        )
        for i in range(1, count + 1)
    ]


# Small helpers, and the state file
# ----------------------------------


def log(message: str) -> None:
    print(f"[bed] {message}", file=sys.stderr, flush=True)


def run(*args: str, check: bool = True, capture: bool = False, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(args), check=check, text=True, capture_output=capture, **kwargs
    )


def compile_nccl_standin(version: str, out: Path, build_tag: str = "") -> Path:
    """
    Build ``standins/nccl_standin.c`` as a ``libnccl.so.2`` whose ``ncclGetVersion`` reports
    ``version``. ``build_tag`` makes another build of the same version: other bytes, another ELF
    build-id (the linker always emits one, ``--build-id=sha1``, as NVIDIA's builds carry one).
    The same version and tag give the same bytes.
    """
    major, minor, patch = (int(x) for x in version.split("."))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    run("cc", "-shared", "-fPIC", "-O2", f"-DSTANDIN_NCCL_VERSION_CODE={major * 10000 + minor * 100 + patch}",
        f'-DSTANDIN_NCCL_VERSION="{version}"', f'-DSTANDIN_BUILD_TAG="{build_tag}"',
        "-Wl,-soname,libnccl.so.2", "-Wl,--build-id=sha1", "-o", str(tmp), str(STANDINS / "nccl_standin.c"))
    tmp.replace(out)
    return out


def elf_build_id(path: Path) -> str | None:
    """The hex NT_GNU_BUILD_ID of an ELF file (what ``readelf -n`` shows), or None."""
    import struct

    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:  # 64-bit little-endian only (the bed's)
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    for i in range(shnum):
        sh_type, = struct.unpack_from("<I", data, shoff + i * shentsize + 4)
        if sh_type != 7:  # SHT_NOTE
            continue
        offset, size = struct.unpack_from("<QQ", data, shoff + i * shentsize + 0x18)
        at = offset
        while at + 12 <= offset + size:
            namesz, descsz, kind = struct.unpack_from("<III", data, at)
            name = data[at + 12:at + 12 + namesz]
            desc_at = at + 12 + ((namesz + 3) & ~3)
            if kind == 3 and name.rstrip(b"\0") == b"GNU":  # NT_GNU_BUILD_ID
                return data[desc_at:desc_at + descsz].hex()
            at = desc_at + ((descsz + 3) & ~3)
    return None


def node_dir(name: str) -> Path:
    return NODES_DIR / name


def state_file() -> Path:
    return STATE / "bed.json"


def read_state() -> dict:
    try:
        return json.loads(state_file().read_text())
    except (OSError, ValueError):
        return {}


# The bed's cgroups (every process it starts runs in one, so ``down`` finds them all)
# ------------------------------------------------------------------------------------


def _cgroup_dirs(name: str) -> list[Path]:
    return [root / PREFIX / name for root in CGROUP_ROOTS if root.is_dir()]


def _enter_own_cgroup(name: str) -> None:
    for d in _cgroup_dirs(name):
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").write_text(f"{os.getpid()}\n")
