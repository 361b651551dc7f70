"""
Helper for unit tests: a GB10's fabric as data. Its four RDMA devices as ``ibdev2netdev`` lists them
(both QSFP ports, the cable on f0), and GID tables as mlx5 fills them from one netdev: rows 0/1 its
link-local IPv6, then each other address a pair of rows (RoCE v1, then v2).
"""

from __future__ import annotations

LINKS = [
    {"device": "roceP2p1s0f0", "port": 1, "netdev": "enP2p1s0f0np0", "state": "ACTIVE"},
    {"device": "roceP2p1s0f1", "port": 1, "netdev": "enP2p1s0f1np1", "state": "DOWN"},
    {"device": "rocep1s0f0", "port": 1, "netdev": "enp1s0f0np0", "state": "ACTIVE"},
    {"device": "rocep1s0f1", "port": 1, "netdev": "enp1s0f1np1", "state": "DOWN"},
]
LL = "fe80:0000:0000:0000:4ebb:47ff:fe00:0001"  # a netdev's link-local IPv6 GID
RA = "fd00:0213:0001:0000:0000:0000:0000:0002"  # a router-advertised IPv6 GID


def v4(ip: str) -> str:
    """The IPv4-mapped GID of ``ip`` as sysfs prints it."""
    return "0000:0000:0000:0000:0000:ffff:" + "{:02x}{:02x}:{:02x}{:02x}".format(*(int(x) for x in ip.split(".")))


def table(netdev: str, *gids: str, link_local: str = LL) -> list[dict]:
    """A GID table of ``netdev`` (``RoceGidTable``'s rows): its link-local GID, then ``gids``."""
    rows = []
    for i, gid in enumerate((link_local, *gids)):
        rows += [{"index": 2 * i, "gid": gid, "type": "IB/RoCE v1", "ndev": netdev},
                 {"index": 2 * i + 1, "gid": gid, "type": "RoCE v2", "ndev": netdev}]
    return rows
