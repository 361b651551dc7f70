"""
Facts: what a node's state is now, read from the node itself.
"""

from __future__ import annotations

import json

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
