"""
The start of every deploy: once per pyinfra run, the inventory's settings are validated (lanes
included), a ``--limit`` that covers part of a cluster is refused, SSH is tuned and the converge
lock is taken on every head; then each host learns its cluster and role. Before that, the check
before any connection (``check_command_line``, run by the project's ``config.py`` before pyinfra
loads the inventory). Also the one loader of an inventory outside pyinfra's CLI (``load_files``:
chat, the verify suite, tests).

.. code:: python

    from sparkinfra import run

    here = run.start()  # the first line of a deploy
    here.cluster, here.node, here.is_head
"""

from __future__ import annotations

import os
import sys
import traceback
import weakref
from dataclasses import dataclass
from fnmatch import fnmatch
from functools import partial
from pathlib import Path
from typing import Any

import click
from gevent.lock import Semaphore
from pyinfra import host, logger
from pyinfra.api import State
from pyinfra.api.exceptions import NoGroupError, PyinfraError
from pyinfra.context import ctx_state
from pyinfra_cli.exceptions import CliError, UnexpectedExternalError

from . import api_key, converge_lock, lanes, lock, preflight, rules, ssh
from .facts.reading import unproxied
from .settings import Cluster, Node, Settings, SettingsError, display, load_settings


class InventorySettingsError(CliError, PyinfraError):
    """
    A run refused before any host is touched (bad settings, a ``--limit`` that cuts a cluster).

    A ``CliError``, so that pyinfra's CLI prints the message alone: a plain ``PyinfraError`` is
    printed with the file and line it was raised from, which is sparkinfra's own and reads like a
    crash in it. Also a ``PyinfraError``, so that pyinfra's file loader passes it on unwrapped.
    """

    def show(self, file=None) -> None:
        logger.warning(f"--> {click.style('sparkinfra', 'red', bold=True)}: {self.message}")


@dataclass(frozen=True)
class Here:
    """What a deploy knows of the host it runs for."""

    settings: Settings
    cluster: Cluster
    node: Node

    @property
    def is_head(self) -> bool:
        return self.node == self.cluster.head


@dataclass
class _Run:
    settings: Settings | None = None
    error: BaseException | None = None
    preflight_done: bool = False


# The one record of runs already started, by construction: the key is the run's own state.
_runs: weakref.WeakKeyDictionary[State, _Run] = weakref.WeakKeyDictionary()
# pyinfra loads a deploy for every host at once, in greenlets: the first to start does the
# run-level work while the others wait for it (it waits on the network: SSH, the lock).
_starting = Semaphore()


def start(preflight_first: bool = False, resolve: bool = True) -> Here:
    """
    Start this pyinfra run (the first call does the run-level work; later calls only look up)
    and say which cluster and role the current host has.

    + preflight_first: check every node once (``preflight.run``) before any operation
    + resolve: resolve on each head what the site's lock lacks (``lock.settle``); off for a run
      that needs no pin (teardown): the lock's pins are read, nothing is resolved
    """
    state = unproxied(ctx_state.get())
    with _starting:
        record = _runs.setdefault(state, _Run())
        if record.error is None and record.settings is None:
            try:
                try:
                    settings = _settings_of_run(state)
                except SettingsError as exc:  # not checked before connecting (no config.py): now
                    raise InventorySettingsError(f"bad settings: {exc}") from None
                whole_clusters(state, settings)  # before any host is touched
                ssh.tune_connections(state)  # no delayed-ACK wait; a node gone away is its failure, not a crash
                api_key.say_open(state, settings)  # an API served without a key: said in the run's last lines
                dry = bool(cli_params().get("dry"))
                converge_lock.hold(state, state.inventory, settings, dry=dry)  # one at a time
                try:  # what the network decides: the lock's pins, what it lacks resolved on the heads
                    settings = (lock.settle(state, settings, _inventory_file(), state.cwd, dry=dry) if resolve
                                else lock.pinned(settings, _inventory_file(), state.cwd))
                except (lock.LockError, lanes.LaneError) as exc:
                    raise InventorySettingsError(str(exc)) from None
                record.settings = settings
            except BaseException as exc:
                record.error = exc
        if record.error is None and preflight_first and not record.preflight_done:
            record.preflight_done = True
            try:
                preflight.run(state, record.settings, in_run(state))
            except BaseException as exc:
                record.error = exc
    if record.error is not None:
        raise record.error
    cluster = record.settings.cluster_of(host.name)
    return Here(record.settings, cluster, cluster.node(host.name))


