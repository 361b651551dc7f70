"""
The fabric port as RoCE sees it: its twins (a GB10's ConnectX-7 shows each QSFP port as two PCIe
functions, each with its own netdev, RDMA device and GID table) and the GID row NCCL uses on each.

One rule, read by prepare (``nccl_environment``), the verify suite and ``status``; the container
check applies the same rule inside a rank's container (``node/container_check.py``):

- the HCAs are the RDMA devices of the fabric interface and of its twin, the fabric's first;
- each HCA's row is an IPv4 RoCE v2 row of **its own** netdev: the fabric IP's on the fabric
  interface's HCA, the twin's own IPv4 on the twin's (a twin's table never holds the fabric IP);
- NCCL takes one ``NCCL_IB_GID_INDEX`` for every HCA: where the rows agree it is set to that row
  (the seeds' way, any NCCL); where they differ it is left unset and NCCL (2.21 and later) takes
  each HCA's first IPv4 RoCE v2 row itself, which this module computes the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from .facts.fabric import gid_ipv4, ipv4_v2_row, port_devices, roce_v2_index, twin_of
from .settings import Fabric

AUTO_GID_SINCE = (2, 21, 0)  # NCCL_IB_GID_INDEX defaults to -1 (NCCL picks per HCA) since 2.21


@dataclass(frozen=True)
class Port:
    """The fabric port on one node: its interface, its twin (None: none), the HCAs NCCL uses as
    (device, netdev), and what keeps it from being used (empty: nothing)."""

    interface: str
    twin: str | None
    hcas: tuple[tuple[str, str], ...]
    problems: tuple[str, ...] = ()

    @property
    def devices(self) -> list[str]:
        return [device for device, _ in self.hcas]

    @property
    def netdevs(self) -> list[str]:
        """The port's netdevs: the fabric interface, then its twin."""
        return [self.interface, *([self.twin] if self.twin else [])]


def port_of(fabric: Fabric, links: list[dict] | None) -> Port:
    """The fabric port of a node whose ``RdmaNetdevs`` fact is ``links``."""
    links = links or []
    names = sorted({link["netdev"] for link in links if link["netdev"]})
    problems = []
    if fabric.twin == "none":
        twin = None
    elif fabric.twin:
        twin = fabric.twin
        if links and twin not in names:
            problems.append(f"fabric_twin_interface {twin} has no RDMA device (ibdev2netdev: {_listed(links)})")
    else:
        twin = twin_of(fabric.interface, names)
    if fabric.rdma_devices:
        netdev = {link["device"]: link["netdev"] for link in links}
        hcas = tuple((device, netdev.get(device, "")) for device in fabric.rdma_devices)
        missing = [device for device in fabric.rdma_devices if links and device not in netdev]
        if missing:
            problems.append(f"rdma_devices {', '.join(missing)} not on this node (ibdev2netdev: {_listed(links)})")
    else:
        hcas = tuple(port_devices(links, [fabric.interface, *([twin] if twin else [])], fabric.rdma_port))
        if not any(netdev == fabric.interface for _, netdev in hcas):
            problems.append(f"no RDMA device on {fabric.interface} port {fabric.rdma_port} "
                            f"(ibdev2netdev: {_listed(links) or 'no RDMA devices'})")
    return Port(fabric.interface, twin, hcas, tuple(problems))


def _listed(links: list[dict]) -> str:
    return ", ".join(f"{link['device']} port {link['port']} ==> {link['netdev'] or '?'}" for link in links)


def table_text(rows: list[dict] | None) -> str:
    """A GID table in one line, for a message."""
    if rows is None:
        return "no table"
    return "; ".join(f"{r['index']}: {r['gid']} {r['type']} {r['ndev']}" for r in rows) or "no populated rows"


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split("."))
    except ValueError:
        return (0,)


@dataclass(frozen=True)
class GidChoice:
    """What a node's NCCL env says of GID rows: ``index`` (``NCCL_IB_GID_INDEX``; "": NCCL picks per
    HCA), the row NCCL then uses on each HCA, what is wrong (refused), and what to know (said)."""

    index: str
    rows: dict[str, int | None]
    problems: tuple[str, ...] = ()
    note: str = ""


def wanted_row(rows: list[dict], netdev: str, fabric: bool, fabric_ip: str) -> int | None:
    """The row an HCA must use: the fabric IP's RoCE v2 row on the fabric interface's HCA, the
    first IPv4 RoCE v2 row of its own netdev on the twin's."""
    return roce_v2_index(rows, fabric_ip, netdev) if fabric else ipv4_v2_row(rows, netdev)


