"""
The bed's networks: the ``unreachable`` guard route for its subnet in the root namespace, the
management bridge in the controller's namespace, each node's namespace, the fabric (for 2 nodes a
veth pair per twin of the cabled port; for more a switch with one bridge per twin), the uncabled
port's twins (veths whose peers wait, down, in ``UNPLUGGED_NS``: never a carrier), the netdevs as
a node powers on, and the switch ports' cable.
"""

from __future__ import annotations

import subprocess

from .layout import MGMT_GATEWAY, MGMT_NET, MGMT_NS, PREFIX, SHAPES, SUBNET, SWITCH_NS, SimNode, run

# The far ends of every node's uncabled twins (kept down: those netdevs never see a carrier).
UNPLUGGED_NS = f"{PREFIX}-unplugged"


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
    """Management bridge in the controller's namespace; the fabric twins (veth pairs or a switch); the uncabled port."""
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
    if len({node.shape for node in nodes}) != 1:
        raise ValueError("one shape per bed")
    run("ip", "netns", "add", UNPLUGGED_NS)
    for node in nodes:
        for k, netdev in enumerate(SHAPES[node.shape].uncabled):
            far = f"u{k}-{node.name}"[:15]
            ip("link", "add", far, "netns", UNPLUGGED_NS, "type", "veth", "peer", "name", f"unc{k}", "netns", node.netns)
            ip("link", "set", f"unc{k}", "name", netdev, netns=node.netns)
    if len(nodes) == 2:
        # One cable, two twins: each twin's own link between the pair (fabric to fabric, twin to twin).
        a, b = nodes
        for tag, attr in (("fab", "fabric"), ("twn", "twin")):
            ip("link", "add", f"{tag}-a", "netns", a.netns, "type", "veth", "peer", "name", f"{tag}-b", "netns", b.netns)
            ip("link", "set", f"{tag}-a", "name", getattr(a, attr), netns=a.netns)
            ip("link", "set", f"{tag}-b", "name", getattr(b, attr), netns=b.netns)
    else:
        # A switch with a 9216 L2MTU, like the CRS804/CRS504 of the field reports: sw0 joins the
        # fabric twins, sw1 the other twins (one breakout cable carries both of a node's twins).
        run("ip", "netns", "add", SWITCH_NS)
        for bridge in ("sw0", "sw1"):
            ip("link", "add", bridge, "mtu", "9216", "type", "bridge", netns=SWITCH_NS)
            ip("link", "set", bridge, "up", netns=SWITCH_NS)
        for node in nodes:
            for bridge, prefix, tag, netdev in (("sw0", "p", "fab", node.fabric), ("sw1", "q", "twn", node.twin)):
                port = f"{prefix}-{node.name}"
                ip("link", "add", port, "netns", SWITCH_NS, "mtu", "9216", "type", "veth",
                   "peer", "name", tag, "netns", node.netns)
                ip("link", "set", port, "master", bridge, "up", netns=SWITCH_NS)
                ip("link", "set", tag, "name", netdev, netns=node.netns)
    for node in nodes:
        power_on_network(node)


def power_on_network(node: SimNode) -> None:
    """What the ConnectX-7's four netdevs look like when a node powers on: link down, no IPv4, MTU 1500."""
    shape = SHAPES[node.shape]
    for netdev in shape.netdevs:
        ip("link", "set", netdev, "down", netns=node.netns)
        ip("addr", "flush", "dev", netdev, netns=node.netns)
        ip("link", "set", netdev, "mtu", "1500", netns=node.netns)
    if node.index % 2 == 0:
        # Router-advertised IPv6 on even nodes (the RA reaches both twins of the cabled port: one
        # link) takes GID slots before the IPv4 one, so the RoCE v2 IPv4 GID index differs per node
        # (3 on one, 5 on another), as in the field, on both twins.
        for netdev in (shape.fabric, shape.twin):
            ip("addr", "add", f"fd00:213:1::{node.index}/64", "dev", netdev, "nodad", netns=node.netns)


def cable(name: str, plugged: bool) -> None:
    """Pull (or plug back) a node's fabric cable at the switch (beds of 3+ nodes): both twins' ports."""
    if not any(line.startswith(SWITCH_NS) for line in run("ip", "netns", "list", capture=True).stdout.splitlines()):
        raise RuntimeError("a direct-cabled pair has no switch port to pull: bring the bed up with 3+ nodes")
    for prefix in ("p", "q"):
        ip("link", "set", f"{prefix}-{name}", "up" if plugged else "down", netns=SWITCH_NS)
