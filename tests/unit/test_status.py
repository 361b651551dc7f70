"""
``python -m sparkinfra status``: what it finds wrong from the nodes' reports (``problems``), how it
reads a node's report (``node_view``), what it prints (``text``, ``--json``), and the node side
(``scripts/node_report.py``), all without a node: the reports are shaped as ``report()`` returns
them, and the remote calls are monkeypatched.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import http.server
import importlib.util
import json
import os
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from gb10 import table, v4

from sparkinfra import remote, scripts, transfer
from sparkinfra.cli import status
from sparkinfra.run import load_files

from spark_cluster import load_cluster

IMAGE_ID = "sha256:" + "a" * 64
OTHER_IMAGE_ID = "sha256:" + "b" * 64
SNAPSHOT = "c" * 64
AT = 1796551200  # 2026-12-06 10:00:00 UTC
NCCL_LINE = "(VllmWorker rank=0 pid=77) spark-1:77:77 [0] NCCL INFO NCCL version 2.30.7+cuda13.0"
API_OK = {"url": "http://10.213.0.11:8000", "health": 200, "completion": "ok", "seconds": 0.42}
API_DOWN = {"url": "http://10.213.0.11:8000", "health": "no answer ([Errno 111] Connection refused)",
            "completion": None, "seconds": None}
HISTORY = [
    {"at": AT, "event": "start", "why": "converge: plan changed", "boot": "b1", "digest": "x"},
    {"at": AT + 40, "event": "ready", "why": "API answered", "boot": "b1", "digest": "x", "seconds": 40},
    {"at": AT + 100, "event": "stop", "why": "asked: lane stop", "boot": "b1", "digest": "x"},
]


@pytest.fixture(scope="module")
def sim():
    """The bed's pair (inventory/sim.py): spark-1 head, spark-2 worker, lane sim."""
    _, settings = load_files("inventory/sim.py", ["lock_file=tests/unit/fixtures/none.lock.yaml"])  # no bed lock
    [cluster] = settings.clusters.values()
    return SimpleNamespace(cluster=cluster, settings=settings, want=status.expected(cluster))


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _repo(sim) -> str:
    return json.loads(status.node_query(sim.cluster, "sim", sim.want.image))["repos"][0]


PIN_SHA = "a" * 64


def _rows(netdev: str, *gids: str) -> list[dict]:
    return table(netdev, *gids, link_local="fe80:0000:0000:0000:0000:0000:0000:0001")


def gb10_rdma(rank: int, twin_gids: tuple[str, ...] | None = None, twin_mtu: int = 4200) -> list[dict]:
    """A GB10's four RDMA devices as node_report.py reads them: the cabled port's twins up, each with
    its own IPv4 at row 3 (the fabric IP; the twin's link-local one), the f1 port down."""
    def link(up, mtu, *addresses):
        return {"present": True, "operstate": "up" if up else "down", "carrier": up, "mtu": mtu, "addresses": list(addresses)}
    ip, twin = f"10.213.1.{rank + 1}", f"169.254.1.{rank + 1}"
    return [
        {"device": "roceP2p1s0f0", "port": 1, "netdev": "enP2p1s0f0np0", "state": "ACTIVE",
         "gids": _rows("enP2p1s0f0np0", *(twin_gids if twin_gids is not None else (v4(twin),))),
         "link": link(True, twin_mtu, f"{twin}/16")},
        {"device": "roceP2p1s0f1", "port": 1, "netdev": "enP2p1s0f1np1", "state": "DOWN",
         "gids": _rows("enP2p1s0f1np1"), "link": link(False, 1500)},
        {"device": "rocep1s0f0", "port": 1, "netdev": "enp1s0f0np0", "state": "ACTIVE",
         "gids": _rows("enp1s0f0np0", v4(ip)), "link": link(True, 4200, f"{ip}/24")},
        {"device": "rocep1s0f1", "port": 1, "netdev": "enp1s0f1np1", "state": "DOWN",
         "gids": _rows("enp1s0f1np1"), "link": link(False, 1500)},
    ]


def _report(sim, rank: int, **over) -> dict:
    """A node serving the lane, as ``node_report.py``'s ``report()`` says it (``over``: keys replaced)."""
    digest = sim.want.digest
    found = {
        "unit": {"loaded": True, "active": "active", "sub": "running", "enabled": "enabled", "since": AT,
                 "invocation": f"inv{rank}", "restarts": 0},
        "other_units": [],
        "plan": {"digest": digest, "rank": rank},
        "started": {"digest": digest, "at": AT},
        "container": {"running": True, "started_at": "2026-12-06T10:00:01.123456789Z", "image": IMAGE_ID},
        "image_id": IMAGE_ID,
        "manifests": {_repo(sim): SNAPSHOT},
        "fabric": {"present": True, "operstate": "up", "carrier": True, "mtu": 4200,
                   "addresses": [f"10.213.1.{rank + 1}/24"]},
        "gid_index": "3",
        "nccl_hcas": "rocep1s0f0,roceP2p1s0f0",
        "rdma": gb10_rdma(rank),
        "pin": {"sha256": PIN_SHA, "record": {"sha256": PIN_SHA, "build_id": "b" * 40, "version": "2.30.7"}},
        "live_nccl": {"pin": None,
                      "processes": [{"pid": 7, "cmd": "python3 -m vllm.entrypoints.openai.api_server",
                                     "path": "/opt/nccl/lib/libnccl.so.2", "sha256": PIN_SHA, "build_id": "b" * 40}]},
        "nccl_lines": ["NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE", NCCL_LINE],
        "history": copy.deepcopy(HISTORY) if rank == 0 else [],
        "known_good": [],
        "rejected": None,
        "docker": True,
        "probe": [],
    }
    found.update(over)
    return found


