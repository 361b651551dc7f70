"""
A lane as the seeds' sites publish theirs, from a bare head: its image made by a build repository
at a branch (the bed's hub serves it over git's HTTP, as GitHub serves a fork), its mods that
repository's mod group at the same commit (one mod gives vLLM a flag the image's own lacks), the
model at ``main``: the first converge locks each branch to its commit and serves; the next resolves
nothing and changes nothing; the network moving both branches changes nothing until
``python -m sparkinfra lock --update`` moves the pins, and the next converge stages and serves them.
"""

import json
import re
import sys

import pytest
import yaml

import sparkbed as simbed

INV = "inventory/sim.py"
LANE = "sim-c"
DATA = (f"lane={LANE}",)
CONTAINER = "vllm_node"
GREETING = "sparkbed greeting: hello from the build repository"
MODEL = "sparkbed/tiny-llama"
MODEL_DIR = "/var/lib/sparkinfra/hf/models--sparkbed--tiny-llama"


@pytest.fixture(scope="module")
def published(bed):
    bed.ensure(2)  # as the lane modules left it (serving), or bare when run alone
    bed.converge(INV, "deploys/teardown.py")
    for node in ("spark-1", "spark-2"):  # a bare head and worker: no image at all, the site's neither
        bed.node(node, "docker ps -aq | xargs -r docker rm -f >/dev/null; docker images -aq | xargs -r docker rmi -f >/dev/null",
                 check=False)
    bed.node("spark-1", f"rm -rf {MODEL_DIR}")  # downloaded again, in the lane's image
    first = bed.converge(INV, "deploys/serve.py", *DATA)
    return bed, first


def _lock(bed) -> dict:
    return yaml.safe_load(simbed.lock_path("sim").read_text())


def _chat(bed, model="tiny-c"):
    script = (
        "import json,sys,urllib.request;"
        f"body=json.dumps({{'model':{model!r},'messages':[{{'role':'user','content':'hi'}}],'max_tokens':8}}).encode();"
        "r=urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:8000/v1/chat/completions',data=body,"
        "headers={'Content-Type':'application/json','Authorization':'Bearer '+sys.stdin.read().strip()}),timeout=120);"
        "print(r.read().decode())"
    )
    out = simbed.node_exec("spark-1", "python3", "-c", script, check=False,
                           input=simbed.controller_env()[simbed.API_KEY_ENV])
    assert out.returncode == 0, out.stderr[-800:]
    return json.loads(out.stdout)


def _plan(bed) -> dict:
    return json.loads(bed.node("spark-1", f"cat /etc/sparkinfra/lanes/{LANE}.json").stdout)


def _verify_ok(bed):
    result = bed.verify(INV, "--data", f"lane={LANE}", "-k", "lane or stage")
    assert result.returncode == 0, result.output[-4000:]


def test_a_bare_head_builds_the_lanes_image_from_its_build_repository_locks_it_and_serves(published):
    bed, first = published
    ops = [op["name"] for op in first.results["operations"]]
    assert not any("Image sparkbed/stage:1" in op for op in ops), "the site's image was asked for"
    assert bed.node("spark-1", "docker image inspect sparkbed/stage:1", check=False).returncode != 0
    head = simbed.build_repo_head()
    assert f"--> lock: sim: pinned recipe/sparkbed-build: {simbed.BUILD_REPO_URL} main -> {head}" in first.stderr, \
        first.stderr[-3000:]
    lock = _lock(bed)
    assert lock["recipe/sparkbed-build"]["pin"] == head and lock["model"]["pin"] == simbed.SIM_REVISION
    assert re.fullmatch(r"[0-9a-f]{64}", lock["nccl"]["pin"])
    assert any(re.match(r"download sparkbed/tiny-llama: ", line.split("] ", 1)[-1]) for line in first.stderr.splitlines())
    assert _chat(bed)["usage"]["completion_tokens"] > 0
    log = bed.node("spark-1", f"docker logs {CONTAINER} 2>&1").stdout
    assert GREETING in log, log[-2000:]  # the flag a mod registered reached the image's vLLM
    for node in ("spark-1", "spark-2"):  # the group's mods ran in its order in both ranks
        applied = bed.node(node, f"docker exec {CONTAINER} cat /etc/sparkbed-mod/applied").stdout.split()
        assert applied == ["sparkbed-stamp", "sparkbed-greeting-flag", "sparkbed-motd"], (node, applied)
    _verify_ok(bed)


def test_a_second_converge_resolves_nothing_and_changes_nothing(published):
    bed, _ = published
    again = bed.converge(INV, "deploys/serve.py", *DATA)
    assert not again.changed_hosts(), again.changed
    assert "--> lock:" not in again.stderr


@pytest.mark.long  # 80 s: CI's budget goes to the benchmarks' quick modes; the lock's update is unit-tested
def test_moved_branches_change_nothing_until_the_lock_moves_them(published):
    bed, _ = published
    locked = _lock(bed)
    try:
        model = simbed.hub_move_main(MODEL)
        build = simbed.build_repo_commit("a newer stamp", "mods/sparkbed-stamp/stamp", "stamp 2\n")
        still = bed.converge(INV, "deploys/serve.py", *DATA)
        assert not still.changed_hosts() and "--> lock:" not in still.stderr, still.changed
        assert simbed.SIM_REVISION in _plan(bed)["command"], "the lane serves the locked commit"
        moved = bed.controller(sys.executable, "-m", "sparkinfra", "lock", INV, "--data", f"lane={LANE}",
                               "--update", "model", "--update", "recipe/sparkbed-build")
        assert moved.returncode == 0, moved.stderr
        assert f"sim: pinned model: {MODEL} main -> {model} (was {simbed.SIM_REVISION})" in moved.stdout, moved.stdout
        assert f"-  pin: {locked['recipe/sparkbed-build']['pin']}" in moved.stdout and f"+  pin: {build}" in moved.stdout
        run = bed.converge(INV, "deploys/serve.py", *DATA)
        head_ops = run.changed["spark-1"]
        assert any(f"Snapshot {MODEL}@{model[:12]} is on the head" in op for op in head_ops), head_ops
        assert any("is built on the head from recipe images/sparkbed-build" in op for op in head_ops), head_ops
        assert any("serves on every node" in op for op in head_ops), head_ops
        assert model in _plan(bed)["command"]
        assert _chat(bed)["usage"]["completion_tokens"] > 0
        for node in ("spark-1", "spark-2"):
            assert bed.node(node, f"docker exec {CONTAINER} cat /etc/sparkbed-mod/stamp").stdout == "stamp 2\n", node
        _verify_ok(bed)
    finally:
        simbed.hub_reset_main(MODEL)
        bed.controller(sys.executable, "-m", "sparkinfra", "lock", INV, "--data", f"lane={LANE}", "--update", "model")
