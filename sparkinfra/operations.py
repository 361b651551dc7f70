"""
Operations: each ensures one piece of node state, and yields commands only when the
fact says the state differs.
"""

from __future__ import annotations

from ipaddress import IPv4Interface, IPv4Network

from pyinfra import host
from pyinfra.api import OperationError, QuoteString, StringCommand, operation

from .facts import FabricLink


def _link(interface: str) -> dict:
    link = host.get_fact(FabricLink, interface=interface)
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
def fabric_address(interface: str, address: str, present: bool = True):
    """
    Ensure the fabric interface carries an IPv4 address (at runtime).

    + interface: the fabric interface
    + address: the address with its prefix, ``192.168.192.1/24``
    + present: whether it must be there; other addresses of the same subnet (a renumbered or
      mistyped node) are removed when ``present``, since two would confuse GID and NCCL
    """
    wanted = IPv4Interface(address)
    link = _link(interface)
    current = [IPv4Interface(a) for a in link["ipv4"]]
    subnet: IPv4Network = wanted.network
    changed = False
    for other in current:
        if other == wanted:
            continue
        if present and (other.ip == wanted.ip or other.ip in subnet):
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
