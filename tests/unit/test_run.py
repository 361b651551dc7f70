"""
``run.start``: pyinfra loads a deploy for every host at once, in greenlets; the run-level work
(settings, SSH tuning, the converge lock, preflight) happens once per run, the other hosts wait
for it, and an error there stops every host.
"""

from __future__ import annotations

from types import SimpleNamespace

import gevent
import pytest
from pyinfra.context import ctx_host, ctx_state

from sparkinfra import run


class Cluster:
    head = SimpleNamespace(name="spark-1")

    def node(self, name):
        return SimpleNamespace(name=name) if name != "spark-1" else self.head


@pytest.fixture
def calls(monkeypatch):
    calls = []
    cluster = Cluster()
    settings = SimpleNamespace(cluster_of=lambda name: cluster)
    monkeypatch.setattr(run, "_settings_of_run", lambda state: calls.append("settings") or settings)
    monkeypatch.setattr(run.ssh, "prompt_replies", lambda state: calls.append("ssh"))

    def hold(state, inventory, settings, dry=False):
        gevent.sleep(0.05)  # the network: every other host's load runs meanwhile
        calls.append("lock")

    monkeypatch.setattr(run.lock, "hold", hold)
    monkeypatch.setattr(run.preflight, "run", lambda state, settings: gevent.sleep(0.05) or calls.append("preflight"))
    return calls


class FakeState:
    """A run: what run.start keys its record by (and hands the lock: no inventory here)."""

    inventory = None


def new_state() -> FakeState:
    return FakeState()


def load_every_host(state, names, **kwargs):
    def load(name):
        with ctx_state.use(state), ctx_host.use(SimpleNamespace(name=name)):
            return run.start(**kwargs)

    jobs = [gevent.spawn(load, name) for name in names]
    gevent.joinall(jobs)
    return jobs


def test_the_run_level_work_happens_once_while_every_host_waits(calls):
    state = new_state()
    jobs = load_every_host(state, ["spark-1", "spark-2", "spark-3"], preflight_first=True)
    assert all(job.successful() for job in jobs), [job.exception for job in jobs]
    assert calls == ["settings", "ssh", "lock", "preflight"]
    assert [job.value.is_head for job in jobs] == [True, False, False]
    load_every_host(state, ["spark-1", "spark-2"])  # the next deploy file of the same run
    assert calls == ["settings", "ssh", "lock", "preflight"]
    load_every_host(new_state(), ["spark-1"])  # another run starts afresh
    assert calls[4:] == ["settings", "ssh", "lock"]


def test_an_error_of_the_run_level_work_stops_every_host(calls, monkeypatch):
    def busy(state, inventory, settings, dry=False):
        calls.append("lock")
        raise run.lock.ConvergeLocked("another converge holds the lock")

    monkeypatch.setattr(run.lock, "hold", busy)
    jobs = load_every_host(new_state(), ["spark-1", "spark-2"])
    assert calls.count("lock") == 1
    assert all(isinstance(job.exception, run.lock.ConvergeLocked) for job in jobs)
