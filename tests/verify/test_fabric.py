"""The fabric port (deploys/prepare.py): address, MTU, link, and jumbo frames end to end."""

import pytest


def test_fabric_address(node):
    iface = node.cluster.fabric.interface
    prefix = node.cluster.fabric.subnet.prefixlen
    addresses = node.host.check_output(f"ip -4 -o addr show dev {iface}")
    assert f"inet {node.node.fabric_ip}/{prefix} " in addresses, f"{node}: {addresses!r}"


def test_fabric_mtu(node):
    iface = node.cluster.fabric.interface
    mtu = int(node.host.file(f"/sys/class/net/{iface}/mtu").content_string)
    assert mtu == node.cluster.fabric.mtu


def test_fabric_link_up(node):
    iface = node.cluster.fabric.interface
    assert node.host.file(f"/sys/class/net/{iface}/operstate").content_string.strip() == "up"


def test_jumbo_frames_cross_the_fabric(link):
    """A don't-fragment ping of MTU-28 bytes (a full frame) reaches every peer."""
    src, dst = link
    size = src.cluster.fabric.mtu - 28
    result = src.host.run(f"ping -c 1 -W 2 -M do -s {size} {dst.node.fabric_ip}")
    assert result.rc == 0, f"{src} -> {dst} ({size} bytes, DF): rc {result.rc} {result.stdout}{result.stderr}"


def test_frames_past_the_mtu_do_not_cross(node):
    """One byte more, with don't-fragment, is refused by this node's own port (an MTU above the
    settings' would let it through): a property of the node, so one peer is enough."""
    peer = next((n for n in node.cluster.nodes if n.name != node.node.name), None)
    if peer is None:
        pytest.skip("a cluster of one node has no peer")
    size = node.cluster.fabric.mtu - 27
    result = node.host.run(f"ping -c 1 -W 0.3 -M do -s {size} {peer.fabric_ip}")
    said = result.stdout + result.stderr
    assert result.rc != 0 and ("message too long" in said or "Frag needed" in said), (
        f"{node} -> {peer.name} ({size} bytes, DF): rc {result.rc} {said}")