def used_row(rows: list[dict], netdev: str, index: str) -> int | None:
    """The row NCCL uses on an HCA whose table is ``rows``: ``index`` (``NCCL_IB_GID_INDEX``), or
    where it is unset NCCL's own choice (the first IPv4 RoCE v2 row of its netdev); ``None``: none."""
    if not index:
        return ipv4_v2_row(rows, netdev)
    return int(index) if index.lstrip("-").isdigit() else None


def gid_choice(port: Port, tables: dict[str, list[dict] | None], fabric_ip: str, nccl_version: str) -> GidChoice:
    """
    The GID index a node's NCCL env gets, from each HCA's table read now (``RoceGidTable``).

    + port: the node's fabric port (``port_of``)
    + tables: each HCA's GID table
    + fabric_ip: the node's fabric address
    + nccl_version: the pin's; a per-HCA choice needs 2.21 or later
    """
    rows: dict[str, int | None] = {}
    problems = []
    for device, netdev in port.hcas:
        row = wanted_row(tables.get(device) or [], netdev, netdev == port.interface, fabric_ip)
        rows[device] = row
        if row is None:
            has = f"RoCE v2 GID row for {fabric_ip}" if netdev == port.interface else "IPv4 RoCE v2 GID row"
            problems.append(f"{device} ({netdev or '?'}) has no {has}: {table_text(tables.get(device))}")
    if problems:
        return GidChoice("", rows, tuple(problems))
    found = sorted(set(rows.values()))
    if len(found) == 1:
        return GidChoice(str(found[0]), rows)
    said = ", ".join(f"{device} ({netdev}) row {rows[device]}" for device, netdev in port.hcas)
    remedy = _remedy(port, tables, rows)
    if _version(nccl_version) < AUTO_GID_SINCE:
        return GidChoice("", rows, (f"the IPv4 RoCE v2 rows differ ({said}) and NCCL {nccl_version} takes one "
                                    f"NCCL_IB_GID_INDEX for all: {remedy}",))
    # NCCL's own choice must then be the wanted row on every HCA (the first IPv4 row of each).
    own = {device: ipv4_v2_row(tables.get(device) or [], netdev) for device, netdev in port.hcas}
    wrong = [f"{device} would use row {own[device]}, not {rows[device]}" for device in rows if own[device] != rows[device]]
    if wrong:
        return GidChoice("", rows, (f"the IPv4 RoCE v2 rows differ ({said}) and NCCL's own choice is wrong "
                                    f"({'; '.join(wrong)}): {remedy}",))
    return GidChoice("", rows, note=f"the IPv4 RoCE v2 rows differ ({said}): NCCL_IB_GID_INDEX is left to NCCL, "
                                    f"which takes each HCA's own row; one index for both again: {remedy}")


def _remedy(port: Port, tables: dict[str, list[dict] | None], rows: dict[str, int | None]) -> str:
    """What moved an HCA's IPv4 row past the other's: the other addresses its netdev holds before it."""
    low = min(r for r in rows.values() if r is not None)
    said = []
    for device, netdev in port.hcas:
        if rows[device] == low:
            continue
        before = sorted({r["gid"] for r in tables.get(device) or []
                         if 1 < r["index"] < (rows[device] or 0) and not gid_ipv4(r["gid"])})
        if before:
            said.append(f"remove {', '.join(before)} from {netdev} or add it to the other twin, then converge")
    return "; ".join(said) or "give both twins the same IPv6 addresses (ipv6.addr-gen-mode eui64 on both), then converge"


def index_problems(port: Port, tables: dict[str, list[dict] | None], fabric_ip: str, index: str) -> list[str]:
    """
    What is wrong with the rows NCCL will use under ``index`` (``NCCL_IB_GID_INDEX``; "": its own
    choice per HCA), HCA by HCA: each must be an IPv4 RoCE v2 row of the HCA's own netdev, the
    fabric interface's the fabric IP's. Read by the verify suite and ``status``.
    """
    problems = []
    for device, netdev in port.hcas:
        rows = tables.get(device) or []
        at = used_row(rows, netdev, index)
        row = next((r for r in rows if r["index"] == at), None)
        used = f"row {index}" if index else f"NCCL's own row ({at if at is not None else 'none: no IPv4 RoCE v2 row'})"
        where = f"{device} ({netdev or '?'})"
        if row is None:
            problems.append(f"{where}: {used} is empty; table: {table_text(tables.get(device))}")
            continue
        ipv4 = gid_ipv4(row["gid"])
        if row["type"] != "RoCE v2" or not ipv4:
            problems.append(f"{where}: {used} is {row['gid']} ({row['type']}), not an IPv4 RoCE v2 GID")
        elif netdev and row["ndev"] and row["ndev"] != netdev:
            problems.append(f"{where}: {used} belongs to {row['ndev']}, not {netdev}")
        elif netdev == port.interface and ipv4 != fabric_ip:
            problems.append(f"{where}: {used} carries {ipv4}, not the fabric address {fabric_ip}")
    return problems