def in_run(state) -> set[str]:
    """
    Names of the hosts this run operates on: the inventory's, narrowed by ``--limit`` and
    ``--exclude`` (pyinfra's ``state.limit_hosts``), reachable or not.
    """
    return {h.name for h in state.inventory if state.is_host_in_limit(h)}


def whole_clusters(state, settings: Settings) -> None:
    """
    Refuse a run that covers part of a cluster (``--limit``), before anything runs on a host: the
    head streams the image, reads the manifest and pins the mesh keys of every node. A cluster
    left out entirely is fine. Raises ``InventorySettingsError`` naming the nodes to add.
    """
    refuse_cut_clusters(list(state.inventory), in_run(state), settings)


def limited(inventory) -> set[str]:
    """
    Names of ``inventory``'s hosts that the running pyinfra command's ``--limit`` and ``--exclude``
    keep, matched as pyinfra's CLI matches them (all of them outside the CLI), for the check
    before any connection (``check_inventory``).
    """
    params = cli_params()
    names = matching(inventory, params["limit"]) if params.get("limit") else {h.name for h in inventory}
    return names - matching(inventory, params.get("exclude") or ())


def matching(inventory, patterns) -> set[str]:
    """Names of the hosts ``patterns`` (``--limit``/``--exclude`` values) match, by pyinfra's CLI's
    rule: a group's name matches its hosts, anything else is a glob on host names (pyinfra's CLI
    itself warns of a pattern that matches nothing)."""
    found = set()
    for pattern in patterns:
        try:
            found.update(h.name for h in inventory.get_group(pattern))
        except NoGroupError:
            found.update(h.name for h in inventory if fnmatch(h.name, pattern))
    return found


def refuse_cut_clusters(hosts: list, running: set[str], settings: Settings) -> None:
    """``whole_clusters``' check: ``hosts`` in the inventory's order, ``running`` the names in the run."""
    left_out = {}
    for cluster in settings.clusters.values():
        missing = [node.name for node in cluster.nodes if node.name not in running]
        if missing and len(missing) < len(cluster.nodes):
            left_out[cluster.name] = missing
    if not left_out:
        return
    add = {name for missing in left_out.values() for name in missing}
    wanted = [h.name for h in hosts if h.name in running or h.name in add]
    raise InventorySettingsError(
        "--limit leaves out "
        + " and ".join(f"{', '.join(missing)} of cluster {name}" for name, missing in left_out.items())
        + ": a run converges whole clusters (the head streams the image, reads the manifest and pins the "
        f"mesh keys of every node); add them: {' '.join(f'--limit {n}' for n in wanted)}; nothing was changed"
    )


def checked_settings(inventory, inventory_file: str | None = None, cwd: str | None = None,
                     group_data_dirs: list[str] | tuple[str, ...] = ()) -> Settings:
    """``settings.load_settings`` with each cluster's lane found and checked against it."""
    return api_key.with_keys(load_settings(inventory, inventory_file, cwd, group_data_dirs,  # a keyless cluster's own
                                           check_lane=partial(rules.lane_problems, project=cwd)), Path(cwd or Path.cwd()))


def load_files(inventory_file: str, data: list[str] | tuple[str, ...] = (),
               cwd: str | None = None, pin: bool = True) -> tuple[Any, Settings]:
    """
    The inventory and its settings as pyinfra's CLI builds them from ``inventory_file``,
    ``group_data/`` and ``data`` (``key=value`` strings, as ``--data``), outside a pyinfra run;
    with ``pin``, as each cluster's lock pins them (``lock.pinned``: nothing is resolved).
    """
    from pyinfra_cli.inventory import make_inventory_from_files

    override = parse_data(data)
    cwd = cwd or str(Path.cwd())
    if not ctx_state.isset():
        ctx_state.set(State())  # pyinfra's loader executes files in a state's context
    inventory = make_inventory_from_files(inventory_file, override, cwd)
    settings = checked_settings(inventory, inventory_file, cwd)
    if not pin:
        return inventory, settings
    try:
        return inventory, lock.pinned(settings, inventory_file, cwd)
    except lock.LockError as exc:
        raise SettingsError(str(exc)) from None


