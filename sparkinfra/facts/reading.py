"""
How facts are read: ``gathered`` (once per host and run, shared by greenlets), ``read_ahead``
(a deploy's declared reads in one ``Together`` command), ``at_once`` (one call per host in
parallel).
"""

from __future__ import annotations

import re
import secrets
import weakref

import gevent
from gevent.event import AsyncResult
from pyinfra.api import FactBase, StringCommand
from typing_extensions import override

_gathered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # state -> {key: AsyncResult}
_ahead: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # state -> {host name: {read: (cls, kwargs)}}
_ALONE = object()  # a read the batch could not answer: read it in a command of its own


def gathered(host, cls, **kwargs):
    """
    Returns ``host.get_fact(cls, **kwargs)``, gathered once for as long as no operation of this
    run has run a command on any host (a command on one node can change another: the head
    streams to the workers), and separately while pyinfra only detects changes. Hosts asking for
    the same fact at the same time (every worker reading the head's manifest) share one command:
    each would otherwise open its own SSH session on that host's one connection, and sshd
    refuses sessions past ``MaxSessions`` (10). Read facts before yielding a command.

    .. code:: python

        wanted = gathered(head, SnapshotManifest, repo_dir=repo_dir, deep=False)
    """
    state = host.state
    cache = _gathered.setdefault(state, {})
    generation = _generation(state)
    read = _read(cls, kwargs)
    key = (host.name, *read, state.current_stage, generation)
    if key not in cache and generation == 0:
        ahead = _ahead.get(state, {}).get(host.name, {})
        if read in ahead and (host.name, _ALONE, state.current_stage) not in cache:
            _read_together(host, ahead, cache, state.current_stage)
    if key not in cache:
        cache[key] = result = AsyncResult()
        try:
            result.set(host.get_fact(cls, **kwargs))
        except BaseException as e:
            del cache[key]
            result.set_exception(e)
            raise
    value = cache[key].get()
    return gathered(host, cls, **kwargs) if value is _ALONE else value


def read_ahead(host, reads) -> None:
    """
    Declares the facts ``host``'s operations will read through ``gathered`` in this run: the first
    of them read before any operation has run a command reads them all in one command (one SSH
    session, one sudo on the node) rather than one command each. A fact missing from the list,
    read later in the run, or that fails in the batch (its command missing, an error) is read
    in a command of its own, exactly as without this. Only cheap reads belong here.

    .. code:: python

        read_ahead(host, [(FabricLink, {"interface": "enp1s0f0np0"}), (NetworkConfigBackend, {})])
    """
    ahead = _ahead.setdefault(host.state, {}).setdefault(host.name, {})
    for cls, kwargs in reads:
        ahead[_read(cls, kwargs)] = (cls, kwargs)


def _read(cls, kwargs: dict) -> tuple:
    """A fact and its arguments as one key: ``gathered``'s cache and ``read_ahead``'s list agree on it."""
    return cls, repr(sorted(kwargs.items()))


def _read_together(host, ahead: dict, cache: dict, stage) -> None:
    """Reads every fact of ``ahead`` not read yet for ``stage`` with one ``Together`` command."""
    cache[(host.name, _ALONE, stage)] = True  # the first miss in this stage starts no other
    pending = {}
    for read, (cls, kwargs) in ahead.items():
        key = (host.name, *read, stage, 0)
        if key not in cache and _batchable(cls):
            cache[key] = AsyncResult()
            pending[key] = (cls, kwargs)
    if not pending:
        return
    reads = tuple((cls(), kwargs) for cls, kwargs in pending.values())  # one instance runs and reads
    parts = None
    try:
        parts = host.get_fact(Together, reads=reads)
    except Exception:  # each read on its own says what is wrong
        pass
    finally:  # whatever happened, no one waits for ever
        for i, (key, (fact, _)) in enumerate(zip(pending, reads)):
            value = _ALONE
            if parts and i < len(parts) and parts[i][0] == 0:
                try:
                    value = fact.process(parts[i][1]) if parts[i][1] else fact.default()
                except Exception:
                    value = _ALONE
            result = cache[key]
            if value is _ALONE:  # whoever waits on it reads it alone, in a fresh entry
                del cache[key]
            result.set(value)


