"""
systemd units: enabled at boot or not, nothing started or stopped.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import (
    QuoteString,
    StringCommand,
    operation,
)
from pyinfra.facts.systemd import SystemdEnabled

from ..facts.reading import gathered


@operation()
def service_enabled(service: str, enabled: bool = True):
    """
    Ensure a systemd unit is enabled (starts at boot) or not; nothing is started or stopped now.
    One fact (``SystemdEnabled``); pyinfra's ``systemd.service`` also reads ``SystemdStatus``.

    + service: the unit, ``sparkinfra-fabric.service``
    + enabled: whether it starts at boot
    """
    if bool(gathered(host, SystemdEnabled, services=service).get(service)) == enabled:
        host.noop(f"{service} is {'enabled' if enabled else 'disabled'}")
        return
    yield StringCommand("systemctl", "enable" if enabled else "disable", QuoteString(service))
