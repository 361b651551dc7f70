"""
The bed's networks: the ``unreachable`` guard route for its subnet in the root namespace, the
management bridge in the controller's namespace, each node's namespace, the fabric (a veth pair
for 2 nodes, a switch for more), the fabric port as a node powers on, and the switch port's cable.
"""

from __future__ import annotations

import subprocess

from .layout import MGMT_GATEWAY, MGMT_NET, MGMT_NS, SUBNET, SWITCH_NS, SimNode, run


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    return run(*prefix, *args, check=check, capture=True)


def in_netns(netns: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return run("ip", "netns", "exec", netns, *args, **kwargs)


# Guard routes
# ------------


def install_guard_routes() -> None:
    """Make a command run in the wrong namespace fail locally instead of leaving the machine."""
    ip("route", "replace", "unreachable", str(SUBNET))


def remove_guard_routes() -> None:
    ip("route", "del", "unreachable", str(SUBNET), check=False)


# The fabric and the management network
# -------------------------------------


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
        ip("link", "set", "fab-a", "name", a.fabric, netns=a.netns)
        ip("link", "set", "fab-b", "name", b.fabric, netns=b.netns)
    else:
        # A switch with a 9216 L2MTU, like the CRS804/CRS504 of the field reports.
        run("ip", "netns", "add", SWITCH_NS)
        ip("link", "add", "sw0", "mtu", "9216", "type", "bridge", netns=SWITCH_NS)
        ip("link", "set", "sw0", "up", netns=SWITCH_NS)
        for node in nodes:
            port = f"p-{node.name}"
            ip("link", "add", port, "netns", SWITCH_NS, "mtu", "9216", "type", "veth", "peer", "name", "fab", "netns", node.netns)
            ip("link", "set", port, "master", "sw0", "up", netns=SWITCH_NS)
            ip("link", "set", "fab", "name", node.fabric, netns=node.netns)
    for node in nodes:
        power_on_network(node)


def power_on_network(node: SimNode) -> None:
    """What the fabric port looks like when a node powers on: no IPv4, MTU 1500, link down."""
    ip("link", "set", node.fabric, "down", netns=node.netns)
    ip("addr", "flush", "dev", node.fabric, netns=node.netns)
    ip("link", "set", node.fabric, "mtu", "1500", netns=node.netns)
    if node.index % 2 == 0:
        # Router-advertised IPv6 on even nodes takes GID slots before the IPv4 one, so the
        # RoCE v2 IPv4 GID index differs per node (3 on one, 5 on another), as in the field.
        ip("addr", "add", f"fd00:213:1::{node.index}/64", "dev", node.fabric, "nodad", netns=node.netns)


def cable(name: str, plugged: bool) -> None:
    """Pull (or plug back) a node's fabric cable at the switch (beds of 3+ nodes)."""
    if not any(line.startswith(SWITCH_NS) for line in run("ip", "netns", "list", capture=True).stdout.splitlines()):
        raise RuntimeError("a direct-cabled pair has no switch port to pull: bring the bed up with 3+ nodes")
    ip("link", "set", f"p-{name}", "up" if plugged else "down", netns=SWITCH_NS)
