"""
The sim lane's plan per rank (``serving.rank_plans``, the one place a lane's docker options,
command, env, paths and timings are decided), as the deploy writes it: the runner's JSON plan,
the env file and the unit, compared with golden files in ``tests/unit/golden/plans/``.

To rewrite them after a deliberate change (then read the diff):
``SPARKINFRA_REGOLD=1 pytest tests/unit/test_lane_plan.py``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest
from test_templates import golden

from sparkinfra import lanes, node, serving
from sparkinfra.node import paths
from sparkinfra.node.plan import Mod, NcclEnv, RunnerPlan
from sparkinfra.operations.files import render
from sparkinfra.run import load_files

REPO = Path(__file__).resolve().parents[2]


def _sim_cluster():
    mp = pytest.MonkeyPatch()
    mp.chdir(REPO)
    mp.setenv("SPARKBED_API_KEY", "sk-golden")  # neither the key nor anything derived from it is in a plan
    try:
        # No lock (a bed's, under its state folder, would pin main): the site's data as it is.
        return load_files("inventory/sim.py", ["lock_file=tests/unit/fixtures/none.lock.yaml"])[1].clusters["sim"]
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def plans():
    mp = pytest.MonkeyPatch()
    mp.setenv("SPARKBED_API_KEY", "sk-golden")
    try:
        yield serving.rank_plans(lanes.find_lane("sim"), _sim_cluster())
    finally:
        mp.undo()


@pytest.mark.parametrize("rank", [0, 1])
def test_each_ranks_files_match_the_golden_render(plans, rank):
    plan = plans[rank]
    golden(f"plans/sim.rank{rank}.json", serving.plan_json(plan))
    golden(f"plans/sim.rank{rank}.env", render("etc/sparkinfra/lanes/lane.env.j2", lane="sim", rank=rank,
                                                 variables=sorted(plan.env.items())))
    golden(f"plans/sim.rank{rank}.service", render("etc/systemd/system/sparkinfra-lane.service.j2",
                                                     **plan.unit_values()))


def test_the_runner_reads_back_the_plan_the_controller_wrote(plans, tmp_path):
    """The JSON of every rank's plan, read by the node's own class, is the plan itself, each part as
    its class (a worker, the rendezvous, the check, the caches); a key the class lacks is refused."""
    cluster, lane = _sim_cluster(), lanes.find_lane("sim")
    tuned = lane.model_copy(update={"nccl_env": {"NCCL_PROTO": "LL", "NCCL_IB_MERGE_NICS": None}})
    for rank in [*plans, *serving.rank_plans(tuned, cluster)]:
        plan = rank.runner_plan()
        (tmp_path / "sim.json").write_text(serving.plan_json(rank))
        read = RunnerPlan.read(str(tmp_path / "sim.json"))
        assert read == plan and read.to_json() == serving.plan_json(rank)
    head, worker = (p.runner_plan() for p in plans)
    assert [w.rank for w in head.workers] == [1] and worker.rendezvous.host == plans[0].head_ip
    assert head.compile_cache.root == f"{paths.COMPILE_CACHE}/sim" and head.drop_caches.every == 5
    with pytest.raises(TypeError, match="unknown"):
        RunnerPlan.from_dict({**head.to_dict(), "unknown": 1})


def test_every_rank_carries_one_digest_that_any_change_moves(plans):
    assert len({p.digest for p in plans}) == 1 and len(plans[0].digest) == 16
    assert [p.rank for p in plans] == [0, 1]
    moved = serving.lane_digest([dataclasses.replace(plans[0], liveness_interval=31), plans[1]])
    assert moved != plans[0].digest


def test_only_the_head_serves_with_the_key_and_knows_the_workers(plans):
    head, worker = plans
    assert head.api_key_file == paths.secret_env_path("sim") and worker.api_key_file == ""
    assert head.command[:2] == ("sh", "-c") and worker.command[:2] != ("sh", "-c")
    assert "sk-golden" not in json.dumps([p.runner_plan().to_dict() for p in plans]) + str([p.env for p in plans])
    assert head.workers == ((str(worker.node.fabric_ip), 1),) and worker.workers == ()
    assert head.unit_values()["restart"] == "always" and worker.unit_values()["restart"] == "no"


def test_a_rotated_key_leaves_the_plans_as_they_were(monkeypatch):
    """No tag or hash of the key in the digest (a weak key could be guessed from it offline): the
    head's runner tells a changed key itself (lane_ctl's stamp), and the converge restarts for it."""
    cluster, lane = _sim_cluster(), lanes.find_lane("sim")
    monkeypatch.setenv("SPARKBED_API_KEY", "sk-golden")
    before = [serving.plan_json(p) for p in serving.rank_plans(lane, cluster)]
    monkeypatch.setenv("SPARKBED_API_KEY", "sk-rotated")
    assert [serving.plan_json(p) for p in serving.rank_plans(lane, cluster)] == before


def test_every_rank_drops_the_page_cache_while_loading_until_the_heads_api_answers(plans):
    head, worker = plans
    at_most = _sim_cluster().config.lane_ready_timeout  # as long as a start may take
    assert head.drop_caches == {"every": 5, "at_most": at_most, "until": "http://127.0.0.1:8000/health"}
    assert worker.drop_caches == {"every": 5, "at_most": at_most, "until": f"http://{head.head_ip}:8000/health"}


def test_no_page_cache_dropper_under_instanttensor_or_when_set_off(plans):
    """Seed 001's gotcha 9: the dropper helps a safetensors load and thrashes an instanttensor one."""
    cluster = _sim_cluster()
    lane = lanes.find_lane("sim")
    instant = lane.model_copy(update={"serve": {**lane.serve, "load_format": "instanttensor"}})
    assert [p.drop_caches for p in serving.rank_plans(instant, cluster)] == [None, None]
    off = cluster.model_copy(update={"config": cluster.config.model_copy(update={"page_cache_dropper": 0})})
    assert [p.drop_caches for p in serving.rank_plans(lane, off)] == [None, None]
    assert lanes.find_lane("pair-c-speed").serve["load_format"] == "instanttensor"  # the seed's lane C