def _torn_down(sim, rank: int) -> dict:
    """After ``lane stop``: the unit inactive, no container, no started mark (``/run`` marks go)."""
    return _report(sim, rank, unit={"loaded": True, "active": "inactive", "sub": "dead", "enabled": "enabled",
                                    "since": None, "invocation": "", "restarts": 0},
                   container=None, started=None, nccl_lines=[])


def _views(sim, head: dict, worker: dict, want=None, cluster=None) -> list[dict]:
    cluster = cluster or sim.cluster
    reports = {cluster.head.name: head, cluster.nodes[1].name: worker}
    return [status.node_view(node, reports[node.name], head, want or sim.want, cluster.fabric) for node in cluster.nodes]


def _problems(sim, head=None, worker=None, api=API_OK) -> list[str]:
    head = head if head is not None else _report(sim, 0)
    worker = worker if worker is not None else _report(sim, 1)
    return status.problems(sim.cluster, sim.want, _views(sim, head, worker), api)


# expected(): what the settings name
# ----------------------------------


def test_the_sim_settings_name_lane_sim(sim):
    assert sim.cluster.head.name == "spark-1" and [n.rank for n in sim.cluster.nodes] == [0, 1]
    assert sim.want.lane.name == "sim" and sim.want.api_port == 8000
    assert len(sim.want.digest) == 16 and sim.want.image.startswith("sparkinfra/sparkbed-lane:")


def test_no_lane_named_expects_nothing(tmp_path):
    assert status.expected(load_cluster(tmp_path)) == status.Expected(None)


# problems()
# ----------


def test_a_serving_cluster_has_no_problems(sim):
    assert _problems(sim) == []


def test_torn_down_names_each_node_and_the_api(sim):
    found = _problems(sim, _torn_down(sim, 0), _torn_down(sim, 1), API_DOWN)
    assert found == [
        "spark-1 (rank 0): sparkinfra-lane-sim.service is inactive/dead",
        "spark-2 (rank 1): sparkinfra-lane-sim.service is inactive/dead",
        "API http://10.213.0.11:8000: /health no answer ([Errno 111] Connection refused)",
    ]


def test_a_unit_not_installed(sim):
    worker = _report(sim, 1, unit={"loaded": False, "active": "inactive", "sub": "dead", "enabled": "",
                                   "since": None, "invocation": "", "restarts": 0})
    assert _problems(sim, worker=worker) == [
        "spark-2 (rank 1): sparkinfra-lane-sim.service is not installed (a converge places it)"]


@pytest.mark.parametrize("answer", [{"unreachable": "not reachable (timed out)"},
                                    {"error": "not reachable (timed out)"}])
def test_a_node_not_reached_is_named_with_its_reason(sim, answer):
    views = _views(sim, _report(sim, 0), answer)
    assert views[1] == {"name": "spark-2", "rank": 1, "reached": False, "why": "not reachable (timed out)"}
    assert status.problems(sim.cluster, sim.want, views, API_OK) == [
        "spark-2 (rank 1) not reached: not reachable (timed out)"]


def test_a_plan_that_differs_from_what_the_settings_render(sim):
    worker = _report(sim, 1, plan={"digest": "0123456789abcdef", "rank": 1})
    assert _problems(sim, worker=worker) == [
        f"spark-2 (rank 1): its plan is 0123456789abcdef, the settings render {sim.want.digest} "
        "(a converge places it)"]
    assert _problems(sim, worker=_report(sim, 1, plan=None)) == [
        f"spark-2 (rank 1): its plan is missing, the settings render {sim.want.digest} (a converge places it)"]


def test_a_lane_started_from_another_plan(sim):
    head = _report(sim, 0, started={"digest": "fedcba9876543210", "at": AT})
    assert _problems(sim, head=head) == [
        f"spark-1 (rank 0): the lane runs plan fedcba9876543210, not {sim.want.digest} (a converge restarts it)"]
    assert _problems(sim, head=_report(sim, 0, started=None)) == [
        f"spark-1 (rank 0): the lane runs plan (unknown), not {sim.want.digest} (a converge restarts it)"]


def test_an_active_unit_without_its_container(sim):
    assert _problems(sim, worker=_report(sim, 1, container=None)) == [
        "spark-2 (rank 1): its container vllm_node is not running"]


def test_a_worker_image_other_than_the_heads(sim):
    worker = _report(sim, 1, image_id=OTHER_IMAGE_ID)
    assert _problems(sim, worker=worker) == [
        f"spark-2 (rank 1): image {sim.want.image} is {OTHER_IMAGE_ID}, not the head's"]
    assert _problems(sim, worker=_report(sim, 1, image_id=None)) == [
        f"spark-2 (rank 1): image {sim.want.image} is missing, not the head's"]


def test_a_worker_whose_docker_daemon_does_not_answer_is_told_so_not_as_a_missing_image(sim, monkeypatch):
    down = _report(sim, 1, image_id=None, container=None, docker=False)
    assert _problems(sim, worker=down) == [
        "spark-2 (rank 1): the Docker daemon does not answer (systemctl status docker): no lane container can run, "
        "no image can be read"]
    shown = status.text(_status(sim, monkeypatch, {"spark-1": _report(sim, 0), "spark-2": down}))
    assert _row(shown, "spark-2").split()[4:6] == ["no", "dockerd"]


@pytest.mark.parametrize("digest", ["d" * 64, None])
def test_a_worker_snapshot_other_than_the_heads(sim, digest):
    worker = _report(sim, 1, manifests={_repo(sim): digest})
    assert _problems(sim, worker=worker) == [
        "spark-2 (rank 1): snapshot models--sparkbed--tiny-llama does not match the head's manifest"]


