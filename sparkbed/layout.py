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


@dataclass(frozen=True)
class NodeShape:
    """
    What differs between sites' Sparks, as the bed builds them: the fabric port's name, its RDMA
    devices (a uverbs device and a GID table each), the login users (``{i}``: the node's number).
    A cluster's settings name the same (``fabric_interface``, ``rdma_devices``): nothing in the
    tool may assume the seeds' names.
    """

    fabric: str
    rdma: tuple[str, ...]
    head_user: str
    worker_user: str


SHAPES = {
    "spark": NodeShape("enp1s0f0np0", ("rocep1s0f0", "roceP2p1s0f0"), "nvidia", "spark{i}"),  # the seeds' Sparks
    "site2": NodeShape("enP2p1s0f1np1", ("mlx5_0", "mlx5_1"), "ubuntu", "dgx{i}"),  # another site's naming
}


@dataclass(frozen=True)
class SimNode:
    """One simulated node: what an inventory needs to reach it."""

    name: str
    index: int  # 1-based
    user: str
    mgmt_ip: str
    fabric_ip: str
    shape: str = "spark"  # a key of SHAPES

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


def sim_nodes(count: int = 2, shape: str = "spark") -> list[SimNode]:
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


def compile_nccl_standin(version: str, out: Path) -> Path:
    """Build ``standins/nccl_standin.c`` as a ``libnccl.so.2`` whose ``ncclGetVersion`` reports ``version``."""
    major, minor, patch = (int(x) for x in version.split("."))
    out.parent.mkdir(parents=True, exist_ok=True)
    run("cc", "-shared", "-fPIC", "-O2", f"-DSTANDIN_NCCL_VERSION_CODE={major * 10000 + minor * 100 + patch}",
        "-Wl,-soname,libnccl.so.2", "-o", str(out), str(STANDINS / "nccl_standin.c"))
    return out


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
