"""
The operator's tools (``status``, ``logs``) on a cluster's nodes, outside a deploy: the inventory
and its settings as a deploy reads them, each node reached through pyinfra's own connector (the
same SSH user, key, known hosts and sudo as a converge), every node at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
from pyinfra.api import Config, State, StringCommand
from pyinfra.api.exceptions import ConnectError

from . import preflight
from .run import InventorySettingsError, load_files
from .settings import Cluster, Settings, SettingsError


@dataclass
class Reached:
    """The nodes of one cluster: each connected pyinfra host, or why it was not reached."""

    cluster: Cluster
    hosts: dict[str, Any] = field(default_factory=dict)  # node name -> connected pyinfra host
    unreachable: dict[str, str] = field(default_factory=dict)  # node name -> why


def settings_of(inventory_file: str, data: list[str] = ()) -> tuple[Any, Settings]:
    """The inventory and its checked settings (``run.load_files``), pyinfra's own log kept quiet.
    Raises ``InventorySettingsError`` saying what is wrong, in words."""
    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)
    if not Path(inventory_file).is_file():
        raise InventorySettingsError(f"no inventory file {inventory_file}")
    try:
        return load_files(inventory_file, data)
    except SettingsError as exc:
        raise InventorySettingsError(f"bad settings: {exc}") from None


def clusters_of(settings: Settings, name: str | None) -> list[Cluster]:
    """The clusters asked for: ``name``, or every cluster of the inventory. Raises
    ``InventorySettingsError`` for a cluster the inventory does not have."""
    if name:
        if name not in settings.clusters:
            raise InventorySettingsError(f"no cluster {name!r} in the inventory (it has: {', '.join(settings.clusters)})")
        return [settings.clusters[name]]
    return list(settings.clusters.values())


def connect(inventory, clusters: list[Cluster]) -> list[Reached]:
    """Connect to every node of ``clusters`` at once; a node that cannot be reached says why
    (a changed host key by name: ``preflight.unreachable_detail``)."""
    state = State(check_for_changes=False)
    state.init(inventory, Config())
    names = {node.name for cluster in clusters for node in cluster.nodes}
    hosts = {host.name: host for host in inventory if host.name in names}

    def one(host) -> str:
        try:
            host.connect(show_errors=False, raise_exceptions=True)
            return ""
        except (ConnectError, OSError) as exc:
            return preflight.unreachable_detail(host.data, host.name) if "key" in str(exc).lower() else (
                f"not reachable ({exc})")

    errors = dict(zip(hosts, at_once([(one, (host,)) for host in hosts.values()])))
    reached = []
    for cluster in clusters:
        found = Reached(cluster)
        for node in cluster.nodes:
            if errors.get(node.name):
                found.unreachable[node.name] = errors[node.name]
            else:
                found.hosts[node.name] = hosts[node.name]
        reached.append(found)
    return reached


def at_once(calls: list[tuple[Callable, tuple]]) -> list:
    """Run ``(function, args)`` calls in parallel greenlets (pyinfra's connections are gevent's);
    their results in order."""
    greenlets = [gevent.spawn(function, *args) for function, args in calls]
    gevent.joinall(greenlets)
    return [g.get() for g in greenlets]


def run(host, command: StringCommand | str, timeout: int | None = 60,
        print_output: bool = False) -> tuple[bool, str, str]:
    """``command`` on ``host`` as a deploy runs it (through sudo when the host's data says
    ``_sudo``): (succeeded, stdout, stderr); ``print_output``: each line printed as it comes,
    after the host's name."""
    ok, output = host.run_shell_command(
        command, _sudo=bool(host.data.get("_sudo")), _timeout=timeout, print_output=print_output,
    )
    return ok, output.stdout, output.stderr
