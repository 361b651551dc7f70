"""
The controller's SSH connections to the nodes.
"""

from __future__ import annotations

import socket

from pyinfra.api.state import BaseStateCallback, State

from .facts.reading import unproxied


def prompt_replies(state: State) -> None:
    """
    Turn Nagle's algorithm off on the SSH socket of every host of this run, connected now or
    later. paramiko leaves it on, so the small packets of each command wait for the node's
    delayed ACK: about 40 ms per command and fact, four times what the command itself takes.

    .. code:: python

        ssh.prompt_replies(state)  # once per run: run.start() does
    """
    state = unproxied(state)
    for host in state.inventory:
        if host.connected:
            no_delay(host)
    state.add_callback_handler(_NoDelayOnConnect())


def no_delay(host) -> bool:
    """Set ``TCP_NODELAY`` on ``host``'s SSH socket; False when it has no plain TCP socket."""
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client else None
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False  # not connected, or through a proxy command or jump host's channel
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return True


class _NoDelayOnConnect(BaseStateCallback):
    @staticmethod
    def host_connect(state: State, host) -> None:
        no_delay(host)
