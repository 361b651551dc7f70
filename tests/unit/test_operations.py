"""
Operations against recorded facts, as pyinfra's own operation tests run them: a fixture
(``fixtures/operations/<module>.<operation>/<case>.json``, the module under ``sparkinfra.operations``)
gives the operation's arguments and every fact it reads (``{"fact", "args", "value"}``; a fact read
that the fixture lacks fails the case) and holds the commands it must yield, or, when it yields
none, the noop it must report. No host is contacted.

A fixture's ``port`` is a node's ``roce.Port`` as a dict; its ``key_host`` (an argument naming another
pyinfra host) is ``{"name", "facts"}``; ``stage`` is ``"prepare"`` for pyinfra's change-detection
pass (default: ``"execute"``).
"""

from __future__ import annotations

import importlib
import io
import json
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api import OperationError, StringCommand
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state

from sparkinfra import roce
from sparkinfra.node.plan import CompileCache
from sparkinfra.operations import files

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "operations"
CASES = sorted(f"{p.parent.name}/{p.stem}" for p in FIXTURES.glob("*/*.json"))


class FakeState:
    """The run a fake host belongs to: its stage, no operation run yet, no host failed."""

    def __init__(self, stage: StateStage) -> None:
        self.current_stage = stage
        self.ops: dict = {}
        self.config = None
        self.failed_hosts: set = set()


class FakeHost:
    """What an operation uses of a pyinfra host: its name, facts, noop and the run's stage."""

    current_op_global_arguments = None  # as pyinfra's Host (``progress.shown`` reads it)

    def __init__(self, name: str, facts: list[dict], stage: str = "execute") -> None:
        self.name = name
        self.facts = facts
        self.noops: list[str] = []
        current = StateStage.Execute if stage == "execute" else StateStage.Prepare
        self.state = FakeState(current)

    def get_fact(self, fact, *args, **kwargs):
        assert not args, f"{fact.__name__}: positional arguments {args}"
        for entry in self.facts:
            if entry["fact"] == fact.__name__ and entry.get("args", {}) == kwargs:
                return entry["value"]
        raise AssertionError(f"{self.name}: the fixture lacks the fact {fact.__name__} {kwargs}")

    def noop(self, description: str) -> None:
        self.noops.append(description)


def rendered(command) -> str:
    return command.get_raw_value() if isinstance(command, StringCommand) else str(command)


def operation(name: str):
    """``sparkinfra.operations.<module>.<operation>`` of ``"<module>.<operation>"``."""
    module, _, function = name.partition(".")
    return getattr(importlib.import_module(f"sparkinfra.operations.{module}"), function, None)


def run_operation(name: str, kwargs: dict, facts: list[dict], stage: str = "execute", host_class=FakeHost):
    """(commands, noops) of ``sparkinfra.operations.<module>.<operation>`` (``name``) on a fake host holding ``facts``."""
    kwargs = dict(kwargs)
    if isinstance(kwargs.get("port"), dict):  # a node's fabric port, as roce.port_of reads it
        port = kwargs["port"]
        kwargs["port"] = roce.Port(port["interface"], port["twin"], tuple(tuple(h) for h in port["hcas"]),
                                   tuple(port.get("problems", ())))
    if isinstance(kwargs.get("compile_cache"), dict):
        kwargs["compile_cache"] = CompileCache(**kwargs["compile_cache"])
    if isinstance(kwargs.get("key_host"), dict):
        kwargs["key_host"] = FakeHost(kwargs["key_host"]["name"], kwargs["key_host"]["facts"], stage)
    host = host_class("node", facts, stage)
    with ctx_state.use(SimpleNamespace(config=SimpleNamespace(DIFF=False))), ctx_host.use(host):
        commands = [rendered(c) for c in operation(name)._inner(**kwargs)]
    return commands, host.noops


@pytest.fixture(autouse=True)
def fixed_timestamp(monkeypatch):
    """sed's backup suffix is a timestamp: fixed, so fixtures can hold the command."""
    import pyinfra.operations.util.files as util_files

    monkeypatch.setattr(util_files, "get_timestamp", lambda: "TS")


def test_every_fixture_names_an_operation():
    assert CASES
    for case in CASES:
        assert hasattr(operation(case.split("/")[0]), "_inner"), case


