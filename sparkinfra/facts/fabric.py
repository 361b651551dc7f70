"""
The fabric port, its network configuration backend, and the RoCE GID table of its RDMA device.
"""

from __future__ import annotations

import json
import re

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override


class FabricLink(FactBase):
    """
    Returns the live state of a network interface, or ``None`` when it does not exist.

    + interface: the interface name (``enp1s0f0np0`` on a Spark)

    .. code:: python

        {
            "mtu": 4200,
            "admin_up": True,     # ip link set up was done
            "carrier": True,      # the peer / switch port is there too
            "ipv4": ["192.168.192.1/24"],
            "mac": "4c:bb:47:00:00:01",
        }
    """

    @override
    def requires_command(self, *args, **kwargs) -> str:
        return "ip"

    @override
    def command(self, interface: str) -> StringCommand:
        return StringCommand(
            "ip", "-j", "addr", "show", "dev", QuoteString(interface), "2>/dev/null", "||", "true"
        )

    @override
    def process(self, output):
        return parse_ip_addr_json("\n".join(output))


def parse_ip_addr_json(text: str) -> dict | None:
    """Parse ``ip -j addr show dev X`` into ``FabricLink``'s shape (``None``: no such interface)."""
    entries = json.loads(text) if text.strip() else []
    if not entries:
        return None
    entry = entries[0]
    flags = entry.get("flags", [])
    return {
        "mtu": int(entry["mtu"]),
        "admin_up": "UP" in flags,
        "carrier": "LOWER_UP" in flags and "NO-CARRIER" not in flags,
        "ipv4": [
            f"{a['local']}/{a['prefixlen']}" for a in entry.get("addr_info", []) if a.get("family") == "inet"
        ],
        "mac": entry.get("address", ""),
    }


class NetworkConfigBackend(FactBase):
    """
    Returns how this host persists network config: ``netplan`` (DGX OS) when netplan is
    installed, else ``systemd`` (a unit of our own sets the port at boot).
    """

    @override
    def command(self) -> str:
        return "if command -v netplan >/dev/null 2>&1; then echo netplan; else echo systemd; fi"

    @override
    def process(self, output):
        return output[0].strip() if output and output[0].strip() else None


# RoCE GID table
# --------------

GID_ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


class RoceGidTable(FactBase):
    """
    Returns the populated rows of an RDMA port's GID table, from sysfs (``show_gids`` when the
    sysfs table is not there), or ``None`` when the device has neither.

    + device: the RDMA device (``rocep1s0f0``)
    + port: its port (1)

    .. code:: python

        [
            {"index": 0, "gid": "fe80:0000:...", "type": "IB/RoCE v1", "ndev": "enp1s0f0np0"},
            {"index": 3, "gid": "0000:...:ffff:c0a8:c001", "type": "RoCE v2", "ndev": "enp1s0f0np0"},
        ]
    """

    @override
    def command(self, device: str, port: int = 1) -> str:
        base = f"/sys/class/infiniband/{device}/ports/{int(port)}"
        # One "sysfs<TAB>index<TAB>gid<TAB>type<TAB>ndev" line per row (an unpopulated row's
        # type reads as an error: empty), read with the shell's builtins (no process per row);
        # else the show_gids table as it prints.
        return (
            f"if [ -d {base}/gids ]; then for g in {base}/gids/*; do i=${{g##*/}}; gid=; t=; n=; "
            f"read -r gid < $g; read -r t < {base}/gid_attrs/types/$i; read -r n < {base}/gid_attrs/ndevs/$i; "
            f"printf 'sysfs\\t%s\\t%s\\t%s\\t%s\\n' \"$i\" \"$gid\" \"$t\" \"$n\"; done 2>/dev/null; "
            f"elif command -v show_gids >/dev/null; then show_gids {device} {int(port)}; fi"
        )

    @override
    def process(self, output):
        return parse_gid_table(output)


def parse_gid_table(lines) -> list[dict] | None:
    """Parse the fact's sysfs dump or ``show_gids`` output into populated rows, by index."""
    rows = []
    seen_any = False
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        if fields[0] == "sysfs":
            seen_any = True
            _, index, gid, kind, ndev = (fields + [""] * 5)[:5]
            if gid.strip() and gid.strip() != GID_ZERO and kind.strip():
                rows.append({"index": int(index), "gid": gid.strip(), "type": kind.strip(), "ndev": ndev.strip()})
            continue
        # show_gids: DEV PORT INDEX GID IPv4 VER DEV (whitespace separated, IPv4 may be empty)
        words = line.split()
        if not words or words[0] in ("DEV", "---") or words[0].startswith("n_gids_found"):
            seen_any = seen_any or bool(words)
            continue
        if len(words) >= 6 and words[2].isdigit():
            seen_any = True
            version = words[-2]
            rows.append(
                {
                    "index": int(words[2]),
                    "gid": words[3],
                    "type": "RoCE v2" if version == "v2" else "IB/RoCE v1",
                    "ndev": words[-1],
                }
            )
    if not seen_any:
        return None
    return sorted(rows, key=lambda r: r["index"])