def _mod(folder: Path, name: str, body: str) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "run.sh").write_text(f"#!/bin/bash\nset -e\n{body}\n")


def test_mods_run_in_order_from_writable_copies_then_the_command(tmp_path):
    mods, work = tmp_path / "mods", tmp_path / "work"
    _mod(mods, "first", "echo first >> \"$ORDER\"; touch made-in-the-copy")
    _mod(mods, "second", "echo second >> \"$ORDER\"")
    _mod(mods, "broken", "exit 3")
    env = {"PATH": "/usr/bin:/bin", "ORDER": str(tmp_path / "order"), "SPARKINFRA_MODS_WORK": str(work)}

    def apply(*names):
        return subprocess.run(["sh", str(node.DIR / "apply_mods.sh"), str(mods), *names, "--", "echo", "the command"],
                              capture_output=True, text=True, env=env)

    done = apply("second", "first")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["mod second: applied", "mod first: applied", "the command"]
    assert (tmp_path / "order").read_text() == "second\nfirst\n" and (work / "first" / "made-in-the-copy").exists()
    assert not (mods / "first" / "made-in-the-copy").exists()  # the mounted folder stays as staged
    failed = apply("first", "broken", "second")
    assert failed.returncode == 1 and "the command" not in failed.stdout
    assert failed.stdout.splitlines() == ["mod first: applied"]
    assert "mod broken: run.sh failed: the lane does not start" in failed.stderr


def test_a_lane_with_mods_mounts_them_and_a_changed_mod_moves_its_digest(tmp_path):
    (tmp_path / "lanes").mkdir()
    text = (REPO / "lanes/sim.yaml").read_text().replace("name: sim\n", "name: modded\n")
    text = re.sub(r"(?m)^mods: .*\n", "mods: [hello]\n", text)
    text = re.sub(r"(?m)^image: .*\n", "", text)  # the recipe is not in tmp_path: the cluster's image
    (tmp_path / "lanes/modded.yaml").write_text(text)
    _mod(tmp_path / "mods", "hello", "echo hello")
    cluster = _sim_cluster()
    lane = lanes.find_lane("modded", project=tmp_path)
    head, worker = serving.rank_plans(lane, cluster)
    for plan in (head, worker):
        assert "/var/lib/sparkinfra/mods/modded:/run/sparkinfra/mods:ro" in plan.docker_options
        assert "/usr/local/lib/sparkinfra/node:/run/sparkinfra/node:ro" in plan.docker_options  # apply_mods.sh
        assert plan.runner_plan().mods == [Mod(name="hello", sha256=plan.mods[0][1])]
    assert worker.command[:5] == ("sh", serving.CONTAINER_APPLY_MODS, paths.CONTAINER_MODS, "hello", "--")
    assert head.command[:4] == ("sh", "-c", serving.WITH_API_KEY, "sparkinfra-api-key")  # the key, then the mods
    assert head.command[4:9] == worker.command[:5]
    (tmp_path / "mods/hello/run.sh").write_text("#!/bin/bash\necho hello again\n")
    assert serving.rank_plans(lane, cluster)[0].digest != head.digest