@pytest.mark.parametrize("case", CASES)
def test_operation_fixture(case):
    fixture = json.loads((FIXTURES / f"{case}.json").read_text(encoding="utf-8"))
    commands, noops = run_operation(
        case.split("/")[0], fixture["kwargs"], fixture.get("facts", []), fixture.get("stage", "execute")
    )
    assert commands == fixture["commands"], f"{fixture['doc']}: commands"
    if not fixture["commands"]:  # (what an operation's inner steps report is theirs)
        assert fixture["noop"] in noops, f"{fixture['doc']}: noop"


# The removal's command, run: it takes the key's lines (a '+' in the key's base64 is a literal
# character to grep and sed) and leaves every other line.

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIF+q3Xw/k8s+Zp0Rb1e2YhT5d9mNf4LgVv7Q2uWzH1c/ sparkinfra-fabric@sim"
OTHER = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHb7oR0p5cQpM1xq2cY6Zk3d8Jt0nW4aS9uV1eL2fG3h admin@laptop"


class LocalFiles(FakeHost):
    """Reads ``FindInFile`` from this machine's files, with grep as pyinfra's fact does."""

    def get_fact(self, fact, *args, **kwargs):
        if fact.__name__ != "FindInFile":
            return super().get_fact(fact, *args, **kwargs)
        assert not kwargs["interpolate_variables"] and not kwargs["extended_regex"], kwargs
        if not Path(kwargs["path"]).is_file():
            return None
        grep = subprocess.run(["grep", "-e", kwargs["pattern"], kwargs["path"]], capture_output=True, text=True)
        return grep.stdout.splitlines()


def key_removed(home: Path, present: bool = False) -> tuple[list[str], list[str]]:
    kwargs = {
        "user": "spark2",
        "key_host": {"name": "head", "facts": [
            {"fact": "FileContents", "args": {"path": "/root/.ssh/sparkinfra_fabric.pub"}, "value": [KEY]},
        ]},
        "key_path": "/root/.ssh/sparkinfra_fabric.pub",
        "from_ip": "10.213.1.1",
        "present": present,
    }
    facts = [{"fact": "Home", "args": {"user": "spark2"}, "value": str(home)}]
    return run_operation("mesh.ssh_key_authorized", kwargs, facts, host_class=LocalFiles)


def test_removing_the_heads_key_runs_and_keeps_other_keys(tmp_path):
    keys = tmp_path / ".ssh" / "authorized_keys"
    keys.parent.mkdir()
    keys.write_text(f"{OTHER}\nfrom=\"10.213.1.1\" {KEY}\n{KEY}\n")
    commands, _ = key_removed(tmp_path)
    assert len(commands) == 1 and commands[0].startswith("sed "), commands
    subprocess.run(["sh", "-c", commands[0]], check=True)
    assert keys.read_text() == f"{OTHER}\n"
    assert sorted(p.name for p in keys.parent.iterdir()) == ["authorized_keys"]  # no sed backup left
    assert key_removed(tmp_path)[0] == []  # again: nothing to do


def test_removing_the_heads_key_creates_nothing(tmp_path):
    assert key_removed(tmp_path)[0] == []
    assert list(tmp_path.iterdir()) == []


# file_content: one fact, then only the commands the difference needs

class Uploads(FakeHost):
    """A fake host that also names upload temp files, as pyinfra hosts do."""

    def get_temp_filename(self, key):
        return f"/tmp/pyinfra-{abs(hash(key))}"


def file_state(kind="file", content="A=1\n", mode="600", user="root", group="root", parent=True) -> dict:
    import hashlib

    sha1 = hashlib.sha1(content.encode()).hexdigest() if kind == "file" else None
    value = {"kind": kind, "mode": mode if kind == "file" else None, "user": user if kind == "file" else None,
             "group": group if kind == "file" else None, "sha1": sha1, "parent": parent}
    return {"fact": "FileState", "args": {"path": "/etc/sparkinfra/nccl.env"}, "value": value}


def file_content(facts, stage="execute", **kwargs):
    """(commands as objects, noops) of file_content for /etc/sparkinfra/nccl.env."""
    host = Uploads("node", facts, stage)
    kwargs = {"path": "/etc/sparkinfra/nccl.env", "content": "A=1\n", "mode": "600", **kwargs}
    with ctx_state.use(SimpleNamespace(config=SimpleNamespace(DIFF=False))), ctx_host.use(host):
        commands = list(files.file_content._inner(**kwargs))
    return commands, host.noops