def test_an_nccl_version_other_than_the_pin(sim):
    assert sim.cluster.config.nccl_version == "2.30.7"
    worker = _report(sim, 1, nccl_lines=["spark-2:9:9 [0] NCCL INFO NCCL version 2.27.3+cuda12.9"])
    assert _problems(sim, worker=worker) == ["spark-2 (rank 1): NCCL 2.27.3 started, the pin is 2.30.7"]
    assert _problems(sim, worker=_report(sim, 1, nccl_lines=[])) == []  # not reported yet: nothing to say


@pytest.mark.parametrize("operstate, mtu", [("down", 4200), ("up", 1500)])
def test_a_fabric_port_down_or_with_another_mtu(sim, operstate, mtu):
    fabric = {"present": True, "operstate": operstate, "carrier": operstate == "up", "mtu": mtu, "addresses": []}
    assert _problems(sim, worker=_report(sim, 1, fabric=fabric)) == [
        f"spark-2 (rank 1): fabric enp1s0f0np0 is {operstate}, MTU {mtu} (the settings: up, MTU 4200)"]


def test_a_fabric_port_absent(sim):
    assert _problems(sim, head=_report(sim, 0, fabric={"present": False})) == [
        "spark-1 (rank 0): no fabric port enp1s0f0np0"]


def test_another_lanes_unit_running(sim):
    worker = _report(sim, 1, other_units=["sparkinfra-lane-sim-b.service"])
    assert _problems(sim, worker=worker) == [
        "spark-2 (rank 1): another lane's unit runs (sparkinfra-lane-sim-b.service)"]


def test_an_api_that_answers_health_but_not_a_completion(sim):
    api = {**API_OK, "completion": "HTTP 500", "seconds": None}
    assert _problems(sim, api=api) == ["API http://10.213.0.11:8000: a one-token completion HTTP 500"]
    assert _problems(sim, api={**API_OK, "health": 503}) == ["API http://10.213.0.11:8000: /health 503"]


def _idle(rank: int, **over) -> dict:
    """A node of a cluster that names no lane (node_query with no lane paths)."""
    found = {"unit": {"loaded": False}, "other_units": [], "plan": None, "started": None, "container": None,
             "image_id": None, "manifests": {}, "fabric": {"present": True, "operstate": "up", "carrier": True,
                                                           "mtu": 4200, "addresses": []},
             "gid_index": None, "nccl_lines": [], "history": [], "known_good": [], "docker": True}
    found.update(over)
    return found


def test_no_lane_named_no_problems_unless_another_lane_runs(sim, tmp_path):
    pair = load_cluster(tmp_path)
    want = status.expected(pair)
    views = _views(sim, _idle(0), _idle(1), want, pair)
    assert status.problems(pair, want, views, None) == []
    views = _views(sim, _idle(0), _idle(1, other_units=["sparkinfra-lane-sim.service"]), want, pair)
    assert status.problems(pair, want, views, None) == [
        "reddie (rank 1): another lane's unit runs (sparkinfra-lane-sim.service)"]


# node_view()
# -----------


@pytest.mark.parametrize("lines, version", [
    ([NCCL_LINE], "2.30.7"),
    (["NCCL INFO NCCL version 2.28.9"], "2.28.9"),
    (["NCCL INFO NCCL version 2.27.3+cuda12.9", "NCCL INFO Using network IB", NCCL_LINE], "2.30.7"),  # the last
    (["NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE"], None),
    ([], None),
])
def test_the_nccl_version_is_read_from_the_lanes_log(sim, lines, version):
    head = _report(sim, 0, nccl_lines=lines)
    assert status.node_view(sim.cluster.head, head, head, sim.want)["nccl_version"] == version


def test_a_node_view(sim):
    head, worker = _report(sim, 0), _report(sim, 1, manifests={_repo(sim): "d" * 64}, image_id=None)
    head_view, worker_view = _views(sim, head, worker)
    assert head_view == {
        "name": "spark-1", "rank": 0, "reached": True, "unit": "active/running", "unit_since": AT,
        "plan": sim.want.digest, "started": sim.want.digest,
        "container": {"running": True, "since": "2026-12-06T10:00:01.123456789Z"},
        "docker": True, "image_id": IMAGE_ID, "image_matches_head": True,
        "snapshots_match_head": {"models--sparkbed--tiny-llama": True},
        "fabric": head["fabric"], "gid_index": "3", "nccl_version": "2.30.7", "other_lanes": [],
        "twins": [{"device": "rocep1s0f0", "netdev": "enp1s0f0np0", "row": "3", "mtu": 4200, "operstate": "up",
                   "addresses": ["10.213.1.1/24"]},
                  {"device": "roceP2p1s0f0", "netdev": "enP2p1s0f0np0", "row": "3", "mtu": 4200, "operstate": "up",
                   "addresses": ["169.254.1.1/16"]}],
        "twin_problems": [], "pin": head["pin"], "live_nccl": head["live_nccl"], "drift": [], "drift_since": None,
    }
    assert worker_view["image_matches_head"] is False and worker_view["image_id"] is None
    assert worker_view["snapshots_match_head"] == {"models--sparkbed--tiny-llama": False}
    torn = status.node_view(sim.cluster.head, _torn_down(sim, 0), head, sim.want)
    assert torn["unit"] == "inactive/dead" and torn["container"] is None and torn["started"] is None


