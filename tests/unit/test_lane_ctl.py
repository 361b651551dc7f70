"""lane_ctl.py: trial plans, the pin over the copies, memory hygiene, compile caches, supervision."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import stat
import subprocess
import threading
import time
import types
from pathlib import Path

import pytest

from sparkinfra import node, serving
from sparkinfra.node import docker, lane_ctl, lane_history, lane_io, lane_rank, lane_trial, lane_watch, paths
from sparkinfra.node.plan import RunnerPlan, Worker


@pytest.fixture(autouse=True)
def docker_up(monkeypatch):
    """Every node's Docker daemon answers, unless a test says otherwise."""
    monkeypatch.setattr(lane_io, "docker_answers", lambda: True)


@pytest.fixture
def ctl(tmp_path):
    """The runner's folder of the test: ``ctl.tmp`` (plans/sim.env in it)."""
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "sim.env").write_text("A=1\nVLLM_CPU_KVCACHE_SPACE=1\nB=2\n")
    return types.SimpleNamespace(tmp=tmp_path)


def _plan(ctl, **extra) -> RunnerPlan:
    """A head's plan of lane sim with one worker, ``extra`` as ``RunnerPlan.to_dict`` writes it."""
    return RunnerPlan.from_dict({
        "lane": "sim",
        "unit": "sparkinfra-lane-sim.service",
        "lane_units": "sparkinfra-lane-*.service",
        "env_file": str(ctl.tmp / "plans" / "sim.env"),
        "marks_dir": str(ctl.tmp / "marks"),
        "history": "",
        "rank": 0,
        "container": "vllm_node",
        "image": "img:1",
        "docker_options": ["--network", "host", "--env-file", "/etc/sparkinfra/nccl.env",
                           "--env-file", str(ctl.tmp / "plans" / "sim.env"), "-v", "/a:/a:ro"],
        "command": ["vllm", "serve", "org/m", "--gpu-memory-utilization", "0.9", "--max-model-len", "512"],
        "api_port": 9, "served_model_name": "org/m", "api_key_file": "", "workers": [], "warmup": [],
        "watch_interval": 0, "stop_seconds": 1, "watch_grace": 0, "liveness_interval": 30, "liveness_timeout": 5,
        "unreachable_grace": 900, "head_lost_timeout": 60, "start_timeout": 600, "rendezvous": None,
        "container_check": None, **extra,
    })


def _with(p: RunnerPlan, **changes) -> RunnerPlan:
    """``p`` with ``changes``, each as ``RunnerPlan.to_dict`` writes it."""
    return RunnerPlan.from_dict({**p.to_dict(), **changes})


def test_flag_knob_replaces_the_value(ctl):
    p = _plan(ctl)
    q = lane_trial.trial_plan(p, "--gpu-memory-utilization", "0.929")
    assert q.command == ["vllm", "serve", "org/m", "--gpu-memory-utilization", "0.929", "--max-model-len", "512"]
    assert q.container == "vllm_node-trial" and q.docker_options == p.docker_options
    assert p.command[4] == "0.9"  # the lane's plan itself is untouched


def test_flag_knob_in_equals_form_and_missing(ctl):
    p = _plan(ctl)
    p.command[3:5] = ["--gpu-memory-utilization=0.9"]
    assert "--gpu-memory-utilization=0.5" in lane_trial.trial_plan(p, "--gpu-memory-utilization", "0.5").command
    q = lane_trial.trial_plan(p, "--kv-cache-memory-bytes", "1000")
    assert q.command[-2:] == ["--kv-cache-memory-bytes", "1000"]


def test_env_knob_goes_to_a_root_only_copy_of_the_env_file(ctl):
    p = _plan(ctl)
    q = lane_trial.trial_plan(p, "VLLM_CPU_KVCACHE_SPACE", "3")
    trial_env = ctl.tmp / "marks" / "sim.trial.env"
    assert trial_env.read_text() == "A=1\nB=2\nVLLM_CPU_KVCACHE_SPACE=3\n"
    assert stat.S_IMODE(trial_env.stat().st_mode) == 0o600
    assert q.docker_options[5] == str(trial_env) and p.docker_options[5] == p.env_file
    assert q.command == p.command


# The head's API key: read inside the container, not set in its configuration
# ---------------------------------------------------------------------------