def test_file_content_the_same_is_a_noop():
    assert file_content([file_state()]) == ([], ["/etc/sparkinfra/nccl.env holds the wanted content"])


def test_file_content_the_same_with_another_mode_or_owner_fixes_only_that():
    commands, _ = file_content([file_state(mode="644")])
    assert [rendered(c) for c in commands] == ["chmod 600 /etc/sparkinfra/nccl.env"]
    commands, _ = file_content([file_state(user="spark", group="spark")])
    assert [rendered(c) for c in commands] == ["chown root:root /etc/sparkinfra/nccl.env"]


@pytest.mark.parametrize("now", [file_state(content="A=2\n"), file_state(kind="absent")])
def test_file_content_that_differs_or_is_missing_is_uploaded_then_owned(now):
    from pyinfra.api import FileUploadCommand

    commands, noops = file_content([now], mode="644")
    upload, *rest = commands
    assert isinstance(upload, FileUploadCommand) and upload.dest == "/etc/sparkinfra/nccl.env"
    assert upload.src.read() == "A=1\n"
    assert [rendered(c) for c in rest] == ["chown root:root /etc/sparkinfra/nccl.env", "chmod 644 /etc/sparkinfra/nccl.env"]
    assert noops == []


class Recorder:
    """What an upload does on a host, in order (commands run, files put with their temp names)."""

    def __init__(self):
        self.done = []

    def run_shell_command(self, command, _sudo=False):
        text = rendered(command)
        self.done.append(("sudo " if _sudo else "") + text)
        return True, SimpleNamespace(stdout="/tmp/tmp.private\n" if text == "mktemp -d" else "")

    def put_file(self, data, path, remote_temp_filename=None, _sudo=False):
        self.done.append(f"put {path} via {remote_temp_filename}: {data.read()!r}")
        return True


@pytest.mark.parametrize("now", [file_state(content="A=2\n"), file_state(kind="absent")])
def test_a_root_only_file_is_never_readable_by_others_on_its_way(now):
    """Made 0600 root before it is filled; its upload passes through a folder only the SSH user can
    enter (pyinfra's own goes through /tmp), which is removed."""
    from pyinfra.api import FunctionCommand

    commands, _ = file_content([now])
    assert len(commands) == 1 and isinstance(commands[0], FunctionCommand)
    host = Recorder()
    assert commands[0].function(None, host)
    assert host.done == [
        "sudo install -m 600 -o root -g root /dev/null /etc/sparkinfra/nccl.env",
        "mktemp -d",
        "put /etc/sparkinfra/nccl.env via /tmp/tmp.private/upload: b'A=1\\n'",
        "rm -rf /tmp/tmp.private",
    ]


def test_file_content_makes_a_missing_folder_first():
    commands, _ = file_content([file_state(kind="absent", parent=False)])
    assert rendered(commands[0]) == "mkdir -p /etc/sparkinfra"


def test_file_content_from_a_controller_file_compares_its_bytes(tmp_path):
    from pyinfra.api import FileUploadCommand

    same, other = tmp_path / "same" / "libnccl.so.2", tmp_path / "other" / "libnccl.so.2"
    for lib, data in ((same, b"A=1\n"), (other, b"\x7fELF")):  # (pyinfra caches a file's digest by path)
        lib.parent.mkdir()
        lib.write_bytes(data)
    assert file_content([file_state()], content=None, src=str(same))[0] == []  # the bytes the node holds
    commands, _ = file_content([file_state()], content=None, src=str(other), mode="644")
    assert isinstance(commands[0], FileUploadCommand) and commands[0].src == str(other)


def test_file_content_refuses_what_is_not_a_file():
    with pytest.raises(OperationError, match="/etc/sparkinfra/nccl.env is not a regular file"):
        file_content([file_state(kind="other")], stage="prepare")
    commands, _ = file_content([file_state(kind="other")])
    assert len(commands) == 1 and "is not a regular file" in rendered(commands[0]) and "exit 1" in rendered(commands[0])


class NodeCompare(Recorder, FakeHost):
    """A host whose secret file holds ``holds``: ``cmp`` answers as the node would."""

    def __init__(self, facts, stage, holds):
        FakeHost.__init__(self, "head", facts, stage)
        Recorder.__init__(self)
        self.holds, self.put = holds, None

    def put_file(self, data, path, remote_temp_filename=None, _sudo=False):
        self.put = data.getvalue()
        return Recorder.put_file(self, io.StringIO(self.put), path, remote_temp_filename, _sudo)

    def run_shell_command(self, command, _sudo=False):
        ok, out = Recorder.run_shell_command(self, command, _sudo)
        return (self.put == self.holds if rendered(command).startswith("cmp ") else ok), out


