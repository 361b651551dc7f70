"""
The stage's progress at pyinfra's default verbosity: the download script
(``sparkinfra/scripts/hf_download.py``) run as the head runs it (``python3 -c <text> ARGS``),
against a stand-in ``huggingface_hub`` that writes a blob slowly and against the real client and
the bed's hub stand-in (``sparkbed.hub``, on 127.0.0.1); and the stage operations that yield their
long command through ``progress.shown`` (printed as it runs), or nothing when there is nothing to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from paramiko import SSHException
from pyinfra.api import FunctionCommand, StringCommand
from pyinfra.context import ctx_host, ctx_state

from sparkbed import hub
from sparkinfra import progress, scripts, transfer
from sparkinfra.facts.stage import snapshot_tool_command
from sparkinfra.operations.stage import (
    HF_TOKEN_FILE,
    snapshot_downloaded,
    snapshot_manifest,
    snapshot_pulled,
    snapshot_served,
    snapshot_synced,
)
from sparkinfra.scripts import hf_download

from test_operations import FakeHost, rendered

SHA = "0123456789abcdef0123456789abcdef01234567"
REPO = "org/model"
TOKEN = "hf_test_token_0123456789"
MIB = 1 << 20
BLOB = "a" * 64  # the blob the stand-in writes (an LFS file's sha256)
OTHER = "b" * 64  # another revision's blob, already in the cache
PROGRESS = rf"download {REPO}@{SHA[:12]}: (\d+) of (\d+) MiB, \d+ MiB/s(?:, ETA \d+ s)?"
PROGRESS_UNKNOWN = rf"download {REPO}@{SHA[:12]}: (\d+) MiB, \d+ MiB/s"
DONE = rf"download {REPO}: (\d+) MiB in (\d+) s"

# Runs the script's text as the head does, its token file moved out of /run.
RUN = ("import sys; ns = {'__name__': 'hf_download'}; exec(sys.argv[1], ns); ns['TOKEN_FILE'] = sys.argv[2]; "
       "sys.exit(ns['main'](sys.argv[3:]))")

FAKE_HUB = '''
import json, os, time
from types import SimpleNamespace
assert os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "1", "imported with its progress bars on"
SIZES = json.loads(os.environ["FAKE_SIZES"])
LOG = os.environ["FAKE_LOG"]

def _log(*words):
    with open(LOG, "a") as f:
        f.write(" ".join(map(str, words)) + "\\n")

class HfApi:
    def model_info(self, repo, revision=None, files_metadata=False, token=None):
        _log("model_info", repo, revision, files_metadata)
        if SIZES is None:
            raise OSError("no model info here")
        lfs = SimpleNamespace(sha256=SIZES["blob"], size=SIZES["size"], pointer_size=130)
        return SimpleNamespace(siblings=[
            SimpleNamespace(rfilename="model.safetensors", size=SIZES["size"], blob_id="c" * 40, lfs=lfs),
            SimpleNamespace(rfilename="config.json", size=2, blob_id="d" * 40, lfs=None)])

    def list_repo_tree(self, repo, revision=None, recursive=False, token=None):
        _log("list_repo_tree", repo, revision)
        raise OSError("no listing here")

def snapshot_download(repo, revision=None, cache_dir=None, token=None):
    _log("snapshot_download", repo, revision, cache_dir, token)
    if os.environ.get("FAKE_FAIL"):
        raise OSError("the hub went away")
    blobs = os.path.join(cache_dir, "models--" + repo.replace("/", "--"), "blobs")
    os.makedirs(blobs, exist_ok=True)
    part = os.path.join(blobs, os.environ["FAKE_BLOB"] + ".x1.incomplete")
    with open(part, "wb") as f:
        for _ in range(3):
            f.write(b"\\0" * (1 << 20))
            f.flush()
            time.sleep(float(os.environ["FAKE_PAUSE"]))
    os.replace(part, part[: -len(".x1.incomplete")])
    with open(os.path.join(blobs, "d" * 40), "w") as f:
        f.write("{}")
    return os.path.join(cache_dir, "snapshots", revision)
'''


def download(tmp_path: Path, sizes: dict | None, *, fail: bool = False, pause: float = 1.1,
             token: str | None = TOKEN) -> tuple[subprocess.CompletedProcess, list[tuple[float, str]], float, str]:
    """``hf_download.py`` against the stand-in client (3 MiB in three parts ``pause`` s apart),
    PROGRESS_EVERY=1: (process, (time, line) of its stdout, seconds, what the stand-in was asked)."""
    fake = tmp_path / "fake"
    (fake / "huggingface_hub").mkdir(parents=True, exist_ok=True)
    (fake / "huggingface_hub" / "__init__.py").write_text(FAKE_HUB)
    blobs = tmp_path / "cache" / "models--org--model" / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / OTHER).write_bytes(b"\0" * MIB)  # another revision's: not this download's bytes
    token_file = tmp_path / "hf_token"
    if token:
        token_file.write_text(token + "\n")
    env = {**os.environ, "PYTHONPATH": str(fake), "PROGRESS_EVERY": "1", "FAKE_SIZES": json.dumps(sizes),
           "FAKE_LOG": str(tmp_path / "asked"), "FAKE_BLOB": BLOB, "FAKE_PAUSE": str(pause),
           **({"FAKE_FAIL": "1"} if fail else {})}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN, scripts.text("hf_download.py"), str(token_file), REPO, SHA, str(tmp_path / "cache")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = [(time.monotonic() - began, line.rstrip("\n")) for line in proc.stdout]
    proc.stderr_text = proc.stderr.read()
    proc.wait(timeout=30)
    return proc, lines, time.monotonic() - began, (tmp_path / "asked").read_text()


def spaced(lines: list[tuple[float, str]], took: float) -> bool:
    """At most one line a second (PROGRESS_EVERY=1)."""
    return len(lines) <= took + 1 and all(b - a > 0.5 for (a, _), (b, _) in zip(lines, lines[1:]))


# The download script
# -------------------


def test_download_shows_bytes_of_the_revision_rate_and_eta_once_a_period(tmp_path):
    proc, lines, took, asked = download(tmp_path, {"blob": BLOB, "size": 3 * MIB})
    assert proc.returncode == 0, proc.stderr_text
    assert asked.splitlines()[0] == f"model_info {REPO} {SHA} True"
    assert f"snapshot_download {REPO} {SHA} {tmp_path / 'cache'} {TOKEN}" in asked  # the token, from its file
    *progress, (_, last) = lines
    found = [re.fullmatch(PROGRESS, line) for _, line in progress]
    assert progress and all(found), progress
    assert spaced(progress, took), progress
    done = [int(m[1]) for m in found]
    assert {m[2] for m in found} == {"3"} and done == sorted(done) and 1 <= done[0] and done[-1] <= 3, progress
    assert any(", ETA " in line for _, line in progress)
    m = re.fullmatch(DONE, last)
    assert m and m[1] == "3" and 3 <= int(m[2]) <= took + 1, last  # the other revision's blob is not counted
    assert TOKEN not in proc.stderr_text + "".join(line for _, line in lines)


def test_download_of_an_unknown_size_shows_what_it_fetched(tmp_path):
    proc, lines, took, asked = download(tmp_path, None)
    assert proc.returncode == 0, proc.stderr_text
    assert [line.split()[0] for line in asked.splitlines()] == ["model_info", "list_repo_tree", "snapshot_download"]
    *progress, (_, last) = lines
    found = [re.fullmatch(PROGRESS_UNKNOWN, line) for _, line in progress]
    assert progress and all(found) and spaced(progress, took), progress
    assert all(int(m[1]) <= 3 for m in found), progress  # not the 1 MiB that was there before
    assert re.fullmatch(DONE, last)[1] == "3", last


def test_a_short_download_prints_only_its_last_line(tmp_path):
    proc, lines, _, _ = download(tmp_path, {"blob": BLOB, "size": 3 * MIB}, pause=0.05, token=None)
    assert proc.returncode == 0, proc.stderr_text
    assert [re.fullmatch(DONE, line)[1] for _, line in lines] == ["3"]


def test_a_failed_download_is_one_line_on_stderr(tmp_path):
    proc, lines, _, _ = download(tmp_path, {"blob": BLOB, "size": 3 * MIB}, fail=True)
    assert proc.returncode == 1 and lines == []
    assert proc.stderr_text == f"download {REPO}@{SHA[:12]} failed: OSError: the hub went away\n"


def test_the_bytes_counted_are_the_revisions_blobs_at_most_their_size(tmp_path):
    sizes = {BLOB: 3 * MIB, "c" * 40: 10}
    (tmp_path / f"{BLOB}.incomplete").write_bytes(b"\0" * 500)  # 0.x's partial file, left by an earlier run
    (tmp_path / f"{BLOB}.k3j.incomplete").write_bytes(b"\0" * 700)  # 1.x's partial of this run: the larger
    (tmp_path / ("c" * 40)).write_bytes(b"\0" * 20)  # longer than the hub says: counts its size
    (tmp_path / OTHER).write_bytes(b"\0" * 1000)  # not this revision's
    assert hf_download.have(str(tmp_path), sizes) == 700 + 10
    assert hf_download.have(str(tmp_path), None) == 500 + 700 + 20 + 1000
    assert hf_download.have(str(tmp_path / "nothing"), sizes) == 0
    assert hf_download.progress_line("x", 91 * MIB, 192 * MIB, 18 * MIB) == "x: 91 of 192 MiB, 18 MiB/s, ETA 5 s"
    assert hf_download.progress_line("x", 91 * MIB, 192 * MIB, 0) == "x: 91 of 192 MiB, 0 MiB/s"
    assert hf_download.progress_line("x", 91 * MIB, None, 18 * MIB) == "x: 91 MiB, 18 MiB/s"


# The real client against the bed's hub stand-in
# ----------------------------------------------

FILES = {"config.json": b"{}", "sub/notes.txt": b"nested\n", "model.safetensors": random.Random(0).randbytes(3 * MIB)}


@pytest.fixture
def endpoint(tmp_path):
    repo = tmp_path / "hub" / "org" / "model"
    for rel, data in FILES.items():
        (repo / SHA / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / SHA / rel).write_bytes(data)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA + "\n")
    server = hub.serve(tmp_path / "hub", "127.0.0.1", 0, token=TOKEN)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def real_download(tmp_path: Path, endpoint: str, token: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf_home"), HF_HUB_DISABLE_TELEMETRY="1")
    (tmp_path / "hf_token").write_text(token)
    return subprocess.run(
        [sys.executable, "-c", RUN, scripts.text("hf_download.py"), str(tmp_path / "hf_token"), *args],
        env=env, capture_output=True, text=True, timeout=60)


def test_the_real_client_learns_the_revisions_size_from_the_hub_stand_in(tmp_path, endpoint):
    """``model_info(files_metadata=True)``: each file's blob name as the cache will have it, and its size."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf_home"))
    code = ("import json, huggingface_hub as hh; from sparkinfra.scripts import hf_download as d; "
            f"print(json.dumps(d.revision_blobs(hh, {REPO!r}, 'main', None)))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    big = FILES["model.safetensors"]
    assert got[hashlib.sha256(big).hexdigest()] == len(big)
    assert got[hashlib.sha1(b"blob 2\0{}").hexdigest()] == 2
    assert sum(got.values()) == sum(map(len, FILES.values()))


def test_the_real_client_downloads_through_the_gate_and_prints_its_last_line(tmp_path, endpoint):
    proc = real_download(tmp_path, endpoint, TOKEN, REPO, "main", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(rf"download {REPO}: 3 MiB in \d+ s\n", proc.stdout), proc.stdout
    snapshot = tmp_path / "cache" / "models--org--model" / "snapshots" / SHA
    assert (snapshot / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    assert TOKEN not in proc.stdout + proc.stderr


def test_the_real_client_with_a_wrong_token_fails_in_one_line_without_it(tmp_path, endpoint):
    proc = real_download(tmp_path, endpoint, "hf_wrong_token_987", REPO, SHA, str(tmp_path / "cache"))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith(f"download {REPO}@{SHA[:12]} failed: ") and "401" in proc.stderr, proc.stderr
    assert "hf_wrong_token_987" not in proc.stderr



def test_the_hubs_refusal_names_the_controllers_token_variable(tmp_path, endpoint):
    """Gated (401): with no token, the variable to set; with a refused one, where it came from."""
    none = real_download(tmp_path, endpoint, "", REPO, SHA, str(tmp_path / "cache"), "HF_TOKEN")
    assert none.returncode == 1 and "401" in none.stderr, none.stderr
    assert none.stderr.rstrip().endswith("(sent no token: the controller's HF_TOKEN is unset or empty; "
                                         "export it and converge again)"), none.stderr
    wrong = real_download(tmp_path, endpoint, "hf_wrong_token_987", REPO, SHA, str(tmp_path / "cache"), "SITE_HF")
    assert wrong.returncode == 1, wrong.stderr
    assert "(sent the token from the controller's SITE_HF: the Hub refuses it" in wrong.stderr, wrong.stderr
    assert "hf_wrong_token_987" not in wrong.stderr


# The operations: their long command shown as it runs, nothing when there is nothing to do
# --------------------------------------------------------------------------------------


def shown_command(command):
    assert isinstance(command, FunctionCommand) and command.function.__name__.startswith("shown("), command
    return command.command


CACHE = "/var/lib/sparkinfra/hf"
REPO_DIR = transfer.repo_dir(CACHE, REPO)


def downloaded(facts: list[dict], monkeypatch, token: str = "") -> tuple[list, list[str]]:
    if token:
        monkeypatch.setenv("SPARKINFRA_TEST_HF_TOKEN", token)
    else:
        monkeypatch.delenv("SPARKINFRA_TEST_HF_TOKEN", raising=False)
    host = FakeHost("spark-1", facts)
    with ctx_state.use(SimpleNamespace(config=SimpleNamespace(DIFF=False))), ctx_host.use(host):
        commands = list(snapshot_downloaded._inner(repo=REPO, revision=SHA, cache_dir=CACHE, image="vllm-node:1",
                                                   token_env="SPARKINFRA_TEST_HF_TOKEN"))
    return commands, host.noops


def test_snapshot_downloaded_runs_the_download_script_shown_with_its_token_as_a_file(monkeypatch):
    facts = [{"fact": "Directory", "args": {"path": f"{REPO_DIR}/snapshots/{SHA}"}, "value": None}]
    commands, _ = downloaded(facts, monkeypatch, token=TOKEN)
    upload, download_ = commands
    assert isinstance(upload, FunctionCommand) and upload.function.__name__ == "upload_token"
    text = rendered(shown_command(download_))
    assert text.startswith(f"mkdir -p {CACHE} && docker run --rm --network host --entrypoint python3 -v {CACHE}:{CACHE} "
                           f"-v {HF_TOKEN_FILE}:/run/hf_token:ro vllm-node:1 -c ")
    script = scripts.text("hf_download.py")
    assert text.endswith(f" {REPO} {SHA} {CACHE} SPARKINFRA_TEST_HF_TOKEN; rc=$?; rm -f {HF_TOKEN_FILE}; exit $rc")
    assert script.splitlines()[-1] in text and "HF_HUB_DISABLE_PROGRESS_BARS" in text
    assert TOKEN not in text + repr(commands)


def test_snapshot_downloaded_of_a_snapshot_that_is_there_yields_nothing(monkeypatch):
    facts = [{"fact": "Directory", "args": {"path": f"{REPO_DIR}/snapshots/{SHA}"}, "value": {"mode": 755}},
             {"fact": "File", "args": {"path": HF_TOKEN_FILE}, "value": None}]
    assert downloaded(facts, monkeypatch) == ([], [f"{REPO}@{SHA} is in {CACHE}"])


def manifest(digest: str | None) -> dict:
    return {"exists": True, "stale": False, "digest": digest, "files": 3, "bytes": 10} if digest else {"exists": False}


def nodes(head_digest: str | None, *worker_digests: str | None, stage: str = "execute",
          unit_active: bool = False) -> tuple:
    """The head and its workers as fake hosts holding their manifests (and the head its unit's state)."""
    fact = {"fact": "SnapshotManifest"}
    unit = {"fact": "SystemdStatus", "args": {"services": transfer.STAGE_UNIT},
            "value": {transfer.STAGE_UNIT: unit_active}}
    head = FakeHost("spark-1", [{**fact, "args": {"repo_dir": REPO_DIR, "deep": False}, "value": manifest(head_digest)}, unit],
                    stage)
    workers = [FakeHost(f"spark-{i}", [{**fact, "args": {"repo_dir": REPO_DIR, "deep": False}, "value": manifest(d)}], stage)
               for i, d in enumerate(worker_digests, 2)]
    for w in workers:
        w.state = head.state
    return head, workers


def run_on(host, op, **kwargs) -> tuple[list, list[str]]:
    with ctx_state.use(host.state), ctx_host.use(host):
        return list(op._inner(**kwargs)), host.noops


def served(head, workers, on=None, **kwargs) -> tuple[list, list[str]]:
    return run_on(on or head, snapshot_served, repo_dir=REPO_DIR, head=head,
                  workers=[(w, f"10.213.1.{i}") for i, w in enumerate(workers, 2)],
                  bind_ip="10.213.1.1", port=8730, **kwargs)


def test_the_head_serves_the_workers_behind_only_and_nothing_when_none_is():
    head, workers = nodes("d1", "d1", "d0", None)
    (command,) = served(head, workers)[0]
    assert rendered(command) == rendered(transfer.serve_command(REPO_DIR, ["10.213.1.3", "10.213.1.4"], "10.213.1.1", 8730))
    head, workers = nodes("d1", "d1", "d1")
    assert served(head, workers) == ([], [f"every worker matches the manifest of {REPO_DIR}"])
    assert served(head, workers, on=workers[0]) == ([], [])  # a worker's part: none


def on_node(state: dict | None, stage: str = "execute") -> FakeHost:
    return FakeHost("spark-1", [{"fact": "SnapshotManifest", "args": {"repo_dir": REPO_DIR, "deep": False},
                                 "value": state}], stage)


def test_a_stale_manifest_is_hashed_shown_and_a_current_one_is_not():
    stale = {"exists": True, "stale": True, "digest": None, "files": 3, "bytes": 10, "to_hash": 10}
    (command,) = run_on(on_node(stale), snapshot_manifest, repo_dir=REPO_DIR)[0]
    assert rendered(shown_command(command)) == rendered(snapshot_tool_command("manifest", REPO_DIR, "--write", "--progress"))
    current = manifest("d1")
    assert run_on(on_node(current), snapshot_manifest, repo_dir=REPO_DIR) == (
        [], [f"manifest of {REPO_DIR}: 3 files, 10 bytes"])
    # deep: every file hashed again, current or not
    (command,) = run_on(on_node(current), snapshot_manifest, repo_dir=REPO_DIR, deep=True)[0]
    assert rendered(shown_command(command)) == rendered(
        snapshot_tool_command("manifest", REPO_DIR, "--write", "--progress", "--deep"))


def test_a_missing_snapshot_is_the_heads_error_and_a_workers_nothing_yet():
    missing = {"exists": False, "stale": True}
    (refused,) = run_on(on_node(missing), snapshot_manifest, repo_dir=REPO_DIR)[0]
    assert f"spark-1: no snapshot at {REPO_DIR}" in rendered(refused)
    (later,) = run_on(on_node(missing, stage="prepare"), snapshot_manifest, repo_dir=REPO_DIR)[0]
    assert rendered(later) == rendered(StringCommand("echo", f"manifest of {REPO_DIR} once the snapshot is there"))
    assert run_on(on_node(missing), snapshot_manifest, repo_dir=REPO_DIR, required=False) == (
        [], [f"no copy of {REPO_DIR} yet"])


def test_without_the_heads_current_manifest_nothing_is_served_or_pulled_and_a_run_says_why():
    head, workers = nodes(None, "d0")
    (refused,) = served(head, workers)[0]
    assert f"spark-1: no current manifest for {REPO_DIR}" in rendered(refused)
    kwargs = dict(repo_dir=REPO_DIR, head=head, source=transfer.source("10.213.1.1", 8730), streams=4)
    (refused,) = run_on(workers[0], snapshot_pulled, **kwargs)[0]  # nor does a worker pull
    assert f"spark-1: no current manifest for {REPO_DIR}" in rendered(refused)
    head, workers = nodes(None, "d0", stage="prepare")  # the download comes first in the same run
    for placeholder in (served(head, workers)[0], run_on(workers[0], snapshot_pulled, **{**kwargs, "head": head})[0]):
        waiting = StringCommand("echo", f"{REPO_DIR} reaches the workers once the head's manifest is made")
        assert [rendered(c) for c in placeholder] == [rendered(waiting)]


def test_one_operation_has_the_head_serve_while_the_workers_behind_pull():
    """snapshot_synced: on the head, snapshot_served's daemon for the workers behind; on each
    worker, snapshot_pulled's pull (or nothing where its copy matches), in the same operation."""
    head, (behind, level) = nodes("d1", "d0", "d1")
    source = transfer.source("10.213.1.1", 8730)
    kwargs = dict(repo_dir=REPO_DIR, head=head, workers=[(behind, "10.213.1.2"), (level, "10.213.1.3")],
                  bind_ip="10.213.1.1", port=8730, source=source, streams=4)
    (serve,) = run_on(head, snapshot_synced, **kwargs)[0]
    assert rendered(serve) == rendered(transfer.serve_command(REPO_DIR, ["10.213.1.2"], "10.213.1.1", 8730))
    (pull,) = run_on(behind, snapshot_synced, **kwargs)[0]
    assert rendered(shown_command(pull)) == rendered(transfer.pull_command(REPO_DIR, source, 4))
    assert run_on(level, snapshot_synced, **kwargs) == ([], [f"{REPO_DIR} matches the head's manifest"])


def test_the_head_stops_its_daemon_when_it_runs_and_else_does_nothing():
    head, workers = nodes("d1", "d0", unit_active=True)
    assert [rendered(c) for c in served(head, workers, present=False)[0]] == [
        f"systemctl kill --signal=SIGKILL {transfer.STAGE_UNIT}"]
    head, workers = nodes("d1", "d0", unit_active=False)
    assert served(head, workers, present=False) == ([], [f"nothing serves {REPO_DIR}"])


def test_a_worker_behind_pulls_shown_and_one_that_matches_does_nothing():
    head, (behind, level) = nodes("d1", "d0", "d1")
    source = transfer.source("10.213.1.1", 8730)
    kwargs = dict(repo_dir=REPO_DIR, head=head, source=source, streams=4)
    (command,) = run_on(behind, snapshot_pulled, **kwargs)[0]
    assert rendered(shown_command(command)) == rendered(transfer.pull_command(REPO_DIR, source, 4))
    assert run_on(level, snapshot_pulled, **kwargs) == ([], [f"{REPO_DIR} matches the head's manifest"])
    assert run_on(head, snapshot_pulled, **kwargs) == ([], [])  # the head holds it


# A host lost while a shown step runs (issue 42): one line naming it and the step, no traceback.


class LostHost:
    """What ``progress.run_printed`` uses of a host whose connection closes mid-command."""

    name = "spark-1"
    executing_op_hash = "op1"

    def __init__(self, exc: BaseException) -> None:
        self.exc, self.said = exc, []

    def run_shell_command(self, *args, **kwargs):
        raise self.exc

    def log_styled(self, message, **kwargs):
        self.said.append(message)


@pytest.mark.parametrize("exc", [EOFError(), OSError("Socket is closed"), SSHException("Server connection dropped")])
def test_a_host_lost_mid_step_fails_the_step_naming_the_host_and_the_step(exc):
    state = SimpleNamespace(print_input=False, op_meta={"op1": SimpleNamespace(names={"Each worker's x is pulled"})})
    state.get_op_meta = state.op_meta.__getitem__
    host = LostHost(exc)
    assert progress.run_printed(state, host, StringCommand("true"), {}) is False
    (said,) = host.said
    assert said.startswith(f"spark-1 went away while this step ran (Each worker's x is pulled): {type(exc).__name__}: ")
    assert said.endswith("the next converge, once spark-1 answers, does the rest.")
