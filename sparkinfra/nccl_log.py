"""
NCCL's own start-up lines in a rank's log, as ``NCCL_DEBUG=INFO`` with ``NCCL_DEBUG_SUBSYS=INIT,NET``
(the cluster's default ``nccl_env``) prints them: the version, the network NCCL chose, the HCAs its
NET/IB transport opened and the GID index it took. The verify suite reads every rank's log with them.

Formats (NCCL's ``init.cc``, ``transport/net_ib.cc``, ``param.cc``; the same from 2.4 to 2.30):

- ``NCCL version 2.30.7+cuda13.0``, or ``... NCCL INFO NCCL version ...``: printed by a
  communicator's rank 0 only
- ``... NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [1]roceP2p1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:10.0.0.1<0>``
- ``... NCCL INFO NET/Socket : Using [0]enp1s0f0np0:10.0.0.1<0>`` (no HCA NCCL could open: TCP)
- ``... NCCL INFO Using network IB`` (or ``Socket``): the transport of the communicator
- ``... NCCL INFO NCCL_IB_GID_INDEX set by environment to 3.``
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

_VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+)")
_IB_DEVICES = re.compile(r"NET/IB : Using (?P<devices>(?:\[\d+\]\S+ ?)+)")
_IB_DEVICE = re.compile(r"\[\d+\](?P<hca>[^:\s]+):(?P<port>\d+)/")
_NETWORK = re.compile(r"NCCL INFO Using network (?P<net>\S+)")
_GID = re.compile(r"NCCL_IB_GID_INDEX set by environment to (?P<i>-?\d+)")


@dataclass
class NcclStart:
    """What a rank's log says of NCCL's start (``None``/empty: not said)."""

    version: str | None = None
    networks: list[str] = field(default_factory=list)  # one per communicator: "IB", "Socket"
    hcas: list[str] = field(default_factory=list)  # NET/IB's devices, ``rocep1s0f0:1``
    gid_index: str | None = None

    @property
    def said_anything(self) -> bool:
        return bool(self.version or self.networks or self.hcas or self.gid_index)


def parse(log: str) -> NcclStart:
    """The NCCL start-up facts of ``log`` (the last of each, as a restart prints them again)."""
    start = NcclStart()
    for line in log.splitlines():
        if m := _VERSION.search(line):
            start.version = m["v"]
        if m := _IB_DEVICES.search(line):
            start.hcas = [f"{d['hca']}:{d['port']}" for d in _IB_DEVICE.finditer(m["devices"])]
        if m := _NETWORK.search(line):
            start.networks.append(m["net"])
        if m := _GID.search(line):
            start.gid_index = m["i"]
    return start


def problems(start: NcclStart, *, pin: str | None, rdma: bool, hcas: list[str], port: int,
             gid_index: str) -> list[str]:
    """
    What ``start`` (one rank's) says against the plan: where the rank prints it (``pin`` given: rank
    0), the pinned version; with ``rdma``, NCCL on IB over exactly the cluster's HCAs at this node's
    GID index.
    """
    if not start.said_anything:
        return ["no NCCL start-up lines (NCCL_DEBUG is not INFO, or NCCL never started)"]
    found = []
    if pin and start.version != pin:
        found.append(f"NCCL {start.version or '(no version line)'} started, the pin is {pin}")
    if not rdma:
        return found
    wrong = sorted(set(start.networks) - {"IB"})
    if wrong or not start.networks:
        found.append(f"NCCL's network is {', '.join(wrong) or 'not said'}, not IB (RDMA)")
    wanted = [f"{hca}:{port}" for hca in hcas]
    if start.hcas != wanted:
        found.append(f"NET/IB uses {' '.join(start.hcas) or 'no HCA'}, the cluster's are {' '.join(wanted)}")
    if start.gid_index != gid_index:
        found.append(f"NCCL took GID index {start.gid_index or '(not said)'}, this node's is {gid_index}")
    return found


# What a rank's live processes mapped (``node/nccl_identity.py --live``, run in its container)
# ------------------------------------------------------------------------------------------------


def live_command(container: str, script: str) -> str:
    """The shell command, run as root on a node, that reads which ``libnccl`` each vLLM process of
    ``container`` mapped (its ``/proc/PID/maps``, in the container's PID namespace), with the identity
    of the file each mapped (``script``: ``nccl_identity.py`` on the node, fed on stdin)."""
    return f"docker exec -i {shlex.quote(container)} python3 - --live --match vllm < {shlex.quote(script)}"


def live_problems(report: dict, pin: dict) -> list[str]:
    """
    What is wrong in ``nccl_identity.py --live``'s ``report`` against the node's ``pin`` (its path,
    sha256 and build-id, read on the node: a rank started without the pin's mount has none of its
    own): a vLLM process that mapped a libnccl that is not the pin's bytes (the same version of
    another build is named as such by its build-id), or no vLLM process that mapped one at all (a
    wrapper shell maps none, and is no problem by itself).
    """
    if not pin.get("sha256"):
        return [f"the node has no pin at {pin.get('path', '?')} to compare with"]
    processes = report.get("processes") or []
    mapped = [p for p in processes if p.get("path")]
    found = []
    for process in mapped:
        if process.get("sha256") != pin["sha256"]:
            found.append(f"pid {process.get('pid')} ({process.get('cmd', '')[:60]}) mapped {process['path']}, "
                         f"build-id {str(process.get('build_id'))[:12]} sha256 {str(process.get('sha256'))[:12]}, "
                         f"not the pin {pin.get('path', '')} (build-id {str(pin.get('build_id'))[:12]} "
                         f"sha256 {pin['sha256'][:12]})")
    if not mapped:
        found.append(f"no vLLM process has mapped a libnccl ({len(processes)} vLLM processes)")
    return found