@pytest.mark.parametrize(("holds", "stage", "changes"), [
    ("VLLM_API_KEY=k1\n", "execute", False),
    ("VLLM_API_KEY=old\n", "execute", True),
    ("VLLM_API_KEY=old\n", "prepare", False),  # compared once the run executes, not while detecting changes
])
def test_a_secret_is_compared_on_the_node_and_no_digest_of_it_is_read(monkeypatch, holds, stage, changes):
    """Only the File fact is given: a digest fact asked of the node would fail the fake host."""
    monkeypatch.setenv("SPARKINFRA_TEST_KEY", "k1")
    facts = [{"fact": "File", "args": {"path": "/etc/sparkinfra/lanes/sim.secret.env"},
              "value": {"mode": 600, "user": "root"}}]
    host = NodeCompare(facts, stage, holds)
    with ctx_state.use(SimpleNamespace(config=SimpleNamespace(DIFF=False))), ctx_host.use(host):
        commands = list(files.secret_env_file._inner(path="/etc/sparkinfra/lanes/sim.secret.env",
                                                     variable="VLLM_API_KEY", env="SPARKINFRA_TEST_KEY"))
    assert bool(commands) == changes
    if stage == "execute":
        assert host.done[0] == "mktemp -d" and host.done[-1] == "rm -rf /tmp/tmp.private"
        assert host.done[2] == "sudo cmp -s /etc/sparkinfra/lanes/sim.secret.env /tmp/tmp.private/candidate"


# lane_running: a converge restarts the lane through the runner (its reasons go to the head's
# history) and waits for it with its phases printed at pyinfra's default verbosity (``shown``).

LANE_CTL = "python3 /usr/local/lib/sparkinfra/node lane_ctl"
WAIT = f"{LANE_CTL} wait-ready /etc/sparkinfra/lanes/sim.json 900"


class InOperation(FakeHost):
    """A fake host inside an operation (``shown`` reads the operation's connector arguments)."""

    current_op_global_arguments = {"_sudo": True, "_retries": 3}


def _lane_running(status: dict):
    facts = [{"fact": "LaneStatus", "args": {"lane": "sim"}, "value": status}]
    host = InOperation("node", facts)
    with ctx_state.use(SimpleNamespace(config=SimpleNamespace(DIFF=False))), ctx_host.use(host):
        commands = list(operation("lane.lane_running")._inner(lane="sim", digest="d1", ready_timeout=900))
    return commands, host.noops


SERVING = {"unit": "active", "started": "d1", "age": 5000, "api": "ok", "workers": {"10.0.0.2": "active"}}


def test_a_lane_restarts_through_its_runner_with_the_reasons_then_its_start_is_shown():
    commands, _ = _lane_running({**SERVING, "started": "d0", "api_key": "changed"})
    """The start goes through ``lane_ctl rollout`` (restart, wait until ready; a failed start rolled
    back to the newest known good set), its lines shown as they come."""
    commands, _ = _lane_running({**SERVING, "started": "d0", "api_key": "changed"})
    assert len(commands) == 2 and rendered(commands[0]) == "rm -f /run/sparkinfra/lanes/sim.failures"
    assert rendered(commands[1]) == (
        f"FunctionCommand(shown(StringCommand({LANE_CTL} rollout /etc/sparkinfra/lanes/sim.json 900 "
        "'its plan changed')), (), {})")
    commands, _ = _lane_running({**SERVING, "workers": {"10.0.0.2": "failed", "10.0.0.3": "inactive"}})
    assert commands[1].command.get_raw_value() == (f"{LANE_CTL} rollout /etc/sparkinfra/lanes/sim.json 900 "
                                                   "'workers not running: 10.0.0.2 (failed), 10.0.0.3 (inactive)'")


def test_a_lane_already_starting_is_waited_for_then_restarted_if_it_never_serves():
    commands, _ = _lane_running({**SERVING, "unit": "activating", "age": 30, "api": "down"})
    assert len(commands) == 1
    assert rendered(commands[0]) == (
        f"FunctionCommand(shown(StringCommand({WAIT} || {LANE_CTL} rollout /etc/sparkinfra/lanes/sim.json 900 "
        "'it did not become ready')), (), {})")


