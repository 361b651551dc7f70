"""
``run.start``: pyinfra loads a deploy for every host at once, in greenlets; the run-level work
(settings, whole clusters, SSH tuning, the converge lock, preflight) happens once per run, the
other hosts wait for it, and an error there stops every host. ``run.whole_clusters``: a
``--limit`` that covers part of a cluster is refused at once, naming the hosts to add.
"""

from __future__ import annotations

from types import SimpleNamespace

from pathlib import Path

import gevent
import pytest
from pyinfra.api import State
from pyinfra.context import ctx_host, ctx_state
from spark_cluster import load_inventory

from sparkinfra import run
from sparkinfra.run import InventorySettingsError

PAIRS = "inventory/sim_pairs.py"  # pair_a: spark-1 (head), spark-2; pair_b: spark-3 (head), spark-4


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
    monkeypatch.setattr(run, "whole_clusters", lambda state, settings: calls.append("whole_clusters"))
    monkeypatch.setattr(run, "in_run", lambda state: {"spark-1", "spark-2", "spark-3"})
    monkeypatch.setattr(run.ssh, "tune_connections", lambda state: calls.append("ssh"))
    monkeypatch.setattr(run.api_key, "say_open", lambda state, settings: calls.append("say_open"))

    def hold(state, inventory, settings, dry=False):
        gevent.sleep(0.05)  # the network: every other host's load runs meanwhile
        calls.append("lock")

    monkeypatch.setattr(run.converge_lock, "hold", hold)
    monkeypatch.setattr(run.lock, "settle", lambda state, settings, *args, **kwargs: calls.append("pins") or settings)
    monkeypatch.setattr(run.preflight, "run",
                        lambda state, settings, in_run: gevent.sleep(0.05) or calls.append("preflight"))
    return calls


class FakeState:
    """A run: what run.start keys its record by (and hands the lock: no inventory here)."""

    inventory = None
    cwd = "."


def new_state() -> FakeState:
    return FakeState()


def load_every_host(state, names, **kwargs):
    def load(name):
        with ctx_state.use(state), ctx_host.use(SimpleNamespace(name=name)):
            return run.start(**kwargs)

    before = ctx_state.get()
    jobs = [gevent.spawn(load, name) for name in names]
    gevent.joinall(jobs)
    ctx_state.set(before)  # pyinfra's ``use`` restores nothing when run.start raises
    return jobs


def test_the_run_level_work_happens_once_while_every_host_waits(calls):
    state = new_state()
    jobs = load_every_host(state, ["spark-1", "spark-2", "spark-3"], preflight_first=True)
    assert all(job.successful() for job in jobs), [job.exception for job in jobs]
    assert calls == ["settings", "whole_clusters", "ssh", "say_open", "lock", "pins", "preflight"]
    assert [job.value.is_head for job in jobs] == [True, False, False]
    load_every_host(state, ["spark-1", "spark-2"])  # the next deploy file of the same run
    assert calls == ["settings", "whole_clusters", "ssh", "say_open", "lock", "pins", "preflight"]
    load_every_host(new_state(), ["spark-1"])  # another run starts afresh
    assert calls[7:] == ["settings", "whole_clusters", "ssh", "say_open", "lock", "pins"]


def test_an_error_of_the_run_level_work_stops_every_host(calls, monkeypatch):
    def busy(state, inventory, settings, dry=False):
        calls.append("lock")
        raise run.converge_lock.ConvergeLocked("another converge holds the lock")

    monkeypatch.setattr(run.converge_lock, "hold", busy)
    jobs = load_every_host(new_state(), ["spark-1", "spark-2"])
    assert calls.count("lock") == 1
    assert all(isinstance(job.exception, run.converge_lock.ConvergeLocked) for job in jobs)


# --limit: whole clusters or none


def test_in_run_is_the_inventory_narrowed_by_the_limit():
    state, _ = load_inventory(PAIRS)
    assert run.in_run(state) == {"spark-1", "spark-2", "spark-3", "spark-4"}
    state, _ = load_inventory(PAIRS, ["spark-4", "spark-2"])
    assert run.in_run(state) == {"spark-2", "spark-4"}


@pytest.mark.parametrize("limit", [None, ["spark-1", "spark-2"], ["spark-4", "spark-3"]],
                         ids=["everything", "pair_a", "pair_b"])
def test_whole_clusters_pass_and_a_cluster_left_out_entirely_is_fine(limit):
    state, settings = load_inventory(PAIRS, limit)
    run.whole_clusters(state, settings)