# pyinfra's command line: the one place that reads it
# ---------------------------------------------------


def cli_params() -> dict[str, Any]:
    """Parameters of the running pyinfra command line (``inventory``, ``data``, ``dry``...), if any."""
    import click

    ctx = click.get_current_context(silent=True)
    return dict(ctx.params) if ctx is not None else {}


def parse_data(items) -> dict[str, Any]:
    """``key=value`` strings (``--data``), each value parsed as pyinfra's CLI parses it."""
    from pyinfra_cli.util import parse_cli_arg

    data = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals:
            raise SettingsError(f"--data, key '{key}': no value (--data takes key=value)")
        data[key] = parse_cli_arg(value)
    return data


def _cli_override_data() -> dict[str, Any]:
    """``--data key=value`` of the running pyinfra command, parsed as pyinfra parses it."""
    params = cli_params()
    try:
        data = parse_data(params.get("data") or ())
    except SettingsError as exc:
        raise InventorySettingsError(f"bad settings: {exc}") from None
    if params.get("ssh_user"):
        data["ssh_user"] = params["ssh_user"]
    return data


def _inventory_file() -> str | None:
    """The running pyinfra command's inventory file (None: a host list or another kind)."""
    inventory_file = cli_params().get("inventory")
    return display(Path(inventory_file)) if inventory_file and Path(inventory_file).is_file() else None


def _settings_of_run(state: State) -> Settings:
    """The validated settings of a pyinfra run's inventory (as the site's data names them: the
    lock's pins are applied by ``start``)."""
    group_data = tuple(cli_params().get("group_data") or ())
    return checked_settings(state.inventory, _inventory_file(), state.cwd, group_data)


# Inventories being checked (their own validate_inventory, run by the check's load, waits) and
# checked by this process's pyinfra command (pyinfra's own load of them need not check again).
_validating: set[str] = set()
_checked: set[str] = set()


def check_command_line() -> Settings | None:
    """
    Check the settings of the inventory the running ``pyinfra`` command names, before pyinfra
    loads it and so before any connection (``check_inventory``, with the command's ``--data``,
    ``--group-data``, ``--limit``). The project's ``config.py`` calls this; outside a pyinfra
    command it does nothing.

    Why ``config.py``: pyinfra's CLI executes it (from the directory it runs in, or ``--config``)
    after reading its options and before loading the inventory, for every command and every kind of
    inventory. The other places run too late or not always: deploy files load after pyinfra has
    connected; a line at the end of an inventory (``validate_inventory``) is not in an inventory
    written without it; ``group_data/all.py`` runs while an inventory loads, but only for files
    and host lists, sees the inventory half built, and is a data file sites rewrite. Here the
    inventory is built with pyinfra's own ``make_inventory`` from the same options, so what is
    checked is what pyinfra then connects to; an inventory that fails to import is told as its
    file and line, before pyinfra would print a traceback.
    """
    params = cli_params()
    target = params.get("inventory")
    if not target:
        return None
    settings = check_inventory(target, _cli_override_data(), params.get("group_data") or ())
    _checked.add(_known_as(target))
    deploys = {Path(str(op)).stem for op in params.get("operations") or ()}
    if settings is not None and deploys & USES_THE_KEY:  # a keyless cluster's key made on its first converge
        refuse_missing_key(api_key.with_keys(settings, Path.cwd(), make=True), os.environ)
    return settings


# The deploys that start a lane or ask its API: the key the settings name must be in the environment.
USES_THE_KEY = {"serve", "lane", "bench", "tune"}


