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


@pytest.mark.parametrize("extra, crosses", [(0, True), (1, False)], ids=["mtu-28", "mtu-27"])
def test_jumbo_frames_cross_the_fabric(link, extra, crosses):
    """A don't-fragment ping of MTU-28 bytes reaches every peer; MTU-27 must not."""
    src, dst = link
    size = src.cluster.fabric.mtu - 28 + extra
    result = src.host.run(f"ping -c 1 -W 2 -M do -s {size} {dst.node.fabric_ip}")
    assert (result.rc == 0) == crosses, f"{src} -> {dst} ({size} bytes, DF): rc {result.rc} {result.stdout}{result.stderr}"
