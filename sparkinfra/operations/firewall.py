"""
The cluster's ports on the fabric only: an nftables table of sparkinfra's own (``inet sparkinfra``),
its file and the unit that loads it at boot. No other table is read, flushed or changed: Docker's
and the site's rules stay as they are.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from ..facts.files import FileState
from ..facts.firewall import FirewallTable
from ..facts.reading import gathered
from ..lanes.ports import merged
from ..node.paths import FIREWALL_FILE, FIREWALL_TABLE, FIREWALL_UNIT, unit_path
from .files import file_content, refuse, render
from .units import service_enabled


def _ports(ports) -> str:
    """Ports in nft's words: one alone, several as an anonymous set."""
    words = [str(p) for p in sorted(set(ports))]
    return words[0] if len(words) == 1 else "{" + ",".join(words) + "}"


def wanted_table(ranges, subnet: str, open_ports) -> dict:
    """The table ``firewall.nft`` makes of these values, as ``FirewallTable`` reads a live one."""
    return {
        "chains": ["input: filter hook input priority 0 policy accept"],
        "ports": [[first, last] for first, last in ranges],
        "rules": ["iif lo accept", f"tcp dport {_ports(open_ports)} accept", f"ip saddr {subnet} accept",
                  "tcp dport @cluster_ports ct state new reject tcp reset"],
    }


def firewall_file(ranges, subnet: str, open_ports) -> str:
    """The text of ``/etc/sparkinfra/firewall.nft`` for these values."""
    elements = [str(first) if first == last else f"{first}-{last}" for first, last in ranges]
    return render("etc/sparkinfra/firewall.nft.j2", elements=elements, subnet=subnet,
                  open_ports=[str(p) for p in sorted(set(open_ports))])


@operation()
def fabric_only_ports(ports=(), subnet: str = "", open_ports=(22,), present: bool = True):
    """
    Ensure new TCP connections to ``ports`` and to the node's ephemeral range (where the kernel
    picks every port a listener asks it for) come from ``subnet``, loopback or nowhere: the table
    ``inet sparkinfra`` (nftables) written to /etc/sparkinfra/firewall.nft, loaded now and at boot
    by ``sparkinfra-firewall.service``, and loaded again when the file changed or the live table
    differs from it. Refused with a reset: the caller sees "connection refused". Absent: the table
    deleted, the unit and the file removed.

    + ports: (first, last) ranges the lane opens (``lanes.ports.firewalled``)
    + subnet: the fabric subnet, ``"10.0.0.0/24"``
    + open_ports: ports never matched, whatever the ranges hold (SSH, the API)
    + present: whether the rule is in place
    """
    live = gathered(host, FirewallTable)
    unit_file = unit_path(FIREWALL_UNIT)
    if not present:
        mine = [p for p in (unit_file, FIREWALL_FILE) if gathered(host, FileState, path=p)["kind"] != "absent"]
        if live["table"] is None and not mine:
            host.noop("no firewall table of sparkinfra's is on this node")
            return
        if live["table"] is not None:
            yield StringCommand("nft", "delete", "table", *FIREWALL_TABLE.split())
        if unit_file in mine:
            yield from service_enabled._inner(service=FIREWALL_UNIT, enabled=False)
        for path in mine:
            yield from file_content._inner(path=path, present=False)
        if unit_file in mine:
            yield StringCommand("systemctl", "daemon-reload")
        return
    if not live["nft"]:
        yield from refuse(f"{host.name}: nft is missing: install nftables (DGX OS has it), or set firewall: false "
                          "(then the site keeps the cluster ports off its LAN)")
        return
    ranges = merged([*ports, tuple(live["ephemeral"] or (32768, 60999))])
    changed = False
    for command in file_content._inner(path=FIREWALL_FILE, content=firewall_file(ranges, subnet, open_ports)):
        changed = True
        yield command
    unit_changed = False
    for command in file_content._inner(path=unit_file, content=render(f"etc/systemd/system/{FIREWALL_UNIT}.j2")):
        unit_changed = True
        yield command
    if unit_changed:
        yield StringCommand("systemctl", "daemon-reload")
    yield from service_enabled._inner(service=FIREWALL_UNIT, enabled=True)
    if changed or unit_changed or live["table"] != wanted_table(ranges, subnet, open_ports):
        yield StringCommand("systemctl", "restart", QuoteString(FIREWALL_UNIT))
    else:
        host.noop(f"the table {FIREWALL_TABLE} keeps {len(ranges)} port ranges to {subnet}")
