"""
Every node ready for multi-node vLLM: the fabric port up, at the fabric MTU, with its address.

    pyinfra inventory/pair.py deploys/prepare.py
"""

from pyinfra import host

from sparkinfra import operations, settings

cluster = settings.current().cluster_of(host.name)
node = cluster.node(host.name)
fabric = cluster.fabric

operations.fabric_link(
    name=f"Fabric port {fabric.interface} is up with MTU {fabric.mtu}",
    interface=fabric.interface,
    mtu=fabric.mtu,
    up=True,
)
operations.fabric_address(
    name=f"Fabric address {node.fabric_ip}/{fabric.subnet.prefixlen} is on {fabric.interface}",
    interface=fabric.interface,
    address=f"{node.fabric_ip}/{fabric.subnet.prefixlen}",
    present=True,
)