def test_a_young_lane_whose_api_key_changed_restarts_at_once_not_waited_for():
    """Rotated soon after a start: the running lane refuses the head's new key (401), which is not a
    lane still starting; waiting would last until its watch restarted it, or ready_timeout."""
    commands, _ = _lane_running({**SERVING, "age": 30, "api": "HTTP 401: Unauthorized", "api_key": "changed"})
    assert rendered(commands[0]) == "rm -f /run/sparkinfra/lanes/sim.failures"
    assert commands[1].command.get_raw_value() == f"{LANE_CTL} rollout /etc/sparkinfra/lanes/sim.json 900 'its API key changed'"


def test_a_serving_lane_is_left_alone():
    assert _lane_running(SERVING) == ([], ["lane sim serves"])


def test_the_wait_runs_as_the_operation_would_with_its_lines_printed():
    commands, _ = _lane_running({**SERVING, "unit": "failed"})
    ran = []

    class Node:
        def run_shell_command(self, command, **kwargs):
            ran.append((rendered(command), kwargs))
            return True, None

    assert commands[1].function(SimpleNamespace(print_input=False), Node()) is True
    rollout = f"{LANE_CTL} rollout /etc/sparkinfra/lanes/sim.json 900 'its unit is failed'"
    assert ran == [(rollout, {"print_output": True, "print_input": False, "_sudo": True})]  # (the retries are the op's)


# The NCCL pin: fetched once by the head, shared to the workers, the same bytes on every node
# --------------------------------------------------------------------------------------------

PIN, RECORD = "/opt/nccl/lib/libnccl.so.2", "/etc/sparkinfra/nccl-pin.json"
WHEEL = {"version": "2.30.7", "sha256": "a" * 64, "build_id": "b" * 40,
         "source": {"index": "https://pypi.org/simple", "project": "nvidia-nccl-cu13",
                    "file": "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_aarch64.whl"}}


def pin_fact(sha256, record=None, path=PIN):
    return {"fact": "NcclPin", "args": {"path": path, "record": RECORD}, "value": {"sha256": sha256, "record": record}}


def script_states():
    """The node already holds the node programs as they are here (so only the fetch is yielded)."""
    from sparkinfra.node.paths import PROGRAMS
    from sparkinfra.operations.node import programs

    return [{"fact": "FolderDigests", "args": {"path": PROGRAMS}, "value": programs()}]


def test_the_node_programs_are_placed_whole_once_and_removed_whole():
    """One fact reads the folder; only the files that differ are uploaded, a file the package lacks
    removed; the same folder is a no-op; ``present=False`` removes it."""
    from sparkinfra.node.paths import PROGRAMS
    from sparkinfra.operations.node import programs

    def folder(value):
        return [{"fact": "FolderDigests", "args": {"path": PROGRAMS}, "value": value}]

    commands, noops = run_operation("node.programs_present", {}, folder(programs()))
    assert commands == [] and noops == [f"{PROGRAMS} holds the node programs"]
    stale = {**programs(), "lane_ctl.py": "0" * 64, "old.py": "1" * 64}
    commands, _ = run_operation("node.programs_present", {}, folder(stale))
    assert commands[:2] == [f"mkdir -p {PROGRAMS}", f"rm -f {PROGRAMS}/old.py"]
    assert len(commands) == 4 and "lane_ctl.py" in commands[2] and commands[3].startswith("chmod -R")
    commands, _ = run_operation("node.programs_present", {}, folder({}))
    assert len(commands) == 2 + len(programs()) and "lane_rank.py" in " ".join(commands)
    assert run_operation("node.programs_present", {"present": False}, folder(stale))[0] == [f"rm -rf {PROGRAMS}"]
    assert run_operation("node.programs_present", {"present": False}, folder({}))[0] == []


FETCH = {"path": PIN, "index": "https://pypi.org/simple", "project": "nvidia-nccl-cu13", "version": "2.30.7"}


def test_a_fetched_pin_is_not_fetched_again_even_from_another_index():
    commands, noops = run_operation("nccl.nccl_fetched", {**FETCH, "index": "https://mirror.example/simple"},
                                    [pin_fact("a" * 64, WHEEL)])
    assert commands == [] and noops == [f"{PIN} is nvidia-nccl-cu13 2.30.7 (sha256 {'a' * 12})"]