def _batchable(cls) -> bool:
    """A fact ``Together`` can run as pyinfra would: in ``sh``, with no check of its own first."""
    return not cls.shell_executable and cls.check_preconditions is FactBase.check_preconditions


def gathered_each(hosts, cls, **kwargs) -> list:
    """
    Returns ``gathered(h, cls, **kwargs)`` for each of ``hosts``, in order, read from all of them
    at once rather than one round trip after the other.

    .. code:: python

        ids = gathered_each([spark2, spark3], DockerImageId, image="vllm-node:latest")
    """
    return at_once([(h, gathered, h, cls, kwargs) for h in hosts])


def at_once(calls: list) -> list:
    """
    Runs each ``(host, function, *args, kwargs)`` call in its own greenlet, with pyinfra's
    context set to that host as when it loads a deploy; returns the results in order.
    """
    jobs = [gevent.spawn(_as_host, h, function, *args, **kwargs) for h, function, *args, kwargs in calls]
    gevent.joinall(jobs, raise_error=True)
    return [job.value for job in jobs]


def unproxied(obj):
    """The object behind pyinfra's context proxy (``from pyinfra import host, state``): the proxy
    means nothing in a greenlet of one's own."""
    return obj._get_module() if hasattr(obj, "_get_module") else obj


def _as_host(h, function, *args, **kwargs):
    """``function(*args, **kwargs)`` with pyinfra's context set to host ``h``."""
    from pyinfra.context import ctx_config, ctx_host, ctx_state

    with ctx_state.use(h.state), ctx_config.use(h.state.config), ctx_host.use(h):
        return function(*args, **kwargs)


def _generation(state) -> int:
    """How many operations have run commands so far in this run, over all hosts."""
    return sum(
        1
        for ops in state.ops.values()
        for data in ops.values()
        if data.operation_meta.is_complete() and data.operation_meta.executed
    )


class Together(FactBase):
    """
    Returns the outputs of several facts' commands run in one command, each with its exit
    status, in order: ``[(0, ["line", …]), (127, [])]``; ``None`` if the output is cut short.
    A fact whose ``requires_command`` is missing exits 127. Used by ``read_ahead``.

    + reads: ``(fact, kwargs)`` pairs; read each output with the same fact instance (pyinfra's
      ``FileContents`` keeps what its command printed for a missing file)
    """

    @override
    def command(self, reads: tuple) -> StringCommand:
        nonce = secrets.token_hex(8)  # no fact's output holds it: it marks where each ends
        parts = []
        for i, (fact, kwargs) in enumerate(reads):
            command = _fact_command(fact.command, kwargs)
            requires = _fact_command(fact.requires_command, kwargs)
            end = f"echo {nonce} {i} $?"
            if requires:
                parts.append(StringCommand(f"if command -v {requires} >/dev/null 2>&1; then (", command,
                                           f"); else (exit 127); fi; {end}", _separator="\n"))
            else:
                parts.append(StringCommand("(", command, f"); {end}", _separator="\n"))
        return StringCommand(*parts, _separator="\n")

    @override
    def process(self, output):
        return split_together(output)


def split_together(lines) -> list | None:
    """``Together``'s output as ``[(status, lines), …]`` (see there)."""
    last = re.fullmatch(r".*?([0-9a-f]{16}) \d+ \d+", lines[-1]) if lines else None
    if not last:
        return None
    nonce, parts, current = last.group(1), [], []
    for line in lines:
        before, found, after = line.rpartition(nonce)
        end = re.fullmatch(r" (\d+) (\d+)", after) if found else None
        if end and int(end.group(1)) == len(parts):
            if before:  # the fact's last line had no newline
                current.append(before)
            parts.append((int(end.group(2)), current))
            current = []
        else:
            current.append(line)
    return parts


def _fact_command(attribute, kwargs: dict):
    """A fact's ``command`` or ``requires_command``, called with ``kwargs`` when it is a method."""
    return attribute(**kwargs) if callable(attribute) else attribute