def test_a_limit_covering_part_of_a_cluster_is_refused_naming_the_hosts_to_add():
    state, settings = load_inventory(PAIRS, ["spark-2"])
    with pytest.raises(InventorySettingsError) as refused:
        run.whole_clusters(state, settings)
    assert str(refused.value) == (
        "--limit leaves out spark-1 of cluster pair_a: a run converges whole clusters (the head streams the "
        "image, reads the manifest and pins the mesh keys of every node); add them: --limit spark-1 --limit spark-2; "
        "nothing was changed"
    )


def test_every_cluster_cut_is_named_and_the_limit_to_give_covers_them_all():
    state, settings = load_inventory(PAIRS, ["spark-3", "spark-2"])
    with pytest.raises(InventorySettingsError) as refused:
        run.whole_clusters(state, settings)
    message = str(refused.value)
    assert message.startswith("--limit leaves out spark-1 of cluster pair_a and spark-4 of cluster pair_b: ")
    assert message.endswith("; add them: --limit spark-1 --limit spark-2 --limit spark-3 --limit spark-4; nothing was changed")


def test_run_start_refuses_a_partial_limit_before_touching_any_host(monkeypatch):
    state, settings = load_inventory(PAIRS, ["spark-2"])
    touched = []
    monkeypatch.setattr(run, "_settings_of_run", lambda state: settings)
    monkeypatch.setattr(run.ssh, "tune_connections", lambda state: touched.append("ssh"))
    monkeypatch.setattr(run.converge_lock, "hold", lambda *args, **kwargs: touched.append("lock"))
    monkeypatch.setattr(run.preflight, "run", lambda state, settings, in_run: touched.append("preflight"))
    jobs = load_every_host(state, ["spark-2"], preflight_first=True)
    assert isinstance(jobs[0].exception, InventorySettingsError)
    assert "--limit leaves out spark-1 of cluster pair_a" in str(jobs[0].exception)
    assert touched == []


@pytest.mark.parametrize(("params", "names"), [
    ({}, {"spark-1", "spark-2", "spark-3", "spark-4"}),
    ({"limit": ("spark-2",)}, {"spark-2"}),
    ({"limit": ("spark-[12]",), "exclude": ("spark-1",)}, {"spark-2"}),  # pyinfra's own patterns
    ({"limit": ("no-such-host",)}, set()),  # pyinfra's CLI then says no host is left
    ({"limit": ("pair_b",)}, {"spark-3", "spark-4"}),  # a group's name: its hosts
    ({"exclude": ("pair_a", "spark-4")}, {"spark-3"}),
])
def test_the_limit_is_read_while_the_inventory_loads(monkeypatch, params, names):
    """Before any connection (a worker alone in a run may not even answer): the CLI's --limit,
    matched as pyinfra matches it."""
    state, _ = load_inventory(PAIRS)
    monkeypatch.setattr(run, "cli_params", lambda: params)
    assert run.limited(state.inventory) == names


def test_validate_inventory_refuses_a_partial_limit_before_connecting(monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    monkeypatch.setattr(run, "cli_params", lambda: {"limit": ("spark-2",)})
    before = ctx_state.get()
    try:
        with ctx_state.use(State()), pytest.raises(InventorySettingsError, match="--limit leaves out spark-1 of "):
            run.validate_inventory(PAIRS)
    finally:
        ctx_state.set(before)  # pyinfra's ``use`` restores nothing when its body raises


def test_the_command_line_check_covers_the_inventory_once(monkeypatch):
    """config.py's check builds the command's inventory; the inventory's own last line
    (``validate_inventory``), executed when pyinfra loads it next, has nothing left to do."""
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    monkeypatch.setattr(run, "_checked", set())
    monkeypatch.setattr(run, "cli_params", lambda: {"inventory": "inventory/pair.py", "data": ()})
    with ctx_state.use(State()):
        assert run.check_command_line().clusters["pair"].head.name == "bluey"
        assert run.validate_inventory("inventory/pair.py") is None


def test_the_command_line_check_refuses_bad_data(monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    monkeypatch.setattr(run, "_checked", set())
    monkeypatch.setattr(run, "cli_params", lambda: {"inventory": "inventory/pair.py", "data": ("fabric_mtu=70000",)})
    before = ctx_state.get()
    try:
        with ctx_state.use(State()), pytest.raises(InventorySettingsError) as refused:
            run.check_command_line()
    finally:
        ctx_state.set(before)
    assert str(refused.value).startswith("bad settings: --data, key 'fabric_mtu' (host bluey): must be 9216 or less")
    assert not run._checked


def test_the_command_line_check_outside_pyinfra_does_nothing():
    assert run.check_command_line() is None