@pytest.mark.parametrize("pin", [pin_fact(None), pin_fact("c" * 64, WHEEL), pin_fact("a" * 64, {**WHEEL, "version": "2.30.4"}),
                                 pin_fact("a" * 64, {"sha256": "a" * 64, "source": {"upload": "/srv/nccl/libnccl.so.2"}})])
def test_a_missing_changed_other_version_or_uploaded_pin_is_fetched_by_the_head(pin):
    commands, _ = run_operation("nccl.nccl_fetched", FETCH, [pin, *script_states()])
    assert len(commands) == 1 and "shown(" in commands[0]
    assert ("python3 /usr/local/lib/sparkinfra/node nccl_fetch --index https://pypi.org/simple --project nvidia-nccl-cu13 "
            '--version 2.30.7 --machine "$(uname -m)" --dest /opt/nccl/lib/libnccl.so.2 --record '
            "/etc/sparkinfra/nccl-pin.json") in commands[0]


def test_the_head_copies_its_pin_only_to_the_workers_whose_copy_differs():
    same, stale = FakeHost("w1", [pin_fact("a" * 64, WHEEL)]), FakeHost("w2", [pin_fact("c" * 64, WHEEL)])
    bare = FakeHost("w3", [pin_fact(None)])
    kwargs = {"path": PIN, "workers": [(same, "10.0.0.2"), (stale, "10.0.0.3"), (bare, "10.0.0.4")]}
    commands, _ = run_operation("nccl.nccl_shared", kwargs, [pin_fact("a" * 64, WHEEL)])
    assert len(commands) == 1 and f"' nccl_share.sh {PIN} {RECORD} 10.0.0.3 10.0.0.4)" in commands[0], commands
    commands, noops = run_operation("nccl.nccl_shared", {"path": PIN, "workers": [(same, "10.0.0.2")]},
                                    [pin_fact("a" * 64, WHEEL)])
    assert commands == [] and noops == [f"every worker holds {PIN} (sha256 {'a' * 12})"]


def test_a_worker_whose_pin_is_another_build_of_the_version_is_refused_naming_both():
    head = FakeHost("spark-1", [pin_fact("a" * 64, WHEEL)])
    facts = [pin_fact("c" * 64, WHEEL), {"fact": "NcclVersion", "args": {"path": PIN}, "value": "2.30.7"}]
    commands, _ = run_operation("nccl.nccl_pinned", {"path": PIN, "version": "2.30.7", "head": head}, facts)
    assert len(commands) == 1 and (f"node: {PIN} is NCCL 2.30.7 but another build than spark-1" in commands[0])
    assert f"sha256 {'c' * 12} here, {'a' * 12} there" in commands[0]
    same = [pin_fact("a" * 64, WHEEL), facts[1]]
    commands, noops = run_operation("nccl.nccl_pinned", {"path": PIN, "version": "2.30.7", "head": head}, same)
    assert commands == [] and noops == [f"{PIN} reports NCCL 2.30.7, sha256 {'a' * 12}"]


def test_the_in_image_check_runs_with_the_lanes_compile_caches_of_that_image():
    """The head's check mounts the lane's compile caches of the image's ID as a rank does (vLLM keeps
    its inspection of the model's class there: done once per image, not at every check); the same
    image and request validated before is a no-op."""
    from sparkinfra import serving
    from sparkinfra.node import docker, paths

    image = "sparkinfra/sparkbed-lane:535aaa80523c03cf"
    kwargs = {"lane": "sim", "image": image, "request": {"ranks": [["sparkbed/tiny-llama"]], "engine": True},
              "docker_options": ["--network", "host"], "compile_cache": serving.compile_cache("sim")}
    facts = [{"fact": "DockerImageId", "args": {"image": image}, "value": "sha256:fbc5617db7af" + "0" * 52},
             {"fact": "FileDigest", "args": {"path": paths.validated_path("sim")}, "value": None}]
    commands, _ = run_operation("lane.lane_validated", kwargs, facts)
    folders = docker.cache_folders(serving.compile_cache("sim"), "fbc5617db7af")
    assert folders["/root/.cache/vllm"] == f"{paths.compile_cache_root('sim')}/fbc5617db7af/vllm"
    assert f"mkdir -p {' '.join(folders.values())}" in commands
    [run] = [c for c in commands if "docker run" in c]  # shown: its verdict and warnings on screen
    for path, folder in folders.items():
        assert f" -v {folder}:{path} " in run, run
    key = run.rsplit("echo ", 1)[1].split()[0]
    facts[1]["value"] = key
    assert run_operation("lane.lane_validated", kwargs, facts) == ([], ["sim's arguments passed the image's vLLM"])



