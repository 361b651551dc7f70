"""
Bad input, everywhere: a corpus of broken projects (``tests/unit/bad_inputs/<case>/``), each refused
by the real ``pyinfra`` command line while it loads the inventory, before it connects to anything,
with a message naming the file (or ``--data``) and the key, and the line in a lane's YAML; never a
traceback.

A case is a small project: ``inventory/lab.py`` (its nodes on 127.0.0.1 port 1, where nothing
listens: a run that wrongly goes on fails another way), optional ``group_data/*.py`` and
``lanes/*.yaml``, optional ``data.txt`` (one ``--data key=value`` a line) and ``expect.txt``
(``# what is wrong``, then the fragments the message must hold, one a line). A case's name starts
with its kind: ``inventory-``, ``group_data-``, ``lane-`` or ``data-``. ``_good`` is the control:
the same project without a mistake, which pyinfra does try to reach.

Every case runs ``pyinfra -y inventory/lab.py deploys/preflight.py`` in its own copy (the copy is
the project root, as pyinfra runs in one, with the project's ``config.py``, which checks the settings
before pyinfra loads the inventory: a case's inventory need not end with ``validate_inventory``), a
few at a time; one test per case reads its run. One in-process test per kind runs the same check
on the same cases (``run.check_inventory``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyinfra.api import State
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_state
from test_settings import INV, PYINFRA, REPO

from sparkinfra.run import check_inventory, parse_data
from sparkinfra.settings import SettingsError

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
GOOD = "_good"
KINDS = ("inventory", "group_data", "lane", "data")
CASES = sorted(p.name for p in CORPUS.iterdir() if p.is_dir() and p.name != GOOD)
DEPLOY = "deploys/preflight.py"

# Signs that pyinfra went for the hosts: its step line, then one line per host.
CONNECTING = re.compile(r"Connecting to hosts|\[n\d+\] (Connected|Could not connect)")


@dataclass
class Case:
    name: str
    kind: str
    what: str  # the mistake, in words
    expect: list[str]  # fragments of the message
    data: list[str]  # --data key=value items


def read_case(name: str) -> Case:
    folder = CORPUS / name
    lines = (folder / "expect.txt").read_text(encoding="utf-8").splitlines() if name != GOOD else []
    what = lines[0][2:] if lines and lines[0].startswith("# ") else ""
    data_file = folder / "data.txt"
    data = data_file.read_text(encoding="utf-8").splitlines() if data_file.is_file() else []
    return Case(
        name=name,
        kind=name.split("-", 1)[0],
        what=what,
        expect=[line for line in lines if line.strip() and not line.startswith("#")],
        data=[item for item in data if item.strip()],
    )


def copy_project(name: str, root: Path) -> Path:
    """The case's folder as a project root: its files, the real preflight deploy and config.py."""
    shutil.copytree(CORPUS / name, root, ignore=shutil.ignore_patterns("expect.txt", "data.txt"))
    (root / "deploys").mkdir()
    shutil.copy(REPO / DEPLOY, root / DEPLOY)
    shutil.copy(REPO / "config.py", root / "config.py")
    return root


# Through the real command line
# -----------------------------


@dataclass
class Run:
    code: int
    out: str  # stdout, then stderr
    seconds: float
    debug_log: bool  # pyinfra wrote pyinfra-debug.log (its sign of an unexpected exception)


def run_cli(name: str, root: Path) -> Run:
    case = read_case(name)
    copy_project(name, root)
    (root / "home").mkdir()
    args = [str(PYINFRA), "-y", INV, DEPLOY]
    for item in case.data:
        args += ["--data", item]
    started = time.monotonic()
    proc = subprocess.run(
        args,
        cwd=root,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(root / "home")},
    )
    return Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started,
               (root / "pyinfra-debug.log").exists())


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory) -> dict[str, Run]:
    """Every case (and the control) through pyinfra, a few processes at a time (~1 s each)."""
    root = tmp_path_factory.mktemp("bad-inputs")
    names = [*CASES, GOOD]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as pool:
        runs = dict(zip(names, pool.map(lambda name: run_cli(name, root / name), names)))
    print(f"\nbad inputs: {len(names)} pyinfra runs in {time.monotonic() - started:.1f} s")
    return runs


