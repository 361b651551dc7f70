"""
deploys/serve.py on the simulated pair, up to a real lane: vLLM (CPU) TP=2 across both nodes, rank 1
headless over the fabric, through the lane units. converge -> again (0 changes) -> verify -> faults,
each healed by one converge -> verify; then lane switching.
"""

import json
import time

import pytest

INV = "inventory/sim.py"
CONTAINER = "vllm_node"
UNIT = "sparkinfra-lane-{}.service"


@pytest.fixture(scope="module")
def serving(bed):
    bed.fresh(2)
    started = time.monotonic()
    first = bed.converge(INV, "deploys/serve.py")
    return bed, first, time.monotonic() - started


def _container_id(bed, node):
    out = bed.node(node, f"docker inspect -f '{{{{.Id}}}}' {CONTAINER}", check=False)
    return out.stdout.strip() if out.returncode == 0 else None


def _chat(bed, prompt="Say hello", max_tokens=12, model="tiny"):
    """A chat completion through the head's API, from the head (the API listens on the fabric host)."""
    script = (
        "import json,urllib.request;"
        f"body=json.dumps({{'model':{model!r},'messages':[{{'role':'user','content':{prompt!r}}}],'max_tokens':{max_tokens}}}).encode();"
        "r=urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:8000/v1/chat/completions',data=body,"
        "headers={'Content-Type':'application/json'}),timeout=120);print(r.read().decode())"
    )
    out = bed.node("spark-1", f"python3 -c \"{script}\"", check=False)
    assert out.returncode == 0, f"completion failed: {out.stderr[-800:]}"
    return json.loads(out.stdout)


def _active(bed, node, lane):
    return bed.node(node, f"systemctl is-active {UNIT.format(lane)}", check=False).stdout.strip()


def _assert_serving(bed, lane="sim"):
    reply = _chat(bed)
    assert reply["usage"]["completion_tokens"] > 0, reply
    for node in ("spark-1", "spark-2"):
        assert _active(bed, node, lane) == "active", f"{node}: {UNIT.format(lane)} is {_active(bed, node, lane)}"
    return reply


def _verify_ok(bed, *args):
    result = bed.verify(INV, "-k", "lane", *args)
    assert result.returncode == 0, result.output[-4000:]


def test_first_converge_serves_tp2_across_the_pair(serving):
    bed, first, seconds = serving
    head_ops = first.changed["spark-1"]
    assert any("serves on every node" in op for op in head_ops), head_ops
    assert any("accepts lane sim's arguments" in op for op in head_ops), head_ops
    reply = _assert_serving(bed)
    print(f"first serve converge: {seconds:.0f}s; completion: {reply['choices'][0]['message']['content']!r}")
    worker = json.loads(bed.node("spark-2", f"docker inspect {CONTAINER}").stdout)[0]
    assert "--headless" in worker["Config"]["Cmd"] and "--node-rank" in worker["Config"]["Cmd"]
    logs = bed.node("spark-2", f"docker logs {CONTAINER} 2>&1").stdout
    assert "world_size=2 rank=1" in logs, logs[-2000:]


def test_second_converge_changes_nothing(serving):
    bed, _, _ = serving
    run = bed.converge(INV, "deploys/serve.py")
    assert run.changes == {"spark-1": 0, "spark-2": 0}, run.changed


def test_verify_passes(serving):
    bed, _, _ = serving
    _verify_ok(bed)


def test_killed_worker_container_restarts_the_lane_on_both_nodes(serving):
    bed, _, _ = serving
    before = {n: _container_id(bed, n) for n in ("spark-1", "spark-2")}
    bed.node("spark-2", f"docker kill {CONTAINER}")
    run = bed.converge(INV, "deploys/serve.py")
    after = {n: _container_id(bed, n) for n in ("spark-1", "spark-2")}
    assert all(after[n] and after[n] != before[n] for n in after), (before, after, run.changed)
    _assert_serving(bed)
    _verify_ok(bed)


def test_head_watch_restarts_the_lane_without_a_converge(serving):
    """A dead worker is noticed by the head's unit itself (no controller): the lane restarts as a whole."""
    bed, _, _ = serving
    before = {n: _container_id(bed, n) for n in ("spark-1", "spark-2")}
    bed.node("spark-2", f"docker kill {CONTAINER}")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        after = {n: _container_id(bed, n) for n in ("spark-1", "spark-2")}
        if all(after[n] and after[n] != before[n] for n in after):
            try:
                _assert_serving(bed)
                break
            except AssertionError:
                pass
        time.sleep(3)
    else:
        pytest.fail(f"the lane did not come back by itself: {before} -> {after}")
    run = bed.converge(INV, "deploys/serve.py")
    assert run.changes == {"spark-1": 0, "spark-2": 0}, run.changed


def test_stopped_head_unit_is_restarted_with_its_worker(serving):
    bed, _, _ = serving
    bed.node("spark-1", f"systemctl stop {UNIT.format('sim')}")
    assert _active(bed, "spark-2", "sim") != "active", "stopping the head must take the worker down"
    run = bed.converge(INV, "deploys/serve.py")
    assert any("serves on every node" in op for op in run.changed["spark-1"]), run.changed
    _assert_serving(bed)
    _verify_ok(bed)


def test_stale_container_with_the_lanes_name_is_replaced(serving):
    bed, _, _ = serving
    bed.node("spark-1", f"systemctl stop {UNIT.format('sim')}")
    bed.node("spark-2", f"docker create --name {CONTAINER} sparkbed/stage:1 true >/dev/null")
    bed.node("spark-1", f"docker run -d --name {CONTAINER} --entrypoint sleep sparkbed/stage:1 600 >/dev/null")
    bed.converge(INV, "deploys/serve.py")
    _assert_serving(bed)
    _verify_ok(bed)


def test_switching_the_lane_setting_switches_lanes_on_every_node(serving):
    bed, _, _ = serving
    run = bed.converge(INV, "deploys/serve.py", "lane=sim-b")
    for node in ("spark-1", "spark-2"):
        assert _active(bed, node, "sim") == "inactive", f"{node}: lane sim still runs"
        assert _active(bed, node, "sim-b") == "active", f"{node}: lane sim-b does not run"
    assert _chat(bed, model="tiny-b")["usage"]["completion_tokens"] > 0
    result = bed.verify(INV, "--data", "lane=sim-b", "-k", "lane")
    assert result.returncode == 0, result.output[-4000:]
    back = bed.converge(INV, "deploys/serve.py")
    for node in ("spark-1", "spark-2"):
        assert _active(bed, node, "sim-b") == "inactive"
    assert run.changed["spark-1"] and back.changed["spark-1"]
    _assert_serving(bed)


def test_other_lane_started_by_hand_is_stopped(serving):
    bed, _, _ = serving
    bed.node("spark-1", f"systemctl start {UNIT.format('sim-b')}")
    for node in ("spark-1", "spark-2"):
        assert _active(bed, node, "sim") != "active", f"{node}: starting sim-b must stop sim"
    bed.converge(INV, "deploys/serve.py")
    for node in ("spark-1", "spark-2"):
        assert _active(bed, node, "sim-b") == "inactive", f"{node}: sim-b still runs"
    _assert_serving(bed)
    _verify_ok(bed)