def test_the_twins_are_checked_by_the_rule_prepare_uses(sim):
    """A twin left at MTU 1500, a twin holding a fabric address, a twin whose row at the env's index
    is not IPv4: each named, with the twin."""
    head = _report(sim, 0)
    rdma = gb10_rdma(1, twin_mtu=1500)
    assert "spark-2 (rank 1): enP2p1s0f0np0 (roceP2p1s0f0) is up, MTU 1500 (the settings: up, MTU 4200)" in \
        _problems(sim, head, _report(sim, 1, rdma=rdma))
    rdma = gb10_rdma(1)
    rdma[0]["link"]["addresses"].append("10.213.1.102/24")
    assert ("spark-2 (rank 1): twin enP2p1s0f0np0 holds 10.213.1.102/24 of the fabric subnet 10.213.1.0/24"
            in _problems(sim, head, _report(sim, 1, rdma=rdma)))
    ra = "fd00:0213:0001:0000:0000:0000:0000:0002"
    moved = _report(sim, 1, rdma=gb10_rdma(1, twin_gids=(ra, v4("169.254.1.2"))))
    assert (f"spark-2 (rank 1): roceP2p1s0f0 (enP2p1s0f0np0): row 3 is {ra} (RoCE v2), not an IPv4 RoCE v2 GID"
            in _problems(sim, head, moved))
    moved["gid_index"] = None  # where the twins' rows differ prepare leaves the index to NCCL: then right
    assert _problems(sim, head, moved) == []


def test_a_pin_of_another_build_and_a_rank_that_mapped_another_nccl_are_named(sim):
    head = _report(sim, 0)
    other = {"sha256": "c" * 64, "record": {"sha256": "c" * 64}}
    assert ("spark-2 (rank 1): /opt/nccl/lib/libnccl.so.2 is another build than the head's "
            f"(sha256 {'c' * 12}, the head's {'a' * 12})") in _problems(sim, head, _report(sim, 1, pin=other))
    live = copy.deepcopy(head["live_nccl"])
    live["processes"][0].update(path="/usr/lib/x86_64-linux-gnu/libnccl.so.2", sha256="d" * 64, build_id="e" * 40)
    found = _problems(sim, head, _report(sim, 1, live_nccl=live))
    assert ("spark-2 (rank 1): pid 7 (python3 -m vllm.entrypoints.openai.api_server) mapped "
            f"/usr/lib/x86_64-linux-gnu/libnccl.so.2, build-id {'e' * 12} sha256 {'d' * 12}, not the pin "
            f"/opt/nccl/lib/libnccl.so.2 (build-id {'b' * 12} sha256 {'a' * 12})") in found


def test_no_image_anywhere_is_no_match(sim):
    head = _report(sim, 0, image_id=None)
    assert status.node_view(sim.cluster.nodes[1], _report(sim, 1, image_id=None), head,
                            sim.want)["image_matches_head"] is False


# text() and cluster_status()
# ---------------------------


def _status(sim, monkeypatch, reports: dict, api=API_OK, unreachable=None) -> dict:
    """``cluster_status`` with the nodes' answers ``reports`` (by node name) and the API's ``api``."""
    asked = []

    def node_report(host, query):
        asked.append(json.loads(query))
        return reports[host]

    monkeypatch.setattr(status, "node_report", node_report)
    monkeypatch.setattr(status, "api_state", lambda cluster, want: api)
    hosts = {n.name: n.name for n in sim.cluster.nodes if n.name not in (unreachable or {})}
    found = status.cluster_status(remote.Reached(sim.cluster, hosts, dict(unreachable or {})))
    assert len(asked) == len(hosts)
    assert all(q["lane"]["unit"] == "sparkinfra-lane-sim.service" and q["image"] == sim.want.image for q in asked)
    return found


def _row(text: str, node: str) -> str:
    [row] = [line for line in text.splitlines() if line.startswith(f"  {node} ")]
    return row


def test_text_of_a_serving_cluster(sim, monkeypatch, utc):
    found = _status(sim, monkeypatch, {"spark-1": _report(sim, 0), "spark-2": _report(sim, 1)})
    assert found["serving"] and found["ok"] and found["problems"] == []
    shown = status.text(found)
    lines = shown.splitlines()
    assert lines[0] == f"cluster sim: lane sim, plan {sim.want.digest}: serving"
    revision = sim.cluster.config.model_revision  # the lock's pin where the bed's lock holds one
    assert lines[1].startswith(f"  models: sparkbed/tiny-llama@{revision}")
    assert lines[2] == "  API http://10.213.0.11:8000: /health 200, a one-token completion in 0.42s"
    assert lines[3].split() == ["node", "rank", "unit", "container", "up", "since", "image", "snapshots", "fabric",
                                "GID", "NCCL"]
    assert _row(shown, "spark-1").split() == ["spark-1", "0", "active/running", "2026-12-06", "10:00:01",
                                              "a" * 12, "match", "up", "4200", "10.213.1.1/24", "rocep1s0f0:3",
                                              "roceP2p1s0f0:3", "2.30.7", "pin", "a" * 12]
    assert _row(shown, "spark-2").split()[:7] == ["spark-2", "1", "active/running", "2026-12-06", "10:00:01",
                                                  "a" * 12, "match"]
    assert lines[-4:] == [
        "  last starts and stops:",
        "    2026-12-06 10:00:00  start  converge: plan changed",
        "    2026-12-06 10:00:40  ready  API answered after 40s",
        "    2026-12-06 10:01:40  stop   asked: lane stop",
    ]


