"""
The controller's SSH connections to the nodes.
"""

from __future__ import annotations

import functools
import socket

from paramiko import SSHException
from pyinfra.api.state import BaseStateCallback, State

from .facts.reading import unproxied


def tune_connections(state: State) -> None:
    """
    Tune the SSH connection of every host of this run, connected now or later: Nagle's algorithm
    off (``no_delay``: paramiko leaves it on, so the small packets of each command wait for the
    node's delayed ACK, about 40 ms per command and fact, four times what the command itself
    takes), and a connection lost mid-run an error pyinfra reports on that host (``lost_as_ssh_error``).

    .. code:: python

        ssh.tune_connections(state)  # once per run: run.start() does
    """
    state = unproxied(state)
    for host in state.inventory:
        if host.connected:
            no_delay(host)
            lost_as_ssh_error(host)
    state.add_callback_handler(_TuneOnConnect())


def no_delay(host) -> bool:
    """Set ``TCP_NODELAY`` on ``host``'s SSH socket; False when it has no plain TCP socket."""
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client else None
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False  # not connected, or through a proxy command or jump host's channel
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return True


def lost_as_ssh_error(host) -> None:
    """
    Have ``host``'s commands raise ``SSHException`` where paramiko raises ``EOFError`` (a session
    opened on a connection whose node just went away: a reboot, a power loss). pyinfra handles
    ``SSHException`` as a failed command or fact on that host (its error line, the host failed);
    ``EOFError`` escapes as an internal error with a traceback, and the run stops there.
    """
    connector = host.connector
    if getattr(connector, "_sparkinfra_lost", False):
        return
    run = connector.run_shell_command

    @functools.wraps(run)
    def run_shell_command(*args, **kwargs):
        try:
            return run(*args, **kwargs)
        except EOFError as exc:
            raise SSHException(f"the connection to {host.name} closed ({type(exc).__name__}): it went away") from exc

    connector.run_shell_command = run_shell_command
    connector._sparkinfra_lost = True


class _TuneOnConnect(BaseStateCallback):
    @staticmethod
    def host_connect(state: State, host) -> None:
        no_delay(host)
        lost_as_ssh_error(host)