def _with_key(tmp_path, text: str | None, *command: str):
    key_file = tmp_path / "api.env"
    if text is not None:
        key_file.write_text(text)
    wrapped = serving.container_command(list(command), api_key=True)
    assert wrapped[4:] == list(command) and paths.CONTAINER_API_KEY in wrapped[2]
    wrapped[2] = wrapped[2].replace(paths.CONTAINER_API_KEY, str(key_file))
    return subprocess.run(wrapped, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("key", ["0123abcd", "a$b `c` \"d' e\\f", "=x=y"])
def test_api_key_is_exported_literally_then_the_command_runs(tmp_path, key):
    script = 'printf "%s\\n" "$VLLM_API_KEY" "$#" "$@"'
    done = _with_key(tmp_path, f"# sparkinfra\nOTHER=1\nVLLM_API_KEY={key}", "sh", "-c", script, "vllm", "serve", "a b")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [key, "2", "serve", "a b"]


@pytest.mark.parametrize("text", ["OTHER=1\n", "VLLM_API_KEY=\n", None])
def test_no_api_key_no_start(tmp_path, text):
    done = _with_key(tmp_path, text, "echo", "started")
    assert done.returncode != 0 and "started" not in done.stdout


def test_a_rank_without_a_key_runs_the_lane_command_itself():
    assert serving.container_command(["vllm", "serve", "m"], api_key=False) == ["vllm", "serve", "m"]


def test_flag_knob_in_the_heads_wrapped_command(ctl):
    p = _plan(ctl)
    p = p.replace(command=serving.container_command(p.command, api_key=True))
    q = lane_trial.trial_plan(p, "--gpu-memory-utilization", "0.929")
    assert q.command[:4] == p.command[:4] and q.command[4:] == [
        "vllm", "serve", "org/m", "--gpu-memory-utilization", "0.929", "--max-model-len", "512"]


def test_status_of_a_lane_not_placed_is_empty(tmp_path):
    """The runner's paths come from the plan it is given: no plan there, nothing to report."""
    done = subprocess.run(["python3", str(node.DIR), "lane_ctl", "status", str(tmp_path / "sim.json")],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "{}\n", done.stderr


def test_the_runner_has_no_paths_of_its_own():
    """Every path lane_ctl touches is in the plan (serving.RankPlan.runner_plan), none in its modules."""
    for module in (lane_ctl, lane_history, lane_io, lane_rank, lane_trial, lane_watch):
        source = Path(module.__file__).read_text()
        code = source[source.index('"""', source.index('"""') + 3):]  # past the docstring
        for path in (paths.PLANS_DIR, paths.MARKS_DIR, paths.STATE_DIR, "sparkinfra-lane-", "import paths"):
            assert path not in code, (module.__name__, path)


def test_the_pin_is_mounted_over_each_copy_found_once_per_image(ctl, monkeypatch):
    """The image is searched once per image ID (and mounts); a new image ID is searched again."""
    ran, image = [], {"id": "sha256:aaa"}

    def sh(*args, **kwargs):
        ran.append(args)
        if args[:3] == ("docker", "image", "inspect"):
            return subprocess.CompletedProcess(args, 0, image["id"] + "\n", "")
        if args[:2] == ("docker", "run"):
            found = "/opt/nccl/lib/libnccl.so.2\n/usr/lib/x86_64-linux-gnu/libnccl.so.2\n/venv/nvidia/nccl/lib/libnccl.so.2\n"
            return subprocess.CompletedProcess(args, 0, found, "")
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(lane_io, "sh", sh)
    p = _plan(ctl, nccl_pin="/opt/nccl/lib/libnccl.so.2",
              container_check={"programs": "/usr/local/lib/sparkinfra/node", "mount": "/run/sparkinfra/node"})
    options = lane_rank.rank_options(p)
    assert options[len(p.docker_options):] == [
        "-v", "/opt/nccl/lib/libnccl.so.2:/usr/lib/x86_64-linux-gnu/libnccl.so.2:ro",
        "-v", "/opt/nccl/lib/libnccl.so.2:/venv/nvidia/nccl/lib/libnccl.so.2:ro",
    ]  # the pin itself (mounted by the plan's options) is not mounted over itself
    searches = lambda: sum(1 for args in ran if args[:2] == ("docker", "run"))  # noqa: E731
    assert lane_rank.rank_options(p) == options and searches() == 1
    image["id"] = "sha256:bbb"
    lane_rank.rank_options(p)
    assert searches() == 2
    assert lane_rank.rank_options(p.replace(nccl_pin="")) == p.docker_options


def test_a_failed_search_names_the_image(ctl, monkeypatch):
    monkeypatch.setattr(lane_io, "sh", lambda *a, **k: subprocess.CompletedProcess(a, 125, "", "docker: no such image"))
    p = _plan(ctl, nccl_pin="/opt/nccl/lib/libnccl.so.2", container_check={"programs": "/p", "mount": "/run/p"})
    with pytest.raises(RuntimeError, match="listing the libnccl copies of img:1 failed: docker: no such image"):
        lane_rank.rank_options(p)
    ok, lines = lane_rank.container_check(p)
    assert not ok and lines == ["container check: FAIL nccl: listing the libnccl copies of img:1 failed: "
                                "docker: no such image"]


def test_a_docker_daemon_that_does_not_answer_is_named_by_the_container_check(ctl, monkeypatch):
    ran = []
    monkeypatch.setattr(lane_io, "docker_answers", lambda: False)
    monkeypatch.setattr(lane_io, "sh", lambda *a, **k: ran.append(a) or subprocess.CompletedProcess(a, 1, "", "x"))
    p = _plan(ctl, nccl_pin="/opt/nccl/lib/libnccl.so.2", container_check={"programs": "/p", "mount": "/run/p"})
    assert lane_rank.container_check(p) == (False, [
        "container check: FAIL docker: the Docker daemon does not answer on this node (systemctl status docker)"])
    assert ran == []  # no docker run tried, no "unknown server OS" retried


# A lane's NCCL changes (nccl_env): the node's file with them, written before every docker run
# -----------------------------------------------------------------------------------------


NODE_NCCL = (
    "# Managed by sparkinfra (deploys/prepare.py): this node's NCCL environment, read by the lane units.\n"
    "NCCL_DEBUG=INFO\nNCCL_IB_GID_INDEX=3\nNCCL_IB_MERGE_NICS=1\n\n  NCCL_PROTO=Simple\nNCCL_PROTO=LL128\n"
    "LD_PRELOAD=/opt/nccl/lib/libnccl.so.2\n"
)
CHANGES = {"NCCL_ALGO": "Ring", "NCCL_IB_GID_INDEX": None, "NCCL_IB_MERGE_NICS": None, "NCCL_PROTO": "LL",
           "NCCL_TOPO_FILE": None}


def _nccl_plan(ctl, changes=CHANGES):
    node, mine = ctl.tmp / "nccl.env", ctl.tmp / "marks" / "sim.nccl.env"
    node.write_text(NODE_NCCL)
    p = _plan(ctl)
    p.docker_options[3] = str(mine)  # as serving names it: the lane's file, not the node's
    return _with(p, nccl_env={"node": str(node), "file": str(mine), "changes": dict(changes)})


def test_the_lanes_changes_set_and_remove_the_nodes_nccl_variables(ctl):
    """Set: on the variable's own line (its first; an indented one too, as docker reads it), else
    appended; removed: every line of it; a variable the node lacks removed is nothing; the rest as it is."""
    text = lane_rank.nccl_env_text(NODE_NCCL, CHANGES, "sim", "/etc/sparkinfra/nccl.env")
    assert text.splitlines() == [
        "# Written by lane_ctl.py before each start of lane sim: /etc/sparkinfra/nccl.env with the lane's nccl_env "
        "(set NCCL_ALGO=Ring, NCCL_PROTO=LL; removed NCCL_IB_GID_INDEX, NCCL_IB_MERGE_NICS, NCCL_TOPO_FILE)",
        "# Managed by sparkinfra (deploys/prepare.py): this node's NCCL environment, read by the lane units.",
        "NCCL_DEBUG=INFO",
        "",
        "NCCL_PROTO=LL",
        "LD_PRELOAD=/opt/nccl/lib/libnccl.so.2",
        "NCCL_ALGO=Ring",
    ]
    variables = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert variables == {"NCCL_DEBUG": "INFO", "NCCL_PROTO": "LL", "LD_PRELOAD": "/opt/nccl/lib/libnccl.so.2",
                         "NCCL_ALGO": "Ring"}
    assert lane_rank.nccl_changes_text({"NCCL_PROTO": "LL"}) == "set NCCL_PROTO=LL"
    assert lane_rank.nccl_changes_text({"NCCL_PROTO": None}) == "removed NCCL_PROTO"


def test_the_lanes_nccl_file_is_written_root_only_before_each_docker_run(ctl, monkeypatch):
    """Every docker run of the rank (the libnccl search, the container check, the rank, a trial) finds
    the file its options name written from the node's file as it is then (prepare may have rewritten it)."""
    read = []

    def sh(*args, **kwargs):
        if args[:2] == ("docker", "run"):
            read.append(Path(args[args.index("--env-file") + 1]).read_text())
            return subprocess.CompletedProcess(args, 0, "container check: PASS nccl: pinned\n", "")
        return subprocess.CompletedProcess(args, 0, "sha256:aaa\n" if "inspect" in args else "", "")

    monkeypatch.setattr(lane_io, "sh", sh)
    p = _with(_nccl_plan(ctl), nccl_pin="/opt/nccl/lib/libnccl.so.2",
              container_check={"programs": "/p", "mount": "/run/p", "args": ["--nccl-version", "2.30.7"]})
    mine = Path(p.nccl_env.file)
    ok, _ = lane_rank.container_check(p)  # the search for libnccl copies, then the check: two docker runs
    assert ok and len(read) == 2 and read[0] == read[1] == mine.read_text()
    variables = [line.split("=")[0] for line in read[0].splitlines() if line and not line.startswith("#")]
    assert "NCCL_PROTO=LL\n" in read[0] and variables == ["NCCL_DEBUG", "NCCL_PROTO", "LD_PRELOAD", "NCCL_ALGO"]
    assert stat.S_IMODE(mine.stat().st_mode) == 0o600
    assert sorted(f.name for f in mine.parent.iterdir()) == ["sim.nccl-copies", "sim.nccl.env"]  # none half-written
    Path(p.nccl_env.node).write_text("NCCL_DEBUG=WARN\nNCCL_IB_MERGE_NICS=1\n")  # prepare wrote it again
    argv = lane_rank.docker_run(p, "aaaaaaaaaaaa")
    assert argv[argv.index("--env-file") + 1] == str(mine)
    assert [line for line in mine.read_text().splitlines() if not line.startswith("#")] == [
        "NCCL_DEBUG=WARN", "NCCL_ALGO=Ring", "NCCL_PROTO=LL"]
    plan = ctl.tmp / "sim.json"
    plan.write_text(p.to_json())
    mine.unlink()
    assert lane_trial.cmd_trial_rank(str(plan), "VLLM_X", "1") == 0 and mine.exists()  # a trial's ranks get it too


def test_a_lane_without_nccl_changes_passes_the_nodes_file_as_it_is(ctl, capsys):
    p = _plan(ctl)
    assert lane_rank.write_nccl_env(p) == "" and lane_rank.rank_options(p) == p.docker_options
    plan = ctl.tmp / "sim.json"
    plan.write_text(p.to_json())
    assert lane_ctl.cmd_nccl_env(str(plan)) == 0 and capsys.readouterr().out == ""
    assert not (ctl.tmp / "marks").exists()


def test_the_nccl_env_verb_writes_the_file_and_says_where(ctl, capsys):
    """What the head's in-image validation runs first: its docker run names the same file."""
    p = _nccl_plan(ctl, {"NCCL_PROTO": "LL"})
    plan = ctl.tmp / "sim.json"
    plan.write_text(p.to_json())
    assert lane_ctl.cmd_nccl_env(str(plan)) == 0
    assert capsys.readouterr().out == p.nccl_env.file + "\n"
    assert "NCCL_PROTO=LL\n" in Path(p.nccl_env.file).read_text()


def test_no_node_nccl_file_no_start(ctl, capsys):
    p = _nccl_plan(ctl)
    Path(p.nccl_env.node).unlink()
    said = f"the node's NCCL environment {p.nccl_env.node} cannot be read (No such file or directory): " \
           "deploys/prepare.py writes it"
    assert lane_rank.container_check(p) == (False, [f"container check: FAIL nccl: {said}"])
    plan = ctl.tmp / "sim.json"
    plan.write_text(p.to_json())
    assert lane_ctl.cmd_nccl_env(str(plan)) == 1 and said in capsys.readouterr().err
    assert not Path(p.nccl_env.file).exists()


class _Health(http.server.BaseHTTPRequestHandler):
    answers: list[int] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(self.answers.pop(0) if self.answers else 200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def _dropper(ctl, monkeypatch, capsys, spec, ended=None):
    drops = ctl.tmp / "drop_caches"
    drops.write_text("0")
    writes = []
    monkeypatch.setattr(lane_rank, "DROP_CACHES", str(drops))
    monkeypatch.setattr(os, "sync", lambda: writes.append(1))
    lane_rank.drop_caches_while_loading(_plan(ctl, drop_caches=spec), ended or threading.Event())
    return len(writes), drops.read_text(), capsys.readouterr().err


def test_the_dropper_drops_while_loading_and_stops_when_the_api_answers(ctl, monkeypatch, capsys, health):
    _Health.answers = [503, 503, 503]  # loading: /health not 200 yet
    url = f"http://127.0.0.1:{health.server_address[1]}/health"
    drops, value, out = _dropper(ctl, monkeypatch, capsys, {"every": 0.05, "at_most": 60, "until": url})
    assert drops == 3 and value == "3\n"
    assert f"page-cache dropper: every 0.05s while the weights load, until {url} answers" in out
    assert "and 3 drops: the lane is ready" in out


def test_the_dropper_gives_up_and_stops_with_the_container(ctl, monkeypatch, capsys):
    closed = "http://127.0.0.1:9/health"  # nothing answers: still loading
    drops, _, out = _dropper(ctl, monkeypatch, capsys, {"every": 0.05, "at_most": 0.3, "until": closed})
    assert drops >= 2 and "drops: 0.3s passed" in out
    ended = threading.Event()
    ended.set()
    drops, value, out = _dropper(ctl, monkeypatch, capsys, {"every": 0.05, "at_most": 60, "until": closed}, ended)
    assert drops == 0 and value == "0" and "0 drops: the rank's container ended" in out
    assert _dropper(ctl, monkeypatch, capsys, None) == (0, "0", "")  # instanttensor, or set off: nothing


def test_clean_removes_the_shared_memory_no_live_process_holds_then_drops_the_page_cache(ctl, monkeypatch, capsys):
    shm, drops = ctl.tmp / "shm", ctl.tmp / "drop_caches"
    shm.mkdir()
    (shm / "psm_1a2b").write_bytes(b"x" * 2**20)
    (shm / "psm_ffff").write_bytes(b"")
    (shm / "torch_123").write_bytes(b"keep")  # not PSM's: another tenant's
    (shm / "sem.mp-dead1").write_bytes(b"s")  # a killed start's semaphore
    (shm / "sem.mp-live2").write_bytes(b"s")  # a live process's: it has it mapped
    (shm / "psm_open").write_bytes(b"s")  # ... or open
    proc = ctl.tmp / "proc"
    (proc / "41" / "fd").mkdir(parents=True)
    (proc / "41" / "maps").write_text(f"7f00-7f01 rw-s 00000000 00:1a 12 {shm}/sem.mp-live2\n")
    (proc / "41" / "fd" / "3").symlink_to(shm / "psm_open")
    monkeypatch.setattr(lane_rank, "PROC", str(proc))
    monkeypatch.setattr(lane_rank, "SHM", str(shm))
    monkeypatch.setattr(lane_rank, "DROP_CACHES", str(drops))
    plan = ctl.tmp / "sim.json"
    plan.write_text(_plan(ctl).to_json())
    assert lane_ctl.cmd_clean(str(plan)) == 0
    assert sorted(p.name for p in shm.iterdir()) == ["psm_open", "sem.mp-live2", "torch_123"]
    assert drops.read_text() == "3\n" and "removed 3 stale" in capsys.readouterr().err
    assert lane_ctl.cmd_clean(str(plan)) == 0 and "removed" not in capsys.readouterr().err


def test_compile_caches_are_kept_per_image_and_a_new_image_starts_cold(ctl, capsys):
    root = ctl.tmp / "compile" / "sim"
    p = _plan(ctl, compile_cache={"root": str(root), "mounts": {"vllm": "/root/.cache/vllm", "triton": "/root/.triton"}})
    lane_rank.prepare_compile_cache(p, "aaaaaaaaaaaa")
    assert "compile caches of image aaaaaaaaaaaa: cold (nothing compiled yet)" in capsys.readouterr().err
    (root / "aaaaaaaaaaaa" / "vllm" / "torch_compile_cache").mkdir()
    (root / "aaaaaaaaaaaa" / "vllm" / "torch_compile_cache" / "graph.py").write_bytes(b"x" * 2**20)
    (root / "aaaaaaaaaaaa" / "triton" / "kernel.json").write_bytes(b"x" * 3000)
    lane_rank.prepare_compile_cache(p, "aaaaaaaaaaaa")  # a restart of the same image: warm
    assert "compile caches of image aaaaaaaaaaaa: warm (vllm 1.0 MiB, triton 2 KiB)" in capsys.readouterr().err
    assert docker.cache_mounts(p, "aaaaaaaaaaaa") == [
        "-v", f"{root}/aaaaaaaaaaaa/vllm:/root/.cache/vllm", "-v", f"{root}/aaaaaaaaaaaa/triton:/root/.triton"]
    lane_rank.prepare_compile_cache(p, "bbbbbbbbbbbb")  # a new image: the old one's caches go
    err = capsys.readouterr().err
    assert "compile caches of image aaaaaaaaaaaa removed: a new image starts cold" in err
    assert "compile caches of image bbbbbbbbbbbb: cold" in err
    assert sorted(d.name for d in root.iterdir()) == ["bbbbbbbbbbbb"]


def test_a_trial_rank_runs_with_the_compile_caches_a_start_of_the_lane_mounts(ctl, monkeypatch):
    """A bracketing's trial finds what earlier starts compiled, and leaves the next start warm."""
    runs = []

    def sh(*args, **kwargs):
        if args[:2] == ("docker", "run"):
            runs.append(list(args))
        return subprocess.CompletedProcess(args, 0, "sha256:abcdef0123456789\n" if "inspect" in args else "", "")

    monkeypatch.setattr(lane_io, "sh", sh)
    monkeypatch.setattr(lane_rank, "nccl_copies", lambda p: [])
    root = ctl.tmp / "compile" / "sim"
    p = _plan(ctl, compile_cache={"root": str(root), "mounts": {"vllm": "/root/.cache/vllm", "triton": "/root/.triton"}})
    plan = ctl.tmp / "sim.json"
    plan.write_text(p.to_json())
    assert lane_trial.cmd_trial_rank(str(plan), "VLLM_CPU_KVCACHE_SPACE", "2") == 0
    [argv] = runs
    assert argv[argv.index("--name") + 1] == "vllm_node-trial"
    for mount in docker.cache_mounts(p, "abcdef012345"):
        assert mount in argv, argv
    assert (root / "abcdef012345" / "vllm").is_dir() and (root / "abcdef012345" / "triton").is_dir()


# Supervision (issue 18): unreachable is not dead, restarts back off, no worker outlives its lane
# ------------------------------------------------------------------------------------------------


class _Child:
    """A rank's container that runs until ``ends`` watches have passed (never, by default)."""

    def __init__(self, ends=None, code=0):
        self.ends, self.code, self.watches = ends, code, 0

    def wait(self, timeout=None):
        if timeout is None or (self.ends is not None and self.watches >= self.ends):
            return self.code
        self.watches += 1
        raise subprocess.TimeoutExpired("docker", timeout)


def _head(ctl, **extra):
    return _plan(ctl, **{"workers": [{"ip": "10.0.0.2", "rank": 1}], **extra})


def _watch(ctl, monkeypatch, plan, states, completions, ends=None):
    """``watch_head`` over a worker whose states (``worker_states``' answers) and the API's completions
    come in the order given; returns the unit's status, what it said, and how many completions it asked."""
    asked, stopped = [], []
    monkeypatch.setattr(lane_watch, "worker_states", lambda p: states.pop(0) if len(states) > 1 else states[0])
    monkeypatch.setattr(lane_io, "request", lambda p, path, timeout=10: (200, {}))
    monkeypatch.setattr(lane_watch, "warm", lambda p: True)
    monkeypatch.setattr(lane_io, "completion", lambda p, timeout=60: (asked.append(1) or completions.pop(0)))
    monkeypatch.setattr(lane_watch, "stop_workers", lambda p, path: stopped.append(1))
    monkeypatch.setattr(lane_watch, "stop_container", lambda p, child: None)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    said = []
    monkeypatch.setattr(lane_io, "say", said.append)
    code = lane_watch.watch_head(plan, "PLAN", _Child(ends))
    return code, said, len(asked), bool(stopped)


LOST = ([], {"10.0.0.2": "ssh: connect to host 10.0.0.2 port 22: No route to host"})
FINE = ([], {})


def test_an_unreachable_worker_does_not_restart_a_lane_that_completes(ctl, monkeypatch):
    """Lost for five watches, the API asked at each (not every liveness_interval) and answering: the
    lane serves on; reached again, it is said so; the container's own end is what stops the watch."""
    code, said, asked, _ = _watch(ctl, monkeypatch, _head(ctl), [FINE, *[LOST] * 5, FINE],
                                  [(True, "1 completion tokens")] * 6, ends=8)
    assert code == 1 and asked >= 5  # (the container's end: "not serving")
    assert any("rank 1 on 10.0.0.2 not reached (ssh: connect to host 10.0.0.2 port 22: No route to host): "
               "the lane serves on while its API completes, for at most 900s" in line for line in said), said
    assert any("rank 1 on 10.0.0.2 reached again after" in line for line in said), said
    assert not any("restarting the lane" in line for line in said), said


def test_an_unreachable_worker_restarts_the_lane_once_the_api_fails_twice(ctl, monkeypatch):
    code, said, asked, stopped = _watch(ctl, monkeypatch, _head(ctl), [FINE, LOST],
                                        [(True, "ok"), (False, "HTTP 0: timed out"), (False, "HTTP 0: timed out")])
    assert code == 1 and stopped and asked == 3
    assert said[-1] == ("the API stopped completing (HTTP 0: timed out) while rank 1 on 10.0.0.2 is not reached: "
                        "restarting the lane on every node"), said
    assert lane_io.mark(_head(ctl), "stop-reason").read_text().startswith("the API stopped completing")


def test_an_unreachable_worker_restarts_the_lane_after_the_grace(ctl, monkeypatch):
    code, said, _, _ = _watch(ctl, monkeypatch, _head(ctl, unreachable_grace=0), [FINE, LOST], [(True, "ok")] * 9)
    assert code == 1 and "rank 1 on 10.0.0.2 not reached for 0s (ssh: connect to host" in said[-1], said


def test_a_worker_whose_unit_is_down_restarts_the_lane_at_once(ctl, monkeypatch):
    down = ([Worker(ip="10.0.0.2", rank=1)], {})
    code, said, asked, stopped = _watch(ctl, monkeypatch, _head(ctl), [down], [])
    assert (code, asked, stopped) == (1, 0, True)
    assert said[-1] == "rank 1 on 10.0.0.2 is not running: restarting the lane on every node"


def test_a_worker_stopped_by_a_stopper_that_left_its_reason_is_no_failure(ctl, monkeypatch):
    """A teardown stops every node's unit at once, the head's reason left first: a worker that
    stops before the head is the teardown's doing (exit 0, the stopper's reason kept for post)."""
    plan = _head(ctl)
    lane_history.note_stop(plan, "a teardown stops it")
    down = ([Worker(ip="10.0.0.2", rank=1)], {})
    code, said, _, stopped = _watch(ctl, monkeypatch, plan, [down], [])
    assert (code, stopped) == (0, True)
    assert said[-1] == "rank 1 stopped: a teardown stops it", said
    assert lane_io.mark(plan, "stop-reason").read_text() == "a teardown stops it"
    assert lane_history.count_stop(plan, "success", "0") == ("a teardown stops it", False)


def test_worker_states_tells_down_from_unreached(ctl, monkeypatch):
    answers = {"10.0.0.2": subprocess.CompletedProcess([], 3, "failed\n", ""),
               "10.0.0.3": subprocess.CompletedProcess([], 255, "", "Host key verification failed.\n"),
               "10.0.0.4": subprocess.CompletedProcess([], 0, "active\n", "")}
    monkeypatch.setattr(lane_io, "on_worker", lambda ip, *args, timeout=30: answers[ip])
    workers = [{"ip": ip, "rank": rank} for rank, ip in enumerate(answers, 1)]
    down, lost = lane_watch.worker_states(_plan(ctl, workers=workers, unit="u"))
    assert down == [Worker(**workers[0])]
    assert list(lost) == ["10.0.0.3"] and "its SSH host key changed" in lost["10.0.0.3"]


def test_a_worker_that_does_not_answer_in_time_is_not_reached(ctl, monkeypatch):
    def hangs(*args, **kwargs):
        raise subprocess.TimeoutExpired(args, kwargs.get("timeout"))

    monkeypatch.setattr(lane_io, "sh", hangs)
    done = lane_io.on_worker("10.0.0.2", "systemctl", "is-active", "u", timeout=7)
    assert not lane_io.reached(done) and lane_io.ssh_error(done) == "ssh 10.0.0.2: no answer within 7s"


def test_failures_in_a_row_are_counted_with_their_reason_and_back_off(ctl, monkeypatch, capsys):
    p = _plan(ctl)
    assert [lane_history.backoff(n) for n in range(8)] == [0, 5, 10, 20, 40, 80, 120, 120]
    for _ in range(3):
        lane_history.note_stop(p, "rank 1 on 10.0.0.2 is not running")
        lane_history.count_stop(p, "exit-code", "1")
    lane_history.count_stop(p, "exit-code", "1")  # no reason noted: systemd's own words
    assert lane_history.failures(p)["count"] == 4 and lane_history.failures(p)["reason"] == "rank 0 ended (exit-code, status 1)"
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    lane_history.back_off(p)
    assert 39 < slept[0] <= 40
    assert "backing off 40s before the next start: 4 failure(s) in a row" in capsys.readouterr().err
    lane_history.count_stop(p, "success", "0")  # a stop asked for (a converge, an operator): from zero again
    assert lane_history.failures(p) == {}
    lane_history.back_off(p)
    assert len(slept) == 1


def _rendezvous(ctl, monkeypatch, opens, ends=None, **extra):
    said, stopped = [], []
    monkeypatch.setattr(lane_io, "say", said.append)
    monkeypatch.setattr(lane_watch, "tcp_open", lambda host, port: opens.pop(0) if len(opens) > 1 else opens[0])
    monkeypatch.setattr(lane_watch, "stop_container", lambda p, child: stopped.append(1))
    moments = iter(range(0, 10_000, 10))  # every watch 10 s later
    monkeypatch.setattr(time, "monotonic", lambda: next(moments))
    plan = _plan(ctl, **{"rank": 1, "rendezvous": {"host": "10.0.0.1", "port": 29501}, **extra})
    code = lane_watch.watch_rendezvous(plan, _Child(ends=ends))
    return code, said, bool(stopped)


def test_a_worker_that_lost_rank_0_stops_itself(ctl, monkeypatch):
    code, said, stopped = _rendezvous(ctl, monkeypatch, [True, True, False, True, False])
    assert (code, stopped) == (1, True)
    assert said[0] == ("rank 0's rendezvous 10.0.0.1:29501 stopped answering: this rank stops itself if it is "
                       "gone for 60s")
    assert "rank 0's rendezvous 10.0.0.1:29501 answers again after 10s" in said[1]  # a flap is survived
    assert said[-1].startswith("rank 0's rendezvous 10.0.0.1:29501 has been gone for 60s: stopping this rank")


def test_a_worker_that_never_saw_rank_0_stops_after_the_start_timeout(ctl, monkeypatch):
    code, said, stopped = _rendezvous(ctl, monkeypatch, [False], start_timeout=100)
    assert (code, stopped) == (1, True) and "did not answer within 100s" in said[-1], said


def test_a_worker_whose_container_ends_returns_its_status(ctl, monkeypatch):
    code, said, stopped = _rendezvous(ctl, monkeypatch, [True], ends=3)
    assert (code, said, stopped) == (0, [], False)


def test_stopped_is_said_only_when_something_stopped(ctl, monkeypatch):
    answers = [subprocess.CompletedProcess([], 0, "stopped\n", ""), subprocess.CompletedProcess([], 0, "was failed\n", ""),
               subprocess.CompletedProcess([], 255, "", "ssh: connect to host 10.0.0.4 port 22: No route to host")]
    monkeypatch.setattr(lane_io, "on_workers", lambda workers, *args, timeout=30: answers)
    said = []
    monkeypatch.setattr(lane_io, "say", said.append)
    workers = [{"ip": f"10.0.0.{i}", "rank": i - 1} for i in (2, 3, 4)]
    lane_watch.stop_workers(_plan(ctl, workers=workers), "PLAN")
    assert said == ["stopped rank 1 on 10.0.0.2",
                    "rank 3 on 10.0.0.4 not reached to stop it (ssh: connect to host 10.0.0.4 port 22: No route to "
                    "host): it stops itself once rank 0's rendezvous is gone for 60s"]


def test_a_changed_api_key_is_told_by_a_stamp_kept_root_only(ctl):
    """The started mark keeps an HMAC of the key file under a random key of its own (0600): the
    status says "current" or "changed", and no digest of the key leaves the head."""
    key_file = ctl.tmp / "sim.secret.env"
    key_file.write_text("VLLM_API_KEY=sk-one\n")
    p = _plan(ctl, api_key_file=str(key_file))
    stamp = lane_io.key_stamp(p)
    assert stamp == lane_io.key_stamp(p, stamp["key"]) and stamp != lane_io.key_stamp(p)  # each start: a new key
    lane_io.write_private(lane_io.mark(p, "started"), json.dumps({"api_key": stamp}))
    assert stat.S_IMODE(lane_io.mark(p, "started").stat().st_mode) == 0o600
    key_file.write_text("VLLM_API_KEY=sk-two\n")
    assert lane_io.key_stamp(p, stamp["key"]) != stamp
    assert lane_io.key_stamp(p.replace(api_key_file="")) is None


# The restart history (issue 20): every start, ready and stop of the lane, with its reason
# ----------------------------------------------------------------------------------------


@pytest.fixture
def booted(ctl, monkeypatch):
    """This boot's id and uptime, as lane_ctl reads them (``booted["id"]``, ``booted["uptime"]``)."""
    boot, up = ctl.tmp / "boot_id", ctl.tmp / "uptime"
    monkeypatch.setattr(lane_history, "BOOT_ID", str(boot))
    monkeypatch.setattr(lane_history, "UPTIME", str(up))

    class Booted(dict):
        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            (boot if key == "id" else up).write_text(f"{value}\n" if key == "id" else f"{value} 100.00\n")

    state = Booted()
    state["id"], state["uptime"] = "boot-1", 5000.0
    return state


def _historian(ctl, **extra):
    return _head(ctl, **{"digest": "d1", "history": str(ctl.tmp / "state" / "sim.history"), **extra})


def _history(p) -> list[dict]:
    return [json.loads(line) for line in open(p.history).read().splitlines()]


def test_the_history_keeps_the_last_200_events_root_only(ctl, booted):
    p = _historian(ctl)
    for i in range(201):
        lane_history.record(p, "start", f"start #{i}")
    lines = open(p.history).read().splitlines()
    assert len(lines) == lane_history.HISTORY_MAX == 200
    assert json.loads(lines[0])["why"] == "start #1" and json.loads(lines[-1])["why"] == "start #200"
    assert stat.S_IMODE((ctl.tmp / "state" / "sim.history").stat().st_mode) == 0o600
    assert sorted(f.name for f in (ctl.tmp / "state").iterdir()) == ["sim.history"]  # no temp file left
    last = json.loads(lines[-1])
    assert last["event"] == "start" and last["boot"] == "boot-1" and last["digest"] == "d1"
    assert [e["why"] for e in lane_history.events(p, 2)] == ["start #199", "start #200"]


def test_a_worker_keeps_no_history(ctl, booted):
    p = _historian(ctl, history="", rank=1)
    assert lane_history.record(p, "start", "x") is None and lane_history.events(p) == []
    assert not (ctl.tmp / "state").exists()


def test_each_start_reason(ctl, booted):
    p = _historian(ctl)
    booted["uptime"] = 60.0  # no history, the node up a minute: the boot started it
    assert lane_history.start_reason(p) == "boot (the node restarted)"
    booted["uptime"] = 5000.0  # no history, long after boot: nothing of ours started it
    assert lane_history.start_reason(p) == "started by hand (systemctl)"
    lane_history.record(p, "stop", "rank 1 on 10.0.0.2 is not running", failed=True)
    assert lane_history.start_reason(p) == "after a failure: rank 1 on 10.0.0.2 is not running"
    lane_history.note_stop(p, "unused")  # (another mark: not a start's reason)
    lane_io.mark(p, "start-reason").write_text("a converge: its plan changed")
    assert lane_history.start_reason(p) == "a converge: its plan changed"  # the converge's word first...
    assert not lane_io.mark(p, "start-reason").exists()  # ...taken once
    booted["id"] = "boot-2"  # the failed stop was in the last boot: the boot started this one
    assert lane_history.start_reason(p) == "boot (the node restarted)"
    lane_history.record(p, "stop", "stopped on purpose", failed=False)
    assert lane_history.start_reason(p) == "started by hand (systemctl)"
    lane_history.record(p, "start", "started by hand (systemctl)")
    booted["id"] = "boot-3"
    assert lane_history.start_reason(p) == "boot (the node restarted)"


def _placed(ctl, p) -> str:
    path = ctl.tmp / "sim.json"
    path.write_text(p.to_json())
    return str(path)


def test_a_failed_stop_then_the_start_it_causes(ctl, booted, monkeypatch):
    """post records the failed stop with the watch's reason; the next pre (systemd's restart) says so."""
    p = _historian(ctl)
    path = _placed(ctl, p)
    monkeypatch.setattr(lane_watch, "stop_workers", lambda p, path: None)
    monkeypatch.setattr(lane_io, "sh", lambda *a, **k: subprocess.CompletedProcess(a, 0, "running\n", ""))
    monkeypatch.setenv("SERVICE_RESULT", "exit-code")
    monkeypatch.setenv("EXIT_STATUS", "1")
    lane_history.note_stop(p, "the API stopped completing (HTTP 0: timed out)")
    assert lane_ctl.cmd_post(path) == 0
    monkeypatch.setattr(time, "sleep", lambda s: None)  # the back-off
    monkeypatch.setattr(lane_watch, "stop_other_lanes", lambda p: None)
    monkeypatch.setattr(lane_ctl, "check_every_rank", lambda path, p: "")
    monkeypatch.setattr(lane_io, "on_workers", lambda workers, *a, timeout=30: [subprocess.CompletedProcess(a, 0, "", "")])
    assert lane_ctl.cmd_pre(path) == 0
    stop, start = _history(p)
    assert (stop["event"], stop["why"], stop["failed"]) == ("stop", "the API stopped completing (HTTP 0: timed out)", True)
    assert (start["event"], start["why"]) == ("start", "after a failure: the API stopped completing (HTTP 0: timed out)")
    monkeypatch.setenv("SERVICE_RESULT", "success")
    assert lane_ctl.cmd_post(path) == 0  # a stop asked for, no reason left: on purpose
    assert _history(p)[-1]["why"] == "stopped on purpose" and _history(p)[-1]["failed"] is False


def test_the_restart_verb_leaves_both_reasons(ctl, booted, monkeypatch):
    p = _historian(ctl)
    path = _placed(ctl, p)
    ran, answers = [], {"is-active": "active\n", "restart": ""}

    def sh(*args, **kwargs):
        ran.append(args)
        return subprocess.CompletedProcess(args, 1 if answers.get("fails") and args[1] == "restart" else 0,
                                           answers.get(args[1], ""), "")

    monkeypatch.setattr(lane_io, "sh", sh)
    assert lane_ctl.main(["restart", path, "its plan changed; its API key changed"]) == 0
    assert ("systemctl", "restart", "sparkinfra-lane-sim.service") in ran
    assert lane_io.mark(p, "start-reason").read_text() == "a converge: its plan changed; its API key changed"
    assert lane_io.mark(p, "stop-reason").read_text() == "a converge restarts it: its plan changed; its API key changed"
    monkeypatch.setattr(lane_watch, "stop_workers", lambda p, path: None)
    monkeypatch.setenv("SERVICE_RESULT", "success")
    lane_ctl.cmd_post(path)  # what systemd's restart runs: the stop, then the start
    assert lane_history.start_reason(p) == "a converge: its plan changed; its API key changed"
    assert (_history(p)[-1]["why"], _history(p)[-1]["failed"]) == ("a converge restarts it: its plan changed; its "
                                                                    "API key changed", False)
    answers.update({"is-active": "failed\n", "fails": True})  # not running: no stop to explain; failed: no mark
    assert lane_ctl.cmd_restart(path, "its unit is failed") == 1
    assert not lane_io.mark(p, "stop-reason").exists() and not lane_io.mark(p, "start-reason").exists()
    assert lane_ctl.main(["restart", _placed(ctl, p.replace(rank=1)), "x"]) == 2  # the head's verb


def test_a_lane_stopped_for_another_is_told_why(ctl, monkeypatch):
    p = _historian(ctl, workers=[])
    monkeypatch.setattr(lane_io, "other_lane_units", lambda p: ["sparkinfra-lane-sim-b.service"])
    stopped = []
    monkeypatch.setattr(lane_io, "sh", lambda *a, **k: stopped.append(a) or subprocess.CompletedProcess(a, 0, "", ""))
    monkeypatch.setattr(lane_io, "say", lambda line: None)
    lane_watch.stop_other_lanes(p)
    assert (ctl.tmp / "marks" / "sim-b.stop-reason").read_text() == "lane sim starts"
    assert stopped == [("systemctl", "stop", "sparkinfra-lane-sim-b.service")]
    assert lane_io.lane_of_unit(p, "sparkinfra-lane-pair-a.v1.service") == "pair-a.v1"
    assert lane_io.lane_of_unit(p, "docker.service") == ""


def test_the_first_health_answer_is_recorded_as_ready(ctl, booted, monkeypatch):
    p = _historian(ctl)
    lane_history.record(p, "start", "a converge: its plan changed")
    _watch(ctl, monkeypatch, p, [FINE], [(True, "1 completion tokens")] * 3, ends=3)
    start, ready = _history(p)
    assert ready["event"] == "ready" and ready["why"] == "its API answers /health"
    assert 0 <= ready["seconds"] <= 5


def test_status_and_history_show_the_last_events(ctl, booted, monkeypatch, capsys):
    p = _historian(ctl)
    path = _placed(ctl, p)
    for i in range(7):
        lane_history.record(p, "start" if i % 2 else "stop", f"#{i}")
    monkeypatch.setattr(lane_io, "sh", lambda *a, **k: subprocess.CompletedProcess(a, 0, "", ""))
    assert lane_ctl.main(["status", path, "--local"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert [e["why"] for e in status["history"]] == ["#2", "#3", "#4", "#5", "#6"]
    assert lane_ctl.main(["history", path, "3"]) == 0
    assert [json.loads(line)["why"] for line in capsys.readouterr().out.splitlines()] == ["#4", "#5", "#6"]
    assert lane_ctl.main(["history", path]) == 0 and len(capsys.readouterr().out.splitlines()) == 7
    assert lane_ctl.main(["status", _placed(ctl, p.replace(rank=1, history="")), "--local"]) == 0
    assert "history" not in json.loads(capsys.readouterr().out)  # a worker keeps none


# A start's phases, read from vLLM's own lines (issue 20)
# -------------------------------------------------------

VLLM_LOGS = Path(__file__).resolve().parent / "fixtures" / "vllm_logs"


def _log_lines() -> list[str]:
    return [line for log in sorted(VLLM_LOGS.glob("*.log")) for line in log.read_text().splitlines()]


def test_every_vllm_pattern_the_runner_uses_matches_a_real_log_line(ctl):
    """lane_ctl cannot import sparkinfra: its copies of vLLM's words are checked against the real logs."""
    lines = _log_lines()
    patterns = [alternative for _, alternatives in lane_watch.PHASES for alternative in alternatives]
    patterns += [lane_watch.SHARDS.pattern, *map(re.escape, lane_trial.FAILED_START)]
    unmatched = [pattern for pattern in patterns if not any(re.search(pattern, line) for line in lines)]
    assert len(patterns) > 10 and not unmatched, unmatched


def test_the_phases_follow_a_real_start_and_never_go_back(ctl):
    lines = (VLLM_LOGS / "seed001_v0.22.1_gmu0.929_ok.log").read_text().splitlines()
    seen, phase, detail = [], -1, ""
    for line in lines:
        phase, detail = lane_watch.phase_of([line], phase, detail)
        if not seen or seen[-1] != phase:
            seen.append(phase)
    assert seen == [-1, 0, 1, 2, 3, 4, 5]
    loading = (VLLM_LOGS / "v0.22.1_incomplete_loading.log").read_text().splitlines()
    assert lane_watch.phase_of(loading, -1) == (1, "21/50 shards")
    assert lane_watch.phase_of(["(Worker_TP0 pid=298) INFO [x.py:1] Starting to load model org/drafter..."], 3) == (3, "")


def test_wait_ready_says_each_phase_once_then_every_15_seconds(ctl, monkeypatch, capsys):
    lines = (VLLM_LOGS / "seed001_v0.22.1_gmu0.929_ok.log").read_text().splitlines()
    polls = [[], [], *[[line] for line in lines], []]  # then nothing new
    shards = next(i for i, poll in enumerate(polls) if poll and "checkpoint shards" in poll[0])
    polls[shards + 1:shards + 1] = [[]] * 8  # 16 s more of loading: said again, with its shards
    clock = iter(range(0, 10_000, 2))  # every poll 2 s later
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(time, "sleep", lambda s: None)
    monkeypatch.setattr(lane_watch, "Journal", lambda unit: type("J", (), {"new": lambda self: polls.pop(0) if polls else []})())
    monkeypatch.setattr(lane_io, "unit_state", lambda unit: "active")
    monkeypatch.setattr(lane_io, "restarts", lambda unit: 0)
    monkeypatch.setattr(lane_io, "port_open", lambda p: not polls)  # the API once the log is read
    monkeypatch.setattr(lane_io, "request", lambda p, path, timeout=10: (200, {}))
    monkeypatch.setattr(lane_io, "completion", lambda p, max_tokens=1, timeout=60: (True, "8 completion tokens"))
    path = _placed(ctl, _head(ctl))
    assert lane_ctl.cmd_wait_ready(path, 900) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("lane sim: ready in ") and out[-1].endswith("s (8 completion tokens)")
    said = [re.fullmatch(r"lane sim: (.*?)(?: \((\d+/\d+ shards)\))?, (\d+)s elapsed", line).groups() for line in out[:-1]]
    names = list(dict.fromkeys(name for name, _, _ in said))
    assert names == ["starting vLLM", "starting the engine", "loading weights",
                     "compiling (torch.compile), profiling memory", "KV cache sized: warming up (graph capture on a GPU)",
                     "starting the API server", "first completion"], out
    assert ("loading weights", "50/50 shards") in [(name, detail) for name, detail, _ in said]
    for (name, _, at), (after, _, then) in zip(said, said[1:]):
        assert name != after or int(then) - int(at) >= 15, out  # the same phase: once every 15 s at most


def test_wait_ready_keeps_its_failure_messages(ctl, monkeypatch, capsys):
    clock = iter(range(0, 10_000, 2))
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(time, "sleep", lambda s: None)
    monkeypatch.setattr(lane_watch, "Journal", lambda unit: type("J", (), {"new": lambda self: []})())
    states = ["activating", "activating", "failed"]
    monkeypatch.setattr(lane_io, "unit_state", lambda unit: states.pop(0))
    monkeypatch.setattr(lane_io, "port_open", lambda p: False)
    monkeypatch.setattr(lane_io, "sh", lambda *a, **k: subprocess.CompletedProcess(a, 0, "rank 0 said why\n", ""))
    path = _placed(ctl, _head(ctl))
    assert lane_ctl.cmd_wait_ready(path, 900) == 1
    captured = capsys.readouterr()
    assert captured.out == "lane sim: before the start: container checks, the workers, 2s elapsed\n"
    assert captured.err.startswith("lane sim: unit failed after 6s; its last lines:\nrank 0 said why")
    monkeypatch.setattr(lane_io, "unit_state", lambda unit: "active")
    monkeypatch.setattr(lane_io, "restarts", lambda unit: 0)
    assert lane_ctl.cmd_wait_ready(path, 5) == 1
    assert "not ready after 5s (waiting for port; its phase: starting vLLM)" in capsys.readouterr().err


def test_the_journal_is_read_from_the_starts_beginning_then_only_new_lines(ctl, monkeypatch):
    asked, answers = [], {"invocation": "inv-1"}

    def sh(*args, **kwargs):
        asked.append(args)
        if args[:2] == ("systemctl", "show"):
            return subprocess.CompletedProcess(args, 0, answers["invocation"] + "\n", "")
        after = [a for a in args if a.startswith("--after-cursor=")]
        text = "line 3\n-- cursor: c3\n" if after else "line 1\nline 2\n-- cursor: c2\n"
        return subprocess.CompletedProcess(args, 0, text, "")

    monkeypatch.setattr(lane_io, "sh", sh)
    journal = lane_watch.Journal("sparkinfra-lane-sim.service")
    assert journal.new() == ["line 1", "line 2"]
    assert asked[-1][:2] == ("journalctl", "_SYSTEMD_INVOCATION_ID=inv-1") and "--show-cursor" in asked[-1]
    assert journal.new() == ["line 3"] and "--after-cursor=c2" in asked[-1]
    assert journal.new() == ["line 3"] and "--after-cursor=c3" in asked[-1]
    answers["invocation"] = "inv-2"  # another start: from its beginning
    assert journal.new() == ["line 1", "line 2"] and asked[-1][1] == "_SYSTEMD_INVOCATION_ID=inv-2"
    answers["invocation"] = ""  # the unit never started: nothing to read
    assert journal.new() == [] and asked[-1][0] == "systemctl"


def test_a_failed_starts_first_error_is_named_not_vllms_pointer_to_it():
    lines = ["INFO loading",
             "(APIServer pid=1) WARNING 12-07 08:59:29 [system_utils.py:255] Found ulimit of 20000 and failed to "
             "automatically increase with error ValueError: not allowed. This can cause fd limit errors.",
             "(EngineCore pid=51) RuntimeError: mod sparkbed-engine-hooks: the engine refuses to start",
             "Traceback (most recent call last):",
             "RuntimeError: Engine core initialization failed. See root cause above."]
    assert lane_watch.first_error(lines) == lines[2]
    assert lane_watch.first_error(lines[3:]) is None and lane_watch.first_error(["KeyError: 'x'"]) == "KeyError: 'x'"


def test_a_verb_whose_plan_is_not_on_the_node_says_so_without_a_traceback(tmp_path, capsys):
    missing = str(tmp_path / "sim.json")
    assert lane_ctl.main(["stop", missing]) == lane_ctl.NOT_PLACED
    assert capsys.readouterr().err == (f"lane_ctl stop: no plan {missing} on this node (the lane is not placed here: "
                                       "a converge places it)\n")


def test_a_failed_liveness_completion_is_asked_again_at_the_next_watch_not_after_the_interval(ctl, monkeypatch):
    """A wedged engine (no worker lost): after one failed completion the next comes at the next watch,
    so the lane restarts within the interval, two timeouts and a watch (``serving.wedge_bound``)."""
    clock = iter(range(0, 100_000))  # one second a reading: a 30 s interval is many watches
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    child, at = _Child(), []
    answers = [(True, "ok"), (False, "HTTP 0: timed out"), (False, "HTTP 0: timed out")]
    monkeypatch.setattr(lane_watch, "worker_states", lambda p: FINE)
    monkeypatch.setattr(lane_io, "request", lambda p, path, timeout=10: (200, {}))
    monkeypatch.setattr(lane_watch, "warm", lambda p: True)
    monkeypatch.setattr(lane_io, "completion", lambda p, timeout=60: at.append(child.watches) or answers.pop(0))
    monkeypatch.setattr(lane_watch, "stop_workers", lambda p, path: None)
    monkeypatch.setattr(lane_watch, "stop_container", lambda p, c: None)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(lane_io, "say", lambda line: None)
    assert lane_watch.watch_head(_head(ctl, liveness_interval=30, watch_grace=0), "PLAN", child) == 1
    assert at[1] - at[0] > 3 and at[2] - at[1] == 1, at  # the interval, then at once