def test_the_corpus():
    cases = [read_case(name) for name in CASES]
    assert len(cases) >= 30
    assert {case.kind for case in cases} == set(KINDS), [c.name for c in cases if c.kind not in KINDS]
    for case in cases:
        assert case.what and len(case.expect) >= 2, f"{case.name}: expect.txt needs '# what' and fragments"
        if case.kind == "data":
            assert case.data and "--data" in case.expect, case.name
        else:
            assert not case.data and re.search(r"\.(py|yaml)$", case.expect[0]), case.name
        # The key (or the line, or the host whose name is wrong); an inventory without hosts has none.
        named = any(f.startswith(("key '", "line ", "(host ")) for f in case.expect)
        assert named or any(f.endswith("has no hosts") for f in case.expect), case.name
        # Nodes only on 127.0.0.1 port 1 (nothing listens), so a run that goes on fails another way.
        text = (CORPUS / case.name / INV).read_text(encoding="utf-8")
        hosts = re.findall(r'^\s*\("[^"]*", \{.*\}\),$', text, re.M)
        assert len(hosts) == text.count('"ssh_hostname": "127.0.0.1", "ssh_port": 1,'), case.name


def test_the_good_project_does_connect(cli_runs):
    """The control: the corpus's project without a mistake (its lane only in its own lanes/) goes for
    the hosts, so the checks below can fail."""
    run = cli_runs[GOOD]
    assert "bad settings" not in run.out, run.out
    assert "Connecting to hosts" in run.out and "Could not connect" in run.out, run.out
    assert run.code != 0, run.out  # nothing listens on port 1


@pytest.mark.parametrize("name", CASES)
def test_refused_before_connecting(cli_runs, name):
    case, run = read_case(name), cli_runs[name]
    assert run.code != 0, run.out
    assert "Traceback" not in run.out, run.out
    assert not run.debug_log, run.out
    assert not CONNECTING.search(run.out), run.out
    # One message, on one line, holding every fragment.
    message = next((line for line in run.out.splitlines() if "bad settings: " in line), "")
    missing = [fragment for fragment in case.expect if fragment not in message]
    assert not missing, f"{case.what}: {missing} not in\n{run.out}"


# In process, through run.check_inventory
# ---------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_refused_in_process(kind, tmp_path, monkeypatch):
    """The check config.py runs (``run.check_inventory``), called with each case's ``--data``."""
    failures = []
    for case in (read_case(name) for name in CASES):
        if case.kind != kind:
            continue
        root = copy_project(case.name, tmp_path / case.name)
        monkeypatch.chdir(root)
        try:
            with ctx_state.use(State()):
                # An absolute path: pyinfra caches compiled files by the name it is given.
                check_inventory(str(root / INV), parse_data(case.data))
        except (SettingsError, PyinfraError) as exc:
            message = str(exc)
        else:
            failures.append(f"{case.name}: accepted")
            continue
        missing = [fragment for fragment in case.expect if fragment not in message]
        if missing:
            failures.append(f"{case.name}: {missing} not in {message!r}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("environ, said", [({}, "does not hold it"), ({"SPARKINFRA_TEST_KEY": ""}, "holds it empty")])
def test_a_serving_run_whose_api_key_variable_is_unset_is_refused_before_connecting(tmp_path, environ, said):
    """The control project, served (deploys/serve.py) with api_key_env naming a variable the shell lacks:
    refused naming the cluster, the setting and the variable, before pyinfra goes for a host."""
    root = copy_project(GOOD, tmp_path / "p")
    shutil.copy(REPO / "deploys/serve.py", root / "deploys/serve.py")
    env = {k: v for k, v in os.environ.items() if k != "SPARKINFRA_TEST_KEY"}
    proc = subprocess.run([str(PYINFRA), "-y", INV, "deploys/serve.py", "--data", "api_key_env=SPARKINFRA_TEST_KEY"],
                          cwd=root, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                          env={**env, **environ, "HOME": str(tmp_path)})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and not CONNECTING.search(out), out
    assert f"api_key_env names SPARKINFRA_TEST_KEY, and this shell's environment {said}" in out, out
    assert "Traceback" not in out
