"""
``python -m sparkinfra.lanes show``: each rank's exact ``docker run``, env files (secrets masked)
and revisions, from the inventory alone (no host connected).
"""

from __future__ import annotations

import importlib.util
import shlex

from sparkinfra import serving
from sparkinfra.lanes import find_lane
from sparkinfra.lanes.__main__ import main
from sparkinfra.lanes.show import CACHE_IMAGE, PIN_OVER, docker_lines, show
from sparkinfra.run import load_files

MODEL_COMMIT, DRAFTER_COMMIT = "a" * 40, "d" * 40  # stand-ins for the commits a site pins
PAIR = ("model=Sebesky/MiniMax-M3-W4A16-GPTQ", "drafter=Sebesky/MiniMax-M3-EAGLE3-RTN-INT4",
        f"model_revision={MODEL_COMMIT}", f"drafter_revision={DRAFTER_COMMIT}")


def _cluster(inventory: str, *data: str):
    _, settings = load_files(inventory, data)
    [cluster] = settings.clusters.values()
    return cluster


def test_each_rank_gets_the_fabric_and_its_own_command():
    text = show(find_lane("pair-a-balanced"), _cluster("inventory/pair.py", *PAIR))
    assert "REFUSED" not in text
    head, worker = text.split("\nrank 1 on ")
    for rank in (head, worker):
        for option in ("--device /dev/infiniband", "--cap-add IPC_LOCK", "--ulimit memlock=-1", "--gpus all"):
            assert f"      {option} \\\n" in rank, option
        assert "NCCL_IB_GID_INDEX=<read on the node by deploys/prepare.py" in rank
    assert "--node-rank 0" in head and "--headless" not in head and "serves the API on :8000" in head
    assert "--node-rank 1" in worker and "--headless" in worker
    assert (f"model Sebesky/MiniMax-M3-W4A16-GPTQ @ {MODEL_COMMIT}; "
            f"drafter Sebesky/MiniMax-M3-EAGLE3-RTN-INT4 @ {DRAFTER_COMMIT}") in text


def test_a_branch_revision_is_refused_unless_the_settings_allow_it():
    """Two stages a week apart must not serve different weights: a served lane pins commits."""
    lane, unpinned = find_lane("pair-a-balanced"), PAIR[:2] + (f"drafter_revision={DRAFTER_COMMIT}",)
    text = show(lane, _cluster("inventory/pair.py", *unpinned))
    assert ("REFUSED by a converge: lanes/pair-a-balanced.yaml: model_revision 'main' of cluster pair names a branch "
            "or tag, not a commit of Sebesky/MiniMax-M3-W4A16-GPTQ") in text
    assert "drafter_revision" not in text.split("\nrank 0")[0]
    assert "REFUSED" not in show(lane, _cluster("inventory/pair.py", *unpinned, "allow_branch_revisions=true"))


def test_the_lines_are_the_exact_command_the_runner_runs(monkeypatch):
    """What the runner runs, with the pin over each copy it finds in the image where the show
    names them (``PIN_OVER``: found on the node, before the first start)."""
    spec = importlib.util.spec_from_file_location("lane_ctl", serving.LANE_CTL_SOURCE)
    ctl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ctl)
    monkeypatch.setattr(ctl, "nccl_copies", lambda p: [PIN_OVER])
    for plan in serving.rank_plans(find_lane("sim"), _cluster("inventory/sim.py")):
        runs, planned = ctl.docker_run(plan.runner_plan(), CACHE_IMAGE), plan.docker_run()
        at = planned.index(plan.image)
        caches = serving.compile_cache_mounts("sim", CACHE_IMAGE)
        assert caches[:2] == ["-v", f"/var/cache/sparkinfra/compile/sim/{CACHE_IMAGE}/vllm:/root/.cache/vllm"]
        assert runs == [*planned[:at], "-v", f"{plan.nccl_pin}:{PIN_OVER}:ro", *caches, *planned[at:]]
        lines = docker_lines(plan)
        assert all(line.endswith(" \\") for line in lines[:-1]) and not lines[-1].endswith("\\")
        assert shlex.split(" ".join(line.removesuffix(" \\") for line in lines)) == runs


def test_secrets_are_not_shown(monkeypatch):
    monkeypatch.setenv("SPARKBED_API_KEY", "sk-do-not-print-me")
    lane = find_lane("sim").model_copy(deep=True)
    lane.env = {**lane.env, "HF_TOKEN": "hf_do_not_print_me", "MY_API_KEY": "also-secret"}
    text = show(lane, _cluster("inventory/sim.py"))
    assert "do-not-print" not in text and "do_not_print" not in text and "also-secret" not in text
    assert "      HF_TOKEN=<not shown>" in text and "      MY_API_KEY=<not shown>" in text
    assert "VLLM_API_KEY=<$SPARKBED_API_KEY of the controller: not shown>" in text
    assert "      VLLM_HOST_IP=10.213.1.1" in text  # what is not a secret is shown as it is


def test_cli_shows_the_settings_lane_and_says_what_a_converge_would_refuse(capsys):
    assert main(["show", "--inventory", "inventory/sim.py"]) == 0
    assert capsys.readouterr().out.startswith("Lane sim on cluster sim (2 nodes), plan ")
    assert main(["show", "pair-a-balanced", "--inventory", "inventory/pair.py"]) == 1  # no model set
    out = capsys.readouterr().out
    assert "REFUSED by a converge: lanes/pair-a-balanced.yaml: model 'Sebesky/MiniMax-M3-W4A16-GPTQ' is not" in out
    assert "rank 1 on reddie" in out  # shown all the same


def test_cli_without_a_lane_anywhere(capsys):
    assert main(["show", "--inventory", "inventory/pair.py"]) == 1  # the pair's data names none
    assert "no cluster of inventory/pair.py names a lane" in capsys.readouterr().err


def test_cli_refuses_bad_settings_with_the_file_and_key(capsys):
    assert main(["show", "--inventory", "inventory/sim.py", "--data", "fabric_mtu=70000"]) == 1
    assert "error: --data, key 'fabric_mtu' (host spark-1): " in capsys.readouterr().err