def refuse_missing_key(settings: Settings, environ) -> None:
    """Raise ``InventorySettingsError`` for a cluster whose ``api_key_env`` names a variable the
    environment lacks or holds empty: the lane would serve with no key, or the run fail far from it."""
    for cluster in settings.clusters.values():
        name = cluster.config.api_key_env
        if name and not environ.get(name):
            said = "holds it empty" if name in environ else "does not hold it"
            raise InventorySettingsError(
                f"bad settings: cluster {cluster.name}: api_key_env names {name}, and this shell's environment "
                f"{said}: export {name}=<the key> (or set api_key_env empty to serve with no key)")


def validate_inventory(inventory_file: str) -> Settings | None:
    """
    Check an inventory file's settings while pyinfra loads it (the inventory's last line,
    ``validate_inventory(__file__)``): ``check_inventory``, for a project run without its
    ``config.py``. Once the command's own check has run, it has nothing to do.
    """
    path = _known_as(inventory_file)
    if path in _checked:
        return None
    return check_inventory(path, _cli_override_data(), cli_params().get("group_data") or ())


def check_inventory(inventory: str, data: dict[str, Any] | None = None,
                    group_data: list[str] | tuple[str, ...] = ()) -> Settings | None:
    """
    The check before connecting: ``inventory`` built as pyinfra's CLI builds it from the working
    directory (``make_inventory``: a file, a host list, ``@local``, a ``module.function``), then
    its settings checked (lanes included) and the command's ``--limit``.

    + data: ``--data`` (parsed, as ``parse_data``); group_data: ``--group-data`` folders

    Raises ``InventorySettingsError`` on the first bad key, or naming the file and line of a
    Python error in the inventory or a ``group_data`` file. None while this inventory is being
    checked already (its load executes it, and so its ``validate_inventory``, again).
    """
    from pyinfra_cli.inventory import make_inventory

    path = _known_as(inventory)
    is_file = Path(inventory).is_file()
    if not is_file and inventory.endswith(".py"):
        raise InventorySettingsError(
            f"bad settings: inventory {inventory}: no such file in {Path.cwd()} (run pyinfra from the project root)"
        )
    if path in _validating:
        return None
    _validating.add(path)
    try:
        cwd = str(Path.cwd())
        try:
            loaded = make_inventory(inventory, override_data=data or {}, cwd=cwd,
                                    group_data_directories=list(group_data))
        except (PyinfraError, CliError):
            raise  # pyinfra's own refusals (and ours) say what is wrong without a traceback
        except Exception as exc:  # a broken inventory or group_data file: say where, not how pyinfra got there
            raise InventorySettingsError(f"bad settings: {_load_error(exc, path)}") from None
        shown = display(Path(inventory)) if is_file else inventory
        settings = checked_settings(loaded, shown, cwd, group_data)
        # Before connecting: a worker left alone by --limit may not even answer (a new host key).
        refuse_cut_clusters(list(loaded), limited(loaded), settings)
        return lock.pinned(settings, shown if is_file else None, cwd)  # a lock that cannot be used: refused here
    except SettingsError as exc:
        raise InventorySettingsError(f"bad settings: {exc}") from None
    except lock.LockError as exc:
        raise InventorySettingsError(f"bad lock: {exc}") from None
    finally:
        _validating.discard(path)


def _known_as(inventory: str) -> str:
    """How an inventory is known to the checks: a file by its full path, else as given."""
    return str(Path(inventory).resolve()) if Path(inventory).is_file() else inventory


def _load_error(exc: Exception, inventory_file: str) -> str:
    """``<file>, line <n>: <what>`` of an error raised while pyinfra reads an inventory or group_data file."""
    if isinstance(exc, SyntaxError):
        return f"{display(Path(exc.filename or inventory_file))}, line {exc.lineno}: Python syntax: {exc.msg}"
    filename, line = inventory_file, None
    if isinstance(exc, UnexpectedExternalError):  # raised by the file's own code
        filename, exc = exc.filename, exc.exception
        for frame, lineno in traceback.walk_tb(exc.__traceback__):
            if frame.f_code.co_filename == filename:
                line = lineno
    where = f"{display(Path(filename))}, line {line}" if line else display(Path(filename))
    said = f"{where}: {type(exc).__name__}: {exc}"
    if isinstance(exc, ImportError):
        said += f" (pyinfra runs the file with {sys.executable}: install the module there, or correct the import)"
    return said