def test_text_of_a_cluster_not_serving(sim, monkeypatch, utc):
    worker = _report(sim, 1, image_id=OTHER_IMAGE_ID, manifests={_repo(sim): None})
    found = _status(sim, monkeypatch, {"spark-1": _torn_down(sim, 0), "spark-2": worker}, API_DOWN)
    assert not found["serving"] and not found["ok"]
    shown = status.text(found)
    assert shown.splitlines()[0] == f"cluster sim: lane sim, plan {sim.want.digest}: NOT serving what its settings name"
    assert "  API http://10.213.0.11:8000: /health no answer ([Errno 111] Connection refused)" in shown.splitlines()
    assert _row(shown, "spark-1").split()[:4] == ["spark-1", "0", "inactive/dead", "-"]
    assert _row(shown, "spark-2").split()[5:8] == ["b" * 12, "≠head", "DIFFER"]
    for problem in found["problems"]:
        assert f"  - {problem}" in shown.splitlines()
    assert "  - spark-1 (rank 0): sparkinfra-lane-sim.service is inactive/dead" in shown.splitlines()
    assert "    2026-12-06 10:01:40  stop   asked: lane stop" in shown.splitlines()


def test_text_of_a_node_not_reached(sim, monkeypatch):
    found = _status(sim, monkeypatch, {"spark-1": _report(sim, 0)}, unreachable={"spark-2": "not reachable (timed out)"})
    shown = status.text(found)
    assert _row(shown, "spark-2").split() == ["spark-2", "1", "not", "reached"]
    assert "  - spark-2 (rank 1) not reached: not reachable (timed out)" in shown.splitlines()


def test_text_names_a_missing_image(sim, monkeypatch):
    """A node without the lane's image says so in its image column (not an empty cell)."""
    found = _status(sim, monkeypatch, {"spark-1": _report(sim, 0, image_id=None), "spark-2": _report(sim, 1, image_id=None)})
    shown = status.text(found)
    assert _row(shown, "spark-1").split()[5] == "missing"
    assert _row(shown, "spark-2").split()[5:7] == ["missing", "≠head"]


def test_the_history_shown_is_the_heads_last_events(sim, monkeypatch):
    events = [{"at": AT + i, "event": "start", "why": f"start {i}"} for i in range(8)]
    found = _status(sim, monkeypatch, {"spark-1": _report(sim, 0, history=events), "spark-2": _report(sim, 1)})
    assert found["history"] == events[-status.HISTORY_SHOWN:]


def test_text_of_a_cluster_that_names_no_lane(tmp_path):
    pair = load_cluster(tmp_path)
    want = status.expected(pair)
    views = _views(None, _idle(0), _idle(1), want, pair)
    found = {"cluster": "pair", "lane": None, "digest": None, "serving": False, "ok": True, "problems": [],
             "api": None, "nodes": views, "history": []}
    shown = status.text(found).splitlines()
    assert shown[0] == "cluster pair: no lane: no lane named (settings: lane)"
    assert [line.split()[:3] for line in shown[2:]] == [["bluey", "0", "absent"], ["reddie", "1", "absent"]]


# api_state(): against a server on 127.0.0.1
# ------------------------------------------


