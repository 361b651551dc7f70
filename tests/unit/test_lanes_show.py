"""
``python -m sparkinfra lanes show``: each rank's exact ``docker run``, env files (secrets masked)
and revisions, from the inventory alone (no host connected).
"""

from __future__ import annotations

import shlex

from sparkinfra import serving
from sparkinfra.lanes import find_lane
from sparkinfra.cli.lanes import main
from sparkinfra.cli.show import CACHE_IMAGE, PIN_OVER, docker_lines, nccl_lines, show
from sparkinfra.node import docker, lane_rank, paths
from sparkinfra.node.paths import NCCL_ENV_FILE
from sparkinfra.operations.files import render
from sparkinfra.operations.nccl import nccl_env, nccl_variables
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


def test_a_branch_revision_is_shown_as_what_the_first_converge_locks(capsys):
    """A branch is fine in site data: the lock pins its commit where the network is; no hash is made up."""
    assert main(["show", "--inventory", "inventory/pair.py", "--data", "lock_file=tests/unit/fixtures/none.lock.yaml"]) == 0
    text = capsys.readouterr().out
    assert "REFUSED" not in text
    assert ("  model Sebesky/MiniMax-M3-W4A16-GPTQ@main: not locked; the first converge resolves it on the head "
            "(or: python -m sparkinfra lock inventory/pair.py)") in text


def test_the_lines_are_the_exact_command_the_runner_runs(monkeypatch):
    """What the runner runs (``lane_rank.docker_run``, through the one builder ``docker.rank_run``),
    with the pin over each copy it finds in the image where the show names them (``PIN_OVER``: found
    on the node, before the first start) and the caches of the image ID it finds there."""
    built = []
    monkeypatch.setattr(lane_rank, "nccl_copies", lambda p: [PIN_OVER])
    monkeypatch.setattr(lane_rank, "write_nccl_env", lambda p: "")
    monkeypatch.setattr(docker, "rank_run", lambda *a, real=docker.rank_run: built.append(a) or real(*a))
    for plan in serving.rank_plans(find_lane("sim"), _cluster("inventory/sim.py")):
        runs = lane_rank.docker_run(plan.runner_plan(), CACHE_IMAGE)
        shown = plan.docker_run([PIN_OVER], CACHE_IMAGE)
        assert built[-1] == built[-2] == (plan.runner_plan(), [PIN_OVER], CACHE_IMAGE) and runs == shown
        at = runs.index(plan.image)
        caches = docker.cache_mounts(plan.runner_plan(), CACHE_IMAGE)
        assert caches[:2] == ["-v", f"/var/cache/sparkinfra/compile/sim/{CACHE_IMAGE}/vllm:/root/.cache/vllm"]
        assert runs == ["docker", "run", "--rm", "--name", plan.container, *plan.docker_options,
                        "-v", f"{plan.nccl_pin}:{PIN_OVER}:ro", *caches, *runs[at:]]
        assert runs[at:] == [plan.image, *plan.command]
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
    assert main(["show", "pair-a-balanced", "--inventory", "inventory/pair.py", "--data", "lane=",
                 "--data", "model=org/other"]) == 1
    out = capsys.readouterr().out
    assert "REFUSED by a converge: lanes/pair-a-balanced.yaml: model 'Sebesky/MiniMax-M3-W4A16-GPTQ' is not" in out
    assert "rank 1 on reddie" in out  # shown all the same


def test_cli_without_a_lane_anywhere(capsys):
    assert main(["show", "--inventory", "inventory/pair.py", "--data", "lane="]) == 1  # no lane set
    assert "no cluster of inventory/pair.py names a lane" in capsys.readouterr().err


def test_cli_refuses_bad_settings_with_the_file_and_key(capsys):
    assert main(["show", "--inventory", "inventory/sim.py", "--data", "fabric_mtu=70000"]) == 1
    assert "error: --data, key 'fabric_mtu' (host spark-1): " in capsys.readouterr().err


def test_each_rank_shows_the_lanes_nccl_changes_and_the_file_it_gets():
    lane = find_lane("sim").model_copy(update={"nccl_env": {"NCCL_PROTO": "LL", "NCCL_IB_MERGE_NICS": None}})
    text = show(lane, _cluster("inventory/sim.py"))
    mine = paths.nccl_env_path("sim")
    ranks = text.split("\nrank ")[1:]
    assert len(ranks) == 2
    for rank in ranks:
        assert "  the lane's NCCL changes (nccl_env): set NCCL_PROTO=LL; removed NCCL_IB_MERGE_NICS\n" in rank
        assert f"      --env-file {mine} \\\n" in rank and "/etc/sparkinfra/nccl.env \\\n" not in rank
        listed = rank.split(f"\n  {mine} (root only; the runner writes it before each start: "
                            "/etc/sparkinfra/nccl.env with those changes):\n")[1].split("\n  /etc/sparkinfra/lanes/")[0]
        variables = dict(line.strip().split("=", 1) for line in listed.splitlines())
        assert variables["NCCL_PROTO"] == "LL" and "NCCL_IB_MERGE_NICS" not in variables
        assert variables["NCCL_DEBUG"] == "INFO"  # the rest of the node's, as it is
    plain = show(find_lane("sim"), _cluster("inventory/sim.py"))
    assert "NCCL changes" not in plain and "  /etc/sparkinfra/nccl.env:\n      GLOO_SOCKET_IFNAME=" in plain
    assert "      --env-file /etc/sparkinfra/nccl.env \\\n" in plain


def test_the_shown_nccl_file_is_the_one_the_runner_writes_from_the_nodes():
    """The node's file as prepare renders it (its HCAs and GID index read there), turned by lane_ctl
    into the rank's: the same variables ``lanes show`` lists for the rank."""
    cluster = _cluster("inventory/sim.py")
    changes = {"NCCL_ALGO": "Ring", "NCCL_IB_GID_INDEX": None, "NCCL_PROTO": "LL", "NCCL_IB_MERGE_NICS": None}
    plan = serving.rank_plans(find_lane("sim").model_copy(update={"nccl_env": changes}), cluster)[1]
    node = nccl_env(nccl_variables(cluster), cluster.config.nccl_env_overrides, ["rocep1s0f0", "roceP2p1s0f0"], "3")
    node_text = render("etc/sparkinfra/nccl.env.j2", variables=sorted(node.items()))
    written = lane_rank.nccl_env_text(node_text, plan.runner_plan().nccl_env.changes, "sim", NCCL_ENV_FILE)
    gets = dict(line.split("=", 1) for line in written.splitlines() if line and not line.startswith("#"))
    shown = [line.strip() for line in nccl_lines(plan, node)[2:]]
    assert gets == dict(line.split("=", 1) for line in shown)
    assert gets["NCCL_PROTO"] == "LL" and gets["NCCL_ALGO"] == "Ring" and "NCCL_IB_GID_INDEX" not in gets
