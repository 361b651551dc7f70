"""
The GPU's clock: locked to a range at boot and now (``nvidia-smi -lgc``), or left to the driver.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.systemd import SystemdStatus

from ..facts.files import FileState
from ..facts.reading import gathered
from ..node.paths import GPU_CLOCKS_UNIT, unit_path
from .files import file_content, render
from .units import service_enabled



@operation()
def gpu_clocks_locked(clocks: str = "", present: bool = True):
    """
    Ensure the GPU clock is locked to ``clocks`` (``MIN,MAX`` MHz) by a oneshot unit that runs
    ``nvidia-smi -lgc`` at boot and now; a changed range is applied at once. Absent: the unit is
    stopped (``nvidia-smi -rgc`` gives the driver its clocks back) and removed.

    + clocks: ``"200,2150"``
    + present: whether the clock is locked
    """
    unit, path = GPU_CLOCKS_UNIT, unit_path(GPU_CLOCKS_UNIT)
    if not present and gathered(host, FileState, path=path)["kind"] == "absent":
        host.noop("the GPU clock is the driver's")  # nothing of ours to stop or remove: no more reads
        return
    active = bool(gathered(host, SystemdStatus, services=unit).get(unit))
    if not present:
        if active:
            yield StringCommand("systemctl", "stop", QuoteString(unit))
        yield from service_enabled._inner(service=unit, enabled=False)
        yield from file_content._inner(path=path, present=False)
        return
    changed = False
    for command in file_content._inner(
        path=path, content=render(f"etc/systemd/system/{unit}.j2", clocks=clocks)
    ):
        changed = True
        yield command
    if changed:
        yield StringCommand("systemctl", "daemon-reload")
    yield from service_enabled._inner(service=unit, enabled=True)
    if changed or not active:
        yield StringCommand("systemctl", "restart", QuoteString(unit))
    else:
        host.noop(f"{unit} holds the GPU clock at {clocks} MHz")