class _Api(http.server.BaseHTTPRequestHandler):
    asked: list = []

    def do_GET(self):  # noqa: N802
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).asked.append((self.path, body, self.headers.get("Authorization")))
        reply = json.dumps({"choices": [{"message": {"content": "p"}}], "usage": {"completion_tokens": 1}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def _api_config(**over):
    return SimpleNamespace(**{"api_key_env": "", "api_open": False, "lane_liveness_interval": 10,
                              "lane_liveness_timeout": 1, **over})


class _Wedged(_Api):
    def do_POST(self):  # noqa: N802
        time.sleep(3)  # frozen engine: /health answers, no token comes


def test_a_wedged_api_is_told_within_the_watchs_own_timeout(sim):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Wedged)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    cluster = SimpleNamespace(name="sim", head=SimpleNamespace(ssh_host="127.0.0.1"), config=_api_config())
    try:
        found = status.api_state(cluster, status.Expected(sim.want.lane, "d", "i", server.server_port))
    finally:
        server.shutdown()
        server.server_close()
    assert found["health"] == 200 and found["seconds"] < 2.5  # lane_liveness_timeout: 1 s
    assert found["completion"] == ("wedged: no token in 1s while /health answers (the head's watch restarts the "
                                   "lane within 22s of it)") and found["wedge_bound"] == 22


def test_api_state_health_and_one_token(sim, monkeypatch):
    server = http.server.HTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    monkeypatch.setenv("MY_KEY", "sk-test")
    cluster = SimpleNamespace(name="sim", head=SimpleNamespace(ssh_host="127.0.0.1"), config=_api_config(api_key_env="MY_KEY"))
    want = status.Expected(sim.want.lane, sim.want.digest, sim.want.image, server.server_port, sim.want.served_name)
    try:
        found = status.api_state(cluster, want)
    finally:
        server.shutdown()
        server.server_close()
    assert found["url"] == f"http://127.0.0.1:{server.server_port}"
    assert found["health"] == 200 and found["completion"] == "ok" and isinstance(found["seconds"], float)
    [(path, body, auth)] = _Api.asked
    assert path == "/v1/chat/completions" and body["model"] == "tiny" and body["max_tokens"] == 1
    assert auth == "Bearer sk-test"


def test_api_state_of_a_port_nobody_listens_on(sim):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = SimpleNamespace(name="sim", head=SimpleNamespace(ssh_host="127.0.0.1"), config=_api_config())
    found = status.api_state(cluster, status.Expected(sim.want.lane, "d", "i", port))
    assert str(found["health"]).startswith("no answer (") and found["completion"] is None
    assert found["seconds"] is None


# main()
# ------


@pytest.fixture
def offline(sim, monkeypatch):
    """status.main with the settings already read and every remote call answered here."""
    reports = {"spark-1": _report(sim, 0), "spark-2": _report(sim, 1)}
    unreachable = {}
    monkeypatch.setattr(remote, "settings_of", lambda inventory, data: (None, sim.settings))

    def connect(inventory, clusters):
        return [remote.Reached(c, {n.name: n.name for n in c.nodes if n.name not in unreachable}, dict(unreachable))
                for c in clusters]

    monkeypatch.setattr(remote, "connect", connect)
    monkeypatch.setattr(status, "node_report", lambda host, query: reports[host])
    monkeypatch.setattr(status, "api_state", lambda cluster, want: API_OK)
    return SimpleNamespace(reports=reports, unreachable=unreachable)


def _json_out(capsys) -> dict:
    out = capsys.readouterr().out
    found = json.loads(out)
    assert json.dumps(found, indent=2, sort_keys=True) == out.rstrip("\n")  # what it prints round-trips
    return found


def test_main_json_of_a_serving_cluster(offline, capsys, sim):
    assert status.main(["inventory/sim.py", "--json"]) == 0
    found = _json_out(capsys)
    assert found["ok"] is True and [c["cluster"] for c in found["clusters"]] == ["sim"]
    [cluster] = found["clusters"]
    assert cluster["serving"] is True and cluster["lane"] == "sim" and cluster["digest"] == sim.want.digest
    assert [n["name"] for n in cluster["nodes"]] == ["spark-1", "spark-2"] and cluster["api"] == API_OK


def test_main_json_of_a_cluster_not_serving(offline, capsys, sim):
    offline.reports["spark-1"] = _torn_down(sim, 0)
    offline.unreachable["spark-2"] = "not reachable (timed out)"
    assert status.main(["inventory/sim.py", "--json", "--cluster", "sim"]) == 1
    [cluster] = _json_out(capsys)["clusters"]
    assert cluster["ok"] is False and cluster["serving"] is False
    assert cluster["problems"] == ["spark-1 (rank 0): sparkinfra-lane-sim.service is inactive/dead",
                                   "spark-2 (rank 1) not reached: not reachable (timed out)"]


def test_main_prints_text_without_json(offline, capsys, sim):
    assert status.main(["inventory/sim.py"]) == 0
    assert capsys.readouterr().out.startswith(f"cluster sim: lane sim, plan {sim.want.digest}: serving\n")



def test_main_an_unknown_cluster(nothing_connects, monkeypatch, capsys):
    assert status.main(["inventory/sim.py", "--cluster", "nope"]) == 2
    assert capsys.readouterr().err == "sparkinfra status: no cluster 'nope' in the inventory (it has: sim)\n"


def test_main_a_bad_inventory_path(nothing_connects, monkeypatch, capsys):
    assert status.main(["inventory/no-such-inventory.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparkinfra status: ") and "inventory/no-such-inventory.py" in err


def test_main_bad_data(nothing_connects, monkeypatch, capsys):
    assert status.main(["inventory/sim.py", "--data", "fabric_mtu=70000"]) == 2
    assert "fabric_mtu" in capsys.readouterr().err


# scripts/node_report.py
# ----------------------


@pytest.fixture
def node_report(monkeypatch):
    spec = importlib.util.spec_from_file_location("node_report", scripts.path("node_report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ran = []

    def sh(*args, timeout=20):
        ran.append(args)
        return ""

    monkeypatch.setattr(module, "sh", sh)
    module.ran = ran
    return module


def test_env_value(node_report, tmp_path):
    env = tmp_path / "nccl.env"
    env.write_text('# sparkinfra\nNCCL_SOCKET_IFNAME=enp1s0f0np0\nNCCL_IB_GID_INDEX="3"\nNCCL_IB_GID_INDEX_X=9\n')
    assert node_report.env_value(str(env), "NCCL_IB_GID_INDEX") == "3"
    assert node_report.env_value(str(env), "NCCL_SOCKET_IFNAME") == "enp1s0f0np0"
    assert node_report.env_value(str(env), "NCCL_IB_HCA") is None
    assert node_report.env_value(str(tmp_path / "absent.env"), "NCCL_IB_GID_INDEX") is None


def test_history_last_n_bad_lines_skipped(node_report, tmp_path):
    path = tmp_path / "sim.history"
    events = [{"at": AT + i, "event": "start", "why": str(i)} for i in range(12)]
    path.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    assert node_report.history(str(path)) == events[-10:]
    assert node_report.history(str(path), 3) == events[-3:]
    path.write_text(json.dumps(events[0]) + '\n{"at": 17965\n\n' + json.dumps(events[1]) + "\n")
    assert node_report.history(str(path)) == events[:2]
    assert node_report.history(str(tmp_path / "absent")) == []


def test_history_keeps_only_objects(node_report, tmp_path):
    """As the runner's own reader (lane_ctl.events): a line that is JSON but not an event is skipped
    (status.text reads each event with .get)."""
    path = tmp_path / "sim.history"
    event = {"at": AT, "event": "start", "why": "boot"}
    path.write_text(f'{json.dumps(event)}\n17965\n"stop"\n[1, 2]\nnull\n')
    assert node_report.history(str(path)) == [event]


def _tool() -> str:
    return base64.b64encode(transfer.tool_source().encode()).decode()


def _snapshot(root, name="models--org--tiny"):
    repo = root / name
    (repo / "snapshots" / "abc").mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "f1").write_text("weights")
    (repo / "snapshots" / "abc" / "model.safetensors").symlink_to("../../blobs/f1")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    return repo


def _write_manifest(repo) -> dict:
    tool: dict = {"__name__": "snapshot_tool"}
    exec(compile(transfer.tool_source(), "snapshot_tool.py", "exec"), tool)  # noqa: S102
    return tool["manifest"](str(repo), write=True)


def test_manifests_digest_when_written_and_current(node_report, tmp_path):
    repo = _snapshot(tmp_path)
    written = _write_manifest(repo)
    assert written["written"] and len(written["digest"]) == 64
    assert node_report.manifests([str(repo)], _tool()) == {str(repo): written["digest"]}


def test_manifests_none_when_missing_or_stale(node_report, tmp_path):
    repo, absent = _snapshot(tmp_path), tmp_path / "models--org--absent"
    assert node_report.manifests([str(repo), str(absent)], _tool()) == {str(repo): None, str(absent): None}
    _write_manifest(repo)
    (repo / "blobs" / "f2").write_text("more")  # changed since the stage wrote the manifest
    assert node_report.manifests([str(repo)], _tool()) == {str(repo): None}
    assert node_report.manifests([], "") == {}


def test_fabric_of_a_missing_interface(node_report):
    assert node_report.fabric("sparkinfra-no-such-if0") == {"present": False}
    assert node_report.ran == []


def _fake_node(node_report, monkeypatch, tmp_path, interface="enp1s0f0np0", twin="enP2p1s0f0np0"):
    """The node's tools (systemctl, docker, journalctl, ip), its fabric port's twins' sysfs files and
    their RDMA devices' (a GB10's cabled port: each twin's GID table from its own netdev), faked."""
    bases = {}
    for netdev, mtu in ((interface, "4200"), (twin, "4200")):
        sysfs = tmp_path / "sys" / netdev
        sysfs.mkdir(parents=True)
        (sysfs / "operstate").write_text("up\n")
        (sysfs / "carrier").write_text("1\n")
        (sysfs / "mtu").write_text(f"{mtu}\n")
        bases[f"/sys/class/net/{netdev}"] = sysfs
    infiniband = tmp_path / "infiniband"
    for device, netdev, rows in (("rocep1s0f0", interface, _rows(interface, v4("10.213.1.1"))),
                                 ("roceP2p1s0f0", twin, _rows(twin, v4("169.254.1.1")))):
        (infiniband / device / "device" / "net" / netdev).mkdir(parents=True)
        port = infiniband / device / "ports" / "1"
        for part in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (port / part).mkdir(parents=True)
        (port / "state").write_text("4: ACTIVE\n")
        for row in rows:
            (port / "gids" / str(row["index"])).write_text(row["gid"] + "\n")
            (port / "gid_attrs" / "types" / str(row["index"])).write_text(row["type"] + "\n")
            (port / "gid_attrs" / "ndevs" / str(row["index"])).write_text(row["ndev"] + "\n")
    monkeypatch.setattr(node_report, "INFINIBAND", str(infiniband))
    real_isdir, real_read = os.path.isdir, node_report.read

    def base_of(path):
        return next((b for b in bases if path == b or path.startswith(b + "/")), None)

    monkeypatch.setattr(node_report, "os", SimpleNamespace(
        listdir=os.listdir, path=SimpleNamespace(isdir=lambda p: True if p in bases else real_isdir(p), isfile=os.path.isfile)))
    monkeypatch.setattr(node_report, "read", lambda p: real_read(str(bases[base_of(p)] / p[len(base_of(p)) + 1:]))
                        if base_of(p) and p != base_of(p) else real_read(p))
    answers = {
        ("systemctl", "show"): "LoadState=loaded\nActiveState=active\nSubState=running\nUnitFileState=enabled\n"
                               f"ActiveEnterTimestampMonotonic={int(time.monotonic() * 1e6) - 60_000_000}\n"
                               "InvocationID=0123abcd\nNRestarts=2",
        ("systemctl", "list-units"): "sparkinfra-lane-sim.service loaded active running sparkinfra lane sim\n"
                                     "sparkinfra-lane-sim-b.service loaded active running sparkinfra lane sim-b",
        ("docker", "inspect"): f"true 2026-12-06T10:00:01.123456789Z {IMAGE_ID}",
        ("docker", "image"): IMAGE_ID,
        ("docker", "version"): "28.3.0",
        ("ip", "-4"): f"5: {interface}    inet 10.213.1.1/24 brd 10.213.1.255 scope global {interface}",
        ("journalctl", "_SYSTEMD_INVOCATION_ID=0123abcd"): "INFO starting\n" + NCCL_LINE + "\nINFO done",
    }

    def sh(*args, timeout=20):
        node_report.ran.append(args)
        if args[:2] == ("ip", "-4") and args[-1] == twin:
            return f"6: {twin}    inet 169.254.1.1/16 brd 169.254.255.255 scope link {twin}"
        return answers.get(args[:2], "")

    monkeypatch.setattr(node_report, "sh", sh)


def test_fabric_of_a_port(node_report, monkeypatch, tmp_path):
    _fake_node(node_report, monkeypatch, tmp_path)
    assert node_report.fabric("enp1s0f0np0") == {"present": True, "operstate": "up", "carrier": True, "mtu": 4200,
                                                 "addresses": ["10.213.1.1/24"]}


def test_a_report_from_status_query_reads_as_serving(node_report, monkeypatch, tmp_path, sim):
    """status.node_query -> node_report.report -> status.node_view -> no problem: the shapes agree."""
    _fake_node(node_report, monkeypatch, tmp_path)
    query = json.loads(status.node_query(sim.cluster, "sim", sim.want.image))
    for key in ("plan", "started", "history"):
        query["lane"][key] = str(tmp_path / f"sim.{key}")
    (tmp_path / "sim.plan").write_text(json.dumps({"digest": sim.want.digest, "rank": 0, "command": []}))
    (tmp_path / "sim.started").write_text(json.dumps({"digest": sim.want.digest, "at": AT}))
    (tmp_path / "sim.history").write_text("".join(json.dumps(e) + "\n" for e in HISTORY))
    query["nccl_env"] = str(tmp_path / "nccl.env")
    (tmp_path / "nccl.env").write_text("NCCL_IB_GID_INDEX=3\nNCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0\n")
    pin = tmp_path / "libnccl.so.2"
    pin.write_bytes(b"the pin")
    query.update(pin=str(pin), pin_record=str(tmp_path / "nccl-pin.json"), identity_script=str(tmp_path / "absent.py"))
    (tmp_path / "nccl-pin.json").write_text(json.dumps({"sha256": hashlib.sha256(b"the pin").hexdigest()}))
    repo = _snapshot(tmp_path, query["repos"][0].rsplit("/", 1)[-1])
    query["repos"] = [str(repo)]
    digest = _write_manifest(repo)["digest"]

    found = json.loads(json.dumps(node_report.report(query)))  # as it travels
    assert set(found) == set(_report(sim, 0))
    assert set(found["unit"]) == set(_report(sim, 0)["unit"])
    assert found["unit"]["restarts"] == 2 and abs(found["unit"]["since"] - (time.time() - 60)) < 5
    assert found["other_units"] == ["sparkinfra-lane-sim-b.service"]
    assert found["plan"] == {"digest": sim.want.digest, "rank": 0}
    assert found["manifests"] == {str(repo): digest} and found["gid_index"] == "3"
    assert found["nccl_lines"] == [NCCL_LINE] and found["history"] == HISTORY and found["docker"] is True
    assert ("docker", "image", "inspect", "-f", "{{.Id}}", sim.want.image) in node_report.ran

    view = status.node_view(sim.cluster.head, found, found, sim.want, sim.cluster.fabric)
    assert view["twins"] == [
        {"device": "rocep1s0f0", "netdev": "enp1s0f0np0", "row": "3", "mtu": 4200, "operstate": "up",
         "addresses": ["10.213.1.1/24"]},
        {"device": "roceP2p1s0f0", "netdev": "enP2p1s0f0np0", "row": "3", "mtu": 4200, "operstate": "up",
         "addresses": ["169.254.1.1/16"]}]
    assert view["nccl_version"] == "2.30.7" and view["image_matches_head"]
    assert view["snapshots_match_head"] == {repo.name: True}
    assert status.problems(sim.cluster, sim.want, [view], API_OK) == [
        "spark-1 (rank 0): another lane's unit runs (sparkinfra-lane-sim-b.service)"]


def test_a_report_of_a_node_without_a_lane(node_report, tmp_path, sim):
    """A cluster that names no lane sends empty lane paths: nothing is read, nothing fails."""
    query = json.loads(status.node_query(sim.cluster, "", sim.cluster.config.image))
    query.update(nccl_env=str(tmp_path / "nccl.env"), repos=[], snapshot_tool="", interface="sparkinfra-no-if0")
    found = node_report.report(query)
    assert found["unit"] == {"loaded": False} and found["plan"] is None and found["started"] is None
    assert found["history"] == [] and found["manifests"] == {} and found["fabric"] == {"present": False}
    assert status.node_view(sim.cluster.head, found, found, status.Expected(None))["unit"] == "absent"


def test_the_known_good_sets_are_read_from_their_metas_oldest_first(node_report, tmp_path):
    for number, lane in ((2, "sim-b"), (1, "sim")):
        (tmp_path / str(number)).mkdir()
        meta = {"number": number, "lane": lane, "digest": f"d{number}", "image": "img", "at": 1.0, "why": "it served",
                "files": ["/etc/sparkinfra/lanes/sim.json"], "rank": 0}
        (tmp_path / str(number) / "meta.json").write_text(json.dumps(meta))
    (tmp_path / ".3.tmp").mkdir()  # a set being written: no meta yet
    (tmp_path / "4").mkdir()
    (tmp_path / "4" / "meta.json").write_text("{")  # cut off
    found = node_report.known_good(str(tmp_path))
    assert [(k["number"], k["lane"]) for k in found] == [(1, "sim"), (2, "sim-b")]
    assert set(found[0]) == {"number", "lane", "digest", "image", "at", "why", "canary", "image_id", "image_bytes"}
    assert node_report.known_good(str(tmp_path / "none")) == [] and node_report.known_good("") == []


def test_what_changed_beneath_the_lane_since_its_known_good_set_is_said_per_node(sim):
    """Issue 41, drift: a node's platform_facts answer (its kernel moved since known good #3)."""
    changed = {"now": {"kernel": "7.0.0-1019-nvidia"}, "known": {"number": 3, "lane": "sim"},
               "changes": ["kernel 6.17.0-1031-nvidia -> 7.0.0-1019-nvidia"]}
    head, worker = _report(sim, 0), {**_report(sim, 1), "probe": [f"platform={json.dumps(changed)}"]}
    head_view, worker_view = _views(sim, head, worker)
    assert (head_view["drift"], worker_view["drift"], worker_view["drift_since"]) == (
        [], ["kernel 6.17.0-1031-nvidia -> 7.0.0-1019-nvidia"], 3)
    shown = status.text({"cluster": "sim", "lane": "sim", "digest": "d", "serving": True, "api": None, "history": [],
                         "problems": [], "nodes": [{**worker_view, "reached": False}],
                         "warnings": ["lanes/sim.yaml: rule x (warn): y"]}).splitlines()
    assert ("  spark-2 changed since known good #3: kernel 6.17.0-1031-nvidia -> 7.0.0-1019-nvidia (the next "
            "converge's preflight runs the node rules on it)") in shown
    assert "  warning: lanes/sim.yaml: rule x (warn): y" in shown