# A lane's files: named in one place (paths.lane_paths), found again by the node's fact
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("lane", ["sim", "sim-b", "pair-a-balanced", "v1.2"])
def test_every_path_of_a_lane_is_found_as_that_lanes(lane):
    from sparkinfra.facts.lane import LaneFiles

    found = paths.lane_paths(lane)
    assert [paths.lane_of_path(p) for p in found] == [lane] * len(found)
    listed = [*found, "/var/lib/sparkinfra/lanes/vllm_check.py", "/etc/sparkinfra/lanes/.json"]  # not a lane's
    assert LaneFiles().process(listed) == {lane: sorted(found)}


def test_every_mark_the_runner_writes_is_a_lane_path():
    """What lane_ctl leaves in the marks folder goes with its lane (MARK_NAMES is the list)."""
    source = "".join(f.read_text() for f in node.files() if f.name.startswith("lane_"))
    written = set(re.findall(r'mark\(\w+, "([\w.-]+)"\)', source))
    assert written and written <= set(paths.MARK_NAMES), written - set(paths.MARK_NAMES)


# A lane's NCCL changes (nccl_env): in the plan, the digest and the options of every rank
# ---------------------------------------------------------------------------------------


def test_a_lanes_nccl_changes_are_in_every_ranks_plan_and_options():
    """The rank's container gets the file lane_ctl writes from the node's with the lane's changes
    (its docker run, the in-image validation and ``lanes show`` name it); a changed nccl_env restarts."""
    cluster, lane = _sim_cluster(), lanes.find_lane("sim")
    tuned = lane.model_copy(update={"nccl_env": {"NCCL_PROTO": "LL", "NCCL_IB_MERGE_NICS": None}})
    before, after = serving.rank_plans(lane, cluster), serving.rank_plans(tuned, cluster)
    mine = paths.nccl_env_path("sim")
    assert mine == f"{paths.MARKS_DIR}/sim.nccl.env" and mine in paths.lane_paths("sim")  # a teardown removes it
    for plan, was in zip(after, before):
        assert plan.nccl_changes == {"NCCL_IB_MERGE_NICS": None, "NCCL_PROTO": "LL"}
        assert plan.runner_plan().nccl_env == NcclEnv(
            node="/etc/sparkinfra/nccl.env", file=mine, changes={"NCCL_IB_MERGE_NICS": None, "NCCL_PROTO": "LL"})
        options = list(plan.docker_options)
        assert options[options.index("--env-file") + 1] == mine and "/etc/sparkinfra/nccl.env" not in options
        assert options == [mine if o == "/etc/sparkinfra/nccl.env" else o for o in was.docker_options]
        docker_run = plan.docker_run()
        assert docker_run[docker_run.index("--env-file") + 1] == mine
        assert was.runner_plan().nccl_env is None and was.nccl_changes == {}
    assert after[0].digest != before[0].digest
    retuned = tuned.model_copy(update={"nccl_env": {"NCCL_PROTO": "Simple", "NCCL_IB_MERGE_NICS": None}})
    assert serving.rank_plans(retuned, cluster)[0].digest != after[0].digest


def test_a_full_teardown_removes_the_programs_and_the_lanes_folders_and_keeps_what_serves_again():
    """``paths.FULL_TEARDOWN_*``, which deploys/teardown.py removes: images, weights, compile caches,
    the pin's record and the converge lock are not under any of it; every lane's own path is (but
    its unit, which the lanes' teardown removes)."""
    removed = (*paths.FULL_TEARDOWN_FOLDERS, *paths.FULL_TEARDOWN_FILES)
    assert paths.PROGRAMS in removed and paths.NCCL_ENV_FILE in removed

    def under(path):
        return any(path == r or path.startswith(r + "/") for r in removed)

    kept = (paths.IMAGES_DIR, paths.COMPILE_CACHE, paths.NCCL_PIN_RECORD, paths.CONVERGE_LOCK, "/var/lib/sparkinfra/hf")
    assert not any(under(k) for k in kept)
    assert all(under(p) for p in paths.lane_paths("sim") if not p.startswith(paths.UNITS_DIR))
