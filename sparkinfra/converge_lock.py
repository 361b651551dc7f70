"""
One converge at a time: a lock on each cluster's head, held for the whole pyinfra run.

The lock is a ``flock`` held by a shell on the head that lives as long as this run's SSH
connection to it (over pyinfra's own connection, reading its stdin): a run that dies drops it
with its connection, so a killed run never blocks the next one. The holder (who, where, since
when, what) is written next to it and removed when the run ends normally; a later run that finds
the lock free but a holder left behind says it takes over from a run that did not finish.

``run.start()`` calls ``hold()`` once per run, for every cluster head of the inventory, before
any operation executes.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import sys
import time

from pyinfra import logger
from pyinfra.api import State
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import BaseStateCallback

from . import scripts
from .node.paths import CONVERGE_HOLDER, CONVERGE_LOCK

LOCK, HOLDER = CONVERGE_LOCK, CONVERGE_HOLDER


class ConvergeLocked(PyinfraError):
    """Another converge holds a head's lock (printed by pyinfra without a traceback)."""


def describe(holder_json: str) -> str:
    try:
        h = json.loads(holder_json)
    except ValueError:
        return holder_json.strip() or "an unknown run"
    return f"{h.get('user')}@{h.get('controller')} pid {h.get('pid')} ({h.get('command')}) since {h.get('since')}"


def command_line(argv: list[str]) -> str:
    """What the holder record says of the run's command: ``pyinfra`` and its files (inventory,
    deploys), never an option's value (``--data`` may carry anything, and the record is on a
    node, in the holding shell's argv)."""
    return "pyinfra " + " ".join(a for a in argv if a.endswith(".py") and not a.startswith("-"))[:200]


def _holder() -> str:
    return json.dumps({
        "user": getpass.getuser(),
        "controller": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command_line(sys.argv[1:]),
    }, sort_keys=True)


def _open(host, holder: str):
    """Start the holding shell on ``host`` over its pyinfra SSH connection; return (channel, first lines)."""
    client = getattr(host.connector, "client", None)
    if client is None:
        raise PyinfraError(f"{host.name}: the converge lock needs an SSH connection (connector {type(host.connector).__name__})")
    channel = client.get_transport().open_session()
    command = scripts.command("converge_lock.sh", LOCK, HOLDER, holder).get_raw_value()
    user = host.data.get("ssh_user") or "root"
    if host.data.get("_sudo") and user != "root":
        command = f"sudo -n {command}"
    channel.exec_command(command)
    reader = channel.makefile("r")
    status = reader.readline().strip()
    detail = reader.readline().strip()
    return channel, reader, status, detail


def hold(state: State, inventory, settings, dry: bool = False) -> None:
    """
    Take the converge lock on every cluster head of this run; release it when the run's last
    operation ends, or at once in a dry run (which only checks that no converge is under way).
    """
    held: dict[str, object] = {}
    holder = _holder()
    for cluster in settings.clusters.values():
        head = inventory.get_host(cluster.head.name)
        if not head.connected:
            continue  # pyinfra reports the failed connection itself
        channel, reader, status, detail = _open(head, holder)
        if status == "BUSY":
            channel.close()
            release(held)
            raise ConvergeLocked(
                f"another converge holds the lock on {head.name} ({cluster.name}'s head): {describe(detail)}; "
                "nothing was changed"
            )
        if status == "STALE":
            logger.warning(
                f"--> {head.name}: taking over the converge lock left by a run that did not finish: {describe(detail)}"
            )
        elif status != "FREE":
            channel.close()
            release(held)
            raise PyinfraError(f"{head.name}: could not take the converge lock ({status} {detail})".strip())
        if reader.readline().strip() != "HELD":
            channel.close()
            release(held)
            raise PyinfraError(f"{head.name}: the converge lock was not confirmed")
        held[head.name] = channel
    if dry:
        release(held)
        return
    state.add_callback_handler(_ReleaseAtEnd(held))


def release(held: dict[str, object]) -> None:
    """Release the locks ``held`` (head name -> holding channel): a normal end, the holder record goes too."""
    for channel in held.values():
        try:
            channel.sendall(b"release\n")
            channel.shutdown_write()
            channel.recv_exit_status()
            channel.close()
        except (OSError, EOFError):
            pass
    held.clear()


class _ReleaseAtEnd(BaseStateCallback):
    """Release the locks once the run's last operation has ended."""

    def __init__(self, held: dict[str, object]) -> None:
        self.held = held

    def operation_end(self, state: State, op_hash) -> None:
        order = state.get_op_order()
        if order and op_hash == order[-1]:
            release(self.held)