def gid_ipv4(gid: str) -> str | None:
    """The IPv4 address an IPv4-mapped GID (``::ffff:a.b.c.d``) carries, else ``None``."""
    from ipaddress import IPv6Address

    try:
        mapped = IPv6Address(gid).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped else None


def roce_v2_index(rows: list[dict], ipv4: str, netdev: str | None = None) -> int | None:
    """
    The GID index NCCL must use: the RoCE v2 row carrying the node's IPv4 (never the
    link-local rows 0/1, never a guess). ``None`` when there is no such row.
    """
    for row in rows:
        if row["type"] != "RoCE v2" or gid_ipv4(row["gid"]) != ipv4:
            continue
        if netdev and row["ndev"] and row["ndev"] != netdev:
            continue
        return row["index"]
    return None


def ipv4_v2_row(rows: list[dict], netdev: str | None = None) -> int | None:
    """
    The row NCCL picks by itself when ``NCCL_IB_GID_INDEX`` is unset (since 2.21: the first RoCE v2
    row of the address family ``NCCL_IB_ADDR_FAMILY`` names, IPv4 by default): the lowest RoCE v2 row
    holding an IPv4-mapped GID (of ``netdev`` when given). ``None``: no such row (NCCL would fall
    back to row 0, a link-local IPv6 GID no peer routes to).
    """
    for row in rows:
        if row["type"] == "RoCE v2" and gid_ipv4(row["gid"]) and (not netdev or not row["ndev"] or row["ndev"] == netdev):
            return row["index"]
    return None


# The port's RDMA devices and their netdevs (ibdev2netdev)
# --------------------------------------------------------


class RdmaNetdevs(FactBase):
    """
    Returns every RDMA device of the node with its netdev and its port's state, as
    ``ibdev2netdev`` prints them (read from sysfs: ``/sys/class/infiniband/DEV/device/net/``),
    sorted by device; ``[]`` when the node has none. A GB10 shows four, two per QSFP port:

    .. code:: python

        [
            {"device": "roceP2p1s0f0", "port": 1, "netdev": "enP2p1s0f0np0", "state": "ACTIVE"},
            {"device": "rocep1s0f0", "port": 1, "netdev": "enp1s0f0np0", "state": "ACTIVE"},
            ...
        ]
    """

    @override
    def command(self) -> str:
        # One "sysfs<TAB>dev<TAB>port<TAB>netdev<TAB>state" line per device port, with the shell's
        # builtins; else ibdev2netdev's own lines.
        return (
            "if [ -d /sys/class/infiniband ] && ls /sys/class/infiniband/*/device/net >/dev/null 2>&1; then "
            "for d in /sys/class/infiniband/*; do dev=${d##*/}; n=; "
            "for x in $d/device/net/*; do [ -e \"$x\" ] && n=${x##*/} && break; done; "
            "for p in $d/ports/*; do s=; read -r s < $p/state; "
            "printf 'sysfs\\t%s\\t%s\\t%s\\t%s\\n' \"$dev\" \"${p##*/}\" \"$n\" \"$s\"; done; done 2>/dev/null; "
            "elif command -v ibdev2netdev >/dev/null; then ibdev2netdev; fi"
        )

    @override
    def process(self, output):
        return parse_rdma_netdevs(output)


IBDEV2NETDEV = re.compile(r"^(\S+) port (\d+) ==> (\S+) \((\w+)\)")


def parse_rdma_netdevs(lines) -> list[dict]:
    """Parse ``RdmaNetdevs``' sysfs lines or ``ibdev2netdev``'s (``rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)``)."""
    found = []
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        if fields[0] == "sysfs" and len(fields) >= 5:
            _, device, port, netdev, state = fields[:5]
            state = state.split(":", 1)[-1].strip() if state else "missing"
            found.append({"device": device, "port": int(port), "netdev": netdev, "state": state})
            continue
        match = IBDEV2NETDEV.match(line.strip())
        if match:
            device, port, netdev, up = match.groups()
            found.append({"device": device, "port": int(port), "netdev": netdev,
                          "state": "ACTIVE" if up == "Up" else "DOWN"})
    return sorted(found, key=lambda d: (d["device"], d["port"]))


def _without_domain(name: str) -> str:
    """A predictable netdev name without its PCI domain: ``enP2p1s0f0np0`` -> ``enp1s0f0np0``."""
    return re.sub(r"^en(P\d+)?p", "enp", name)


def twin_of(interface: str, netdevs: list[str]) -> str | None:
    """
    The fabric port's twin among ``netdevs``: the one PCIe function of the same port in another PCI
    domain, named as ``interface`` but for its domain (``enp1s0f0np0`` <-> ``enP2p1s0f0np0``, a
    GB10's ConnectX-7). ``None`` when there is not exactly one.
    """
    twins = sorted({n for n in netdevs if n != interface and _without_domain(n) == _without_domain(interface)})
    return twins[0] if len(twins) == 1 else None


def port_devices(links: list[dict], netdevs: list[str], port: int) -> list[tuple[str, str]]:
    """(RDMA device, netdev) of each of ``netdevs`` in that order (their ``port``): the HCAs NCCL uses."""
    found = []
    for netdev in netdevs:
        found += [(d["device"], netdev) for d in links if d["netdev"] == netdev and d["port"] == port]
    return found
