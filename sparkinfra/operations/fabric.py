"""
The fabric port: each of its netdevs (the fabric interface and its twin) up with the MTU, the
node's addresses on them, all back at boot.
"""

from __future__ import annotations

from ipaddress import IPv4Interface, IPv4Network

from pyinfra import host
from pyinfra.api import (
    OperationError,
    QuoteString,
    StringCommand,
    operation,
)

from ..facts.fabric import FabricLink, NetworkConfigBackend
from ..facts.reading import gathered
from ..node.paths import FABRIC_NETPLAN, FABRIC_UNIT, unit_path
from .files import file_content, render
from .units import service_enabled



def _link(interface: str) -> dict:
    link = gathered(host, FabricLink, interface=interface)
    if link is None:
        raise OperationError(f"{host.name}: fabric interface {interface} does not exist")
    return link


@operation()
def fabric_link(interface: str, mtu: int, up: bool = True):
    """
    Ensure the fabric interface has the MTU and is administratively up.

    + interface: the fabric interface (``enp1s0f0np0``)
    + mtu: the MTU it must have (4200 on a Spark fabric: RoCE then runs at 4096)
    + up: whether the link must be up; a link already right is never bounced
    """
    link = _link(interface)
    if link["mtu"] != mtu:
        yield StringCommand("ip", "link", "set", "dev", QuoteString(interface), "mtu", str(mtu))
    if up and not link["admin_up"]:
        yield StringCommand("ip", "link", "set", "dev", QuoteString(interface), "up")
    elif not up and link["admin_up"]:
        yield StringCommand("ip", "link", "set", "dev", QuoteString(interface), "down")
    if link["mtu"] == mtu and link["admin_up"] == up:
        host.noop(f"{interface} has MTU {mtu} and is {'up' if up else 'down'}")


@operation()
def fabric_address(interface: str, address: str, present: bool = True, apart_from: tuple[str, ...] = ()):
    """
    Ensure a fabric port's netdev carries an IPv4 address (at runtime).

    + interface: the netdev (the fabric interface, or its twin)
    + address: the address with its prefix, ``192.168.192.1/24``
    + present: whether it must be there; other addresses of the same subnet (a renumbered or
      mistyped node) are removed when ``present``, since two would confuse GID and NCCL
    + apart_from: subnets this netdev must hold no address of either (the twin: the fabric subnet,
      never on both twins), removed when ``present``
    """
    wanted = IPv4Interface(address)
    link = _link(interface)
    current = [IPv4Interface(a) for a in link["ipv4"]]
    subnets: list[IPv4Network] = [wanted.network, *(IPv4Network(s) for s in apart_from)]
    changed = False
    for other in current:
        if other == wanted:
            continue
        if present and (other.ip == wanted.ip or any(other.ip in subnet for subnet in subnets)):
            changed = True
            yield StringCommand("ip", "addr", "del", str(other), "dev", QuoteString(interface))
    if present and wanted not in current:
        changed = True
        yield StringCommand("ip", "addr", "add", str(wanted), "dev", QuoteString(interface))
    if not present and wanted in current:
        changed = True
        yield StringCommand("ip", "addr", "del", str(wanted), "dev", QuoteString(interface))
    if not changed:
        host.noop(f"{interface} {'has' if present else 'does not have'} {wanted}")


@operation()
def fabric_persisted(links: list[tuple[str, str]], mtu: int, present: bool = True):
    """
    Ensure the fabric port's addresses and MTU come back at boot, on each of its netdevs (the
    fabric interface and its twin): a netplan file where netplan is installed (DGX OS), else a
    oneshot unit that sets them before the network is up. Nothing is applied now (the runtime
    operations do that, without bouncing the link).

    + links: ``(netdev, address with prefix)`` of each, the fabric interface first
    + mtu: the MTU of both
    + present: whether the boot-time config must exist
    """
    values = {"links": [{"interface": i, "address": a} for i, a in links], "mtu": mtu}
    if gathered(host, NetworkConfigBackend) == "netplan":
        dest = FABRIC_NETPLAN
        if not present:
            yield from file_content._inner(path=dest, present=False)
            return
        yield from file_content._inner(
            path=dest, mode="600",  # netplan refuses world-readable files
            content=render("etc/netplan/60-sparkinfra-fabric.yaml.j2", **values),
        )
        return
    unit = FABRIC_UNIT
    dest = unit_path(unit)
    if not present:
        yield from service_enabled._inner(service=unit, enabled=False)
        yield from file_content._inner(path=dest, present=False)
        return
    changed = False
    for command in file_content._inner(
        path=dest, mode="644", content=render("etc/systemd/system/sparkinfra-fabric.service.j2", **values),
    ):
        changed = True
        yield command
    if changed:
        yield StringCommand("systemctl", "daemon-reload")
    yield from service_enabled._inner(service=unit, enabled=True)
