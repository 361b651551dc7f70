"""
How facts are read: ``gathered`` (once per host and run, shared by greenlets), ``at_once`` (one
call per host in parallel).
"""

from __future__ import annotations

import weakref

import gevent
from gevent.event import AsyncResult

_gathered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # state -> {key: AsyncResult}


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
    key = (host.name, cls, repr(sorted(kwargs.items())), state.current_stage, generation)
    if key not in cache:
        cache[key] = result = AsyncResult()
        try:
            result.set(host.get_fact(cls, **kwargs))
        except BaseException as e:
            del cache[key]
            result.set_exception(e)
            raise
    return cache[key].get()


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
