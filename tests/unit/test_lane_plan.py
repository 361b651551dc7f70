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
from pathlib import Path

import pytest
from test_templates import golden

from sparkinfra import lanes, serving
from sparkinfra.operations.files import render
from sparkinfra.run import load_files

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plans():
    mp = pytest.MonkeyPatch()
    mp.chdir(REPO)
    mp.setenv("SPARKBED_API_KEY", "sk-golden")  # the digest holds a tag of the key, never the key
    try:
        _, settings = load_files("inventory/sim.py")
        cluster = settings.clusters["sim"]
        yield serving.rank_plans(lanes.find_lane("sim"), cluster)
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


def test_every_rank_carries_one_digest_that_any_change_moves(plans):
    assert len({p.digest for p in plans}) == 1 and len(plans[0].digest) == 16
    assert [p.rank for p in plans] == [0, 1]
    moved = serving.lane_digest([dataclasses.replace(plans[0], liveness_interval=31), plans[1]])
    assert moved != plans[0].digest


def test_only_the_head_serves_with_the_key_and_knows_the_workers(plans):
    head, worker = plans
    assert head.api_key_file == serving.secret_env_path("sim") and worker.api_key_file == ""
    assert head.command[:2] == ("sh", "-c") and worker.command[0] != "sh"
    assert "sk-golden" not in json.dumps([p.runner_plan() for p in plans]) + str([p.env for p in plans])
    assert head.workers == ((str(worker.node.fabric_ip), 1),) and worker.workers == ()
    assert head.unit_values()["restart"] == "always" and worker.unit_values()["restart"] == "no"