def _canary(**changes):
    from sparkinfra.bench.canary import Canary

    fields = dict(lane="sim", base_url="http://10.0.0.1:8000", served_model="tiny", api_key_env="", switch={},
                  workloads=("json",), max_tokens=64, runs=3, pp=None, tg=16, book="", coherence=False,
                  decode_tolerance=0.1, ttft_tolerance=0.25, baseline_results="", model="m/tiny", revision="r1",
                  snapshot="/models/snap")
    return Canary(**{**fields, **changes})


def _known_good_commands(known, **kwargs):
    """The lane_known_good operation's commands (objects, not rendered) on a head whose sets are ``known``."""
    facts = [{"fact": "LaneStatus", "args": {"lane": "sim", "probe": False}, "value": {"known": known}}]
    host = FakeHost("node", facts)
    args = {"lane": "sim", "digest": "d2", "keep": 2, "canary": _canary(), "ready_timeout": 300, **kwargs}
    with ctx_state.use(SimpleNamespace(config=SimpleNamespace(DIFF=False))), ctx_host.use(host):
        return list(operation("lane.lane_known_good")._inner(**args)), host.noops


class RunHost:
    """A host a FunctionCommand runs commands on: each recorded, each succeeding."""

    name = "spark-1"

    def __init__(self):
        self.ran = []

    def run_shell_command(self, command, **kwargs):
        self.ran.append(rendered(command))
        return True, None


def test_a_lane_already_the_newest_known_good_set_is_a_noop():
    newest = {"number": 2, "lane": "sim", "digest": "d2"}
    assert _known_good_commands([{"number": 1, "lane": "sim", "digest": "d1"}, newest]) == (
        [], ["lane sim's plan d2 is known good #2"])
    other = {"number": 3, "lane": "sim-b", "digest": "d2"}  # the same digest of another lane is not this one
    assert len(_known_good_commands([newest, other])[0]) == 1


@pytest.mark.parametrize("decode, verb", [(39.0, "promote"), (20.0, "rollback")])
def test_a_changed_lane_is_promoted_after_its_canary_or_rolled_back_when_slower(monkeypatch, decode, verb):
    """The baseline is the newest known good set's canary of the lane: within 10 % promoted with the
    numbers, beyond it rolled back, the operation failing with both numbers."""
    from sparkinfra.bench import canary as bench_canary

    shape = {"max_tokens": 64, "pp": None, "tg": 16, "runs": 3}
    older = {"number": 1, "lane": "sim", "digest": "d1", "canary": {"decode_tps": {"json": 40.0}, "shape": shape}}
    measured = {"decode_tps": {"json": decode}, "ttft_ms": None, "tg_tps": None, "shape": shape}
    monkeypatch.setattr(bench_canary, "measure", lambda c, tokenizer, log: measured)
    [command], _ = _known_good_commands([older])
    head = RunHost()
    ok = command.function(SimpleNamespace(print_input=False), head, *command.args, **command.kwargs)
    [ran] = head.ran
    assert ran.startswith(f"python3 /usr/local/lib/sparkinfra/node lane_ctl {verb} /etc/sparkinfra/lanes/sim.json ")
    if verb == "promote":
        assert ok and ran.endswith(" " + shlex.quote(json.dumps(measured, sort_keys=True)))
        assert "canary decode tok/s json 39.0" in ran
    else:
        assert not ok and "300 'failed its canary: decode tok/s (json) 20.0, baseline 40.0 (-50%, may fall 10%)'" in ran


def test_a_canary_whose_requests_fail_rolls_back(monkeypatch):
    from sparkinfra.bench import canary as bench_canary
    from sparkinfra.bench.probes import BenchError

    def fails(c, tokenizer, log):
        raise BenchError("http://10.0.0.1:8000/v1/chat/completions: HTTP 500 Internal Server Error")

    monkeypatch.setattr(bench_canary, "measure", fails)
    [command], _ = _known_good_commands([])
    head = RunHost()
    assert not command.function(SimpleNamespace(print_input=False), head)
    assert "lane_ctl rollback" in head.ran[0] and "a canary request failed" in head.ran[0]
