"""
``sparkinfra/node/platform_facts.py`` (issue 41, drift): what a node runs beneath its lanes, read
from the tools' own output (stand-ins on PATH here, printing what the real ones print), the newest
known good set's record of it, and what changed since; preflight says it (``drift_check``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sparkinfra.node import platform_facts
from sparkinfra.preflight import drift_check

ROOT = Path(__file__).resolve().parents[2]
# What the tools print on a Spark: ``uname -r``, nvidia-smi's csv field, docker's server version.
TOOLS = {
    "uname": "6.17.0-1031-nvidia",
    "nvidia-smi": "580.95.05",
    "docker": "28.3.3",
}


def _tools(folder: Path, **printed: str) -> str:
    for name, line in {**TOOLS, **printed}.items():
        tool = folder / name
        tool.write_text(f"#!/bin/sh\necho '{line}'\n")
        tool.chmod(0o755)
    return str(folder)


def _known(folder: Path, number: int, platform: dict | None) -> None:
    (folder / str(number)).mkdir(parents=True)
    meta = {"number": number, "lane": "sim", **({"platform": platform} if platform is not None else {})}
    (folder / str(number) / "meta.json").write_text(json.dumps(meta))


def test_the_platform_is_read_from_the_tools_and_compared_with_the_newest_known_good_set(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _tools(tmp_path, uname="7.0.0-1019-nvidia") + ":/usr/bin:/bin")
    now = platform_facts.read()
    assert (now["kernel"], now["driver"], now["docker"]) == ("7.0.0-1019-nvidia", "580.95.05", "28.3.3")
    known = tmp_path / "known"
    _known(known, 1, {**now, "kernel": "6.17.0-1019-nvidia"})
    _known(known, 2, {**now, "kernel": "6.17.0-1031-nvidia"})
    _known(known, 3, None)  # from before sets recorded it: not compared
    newest = platform_facts.newest_known(str(known))
    assert newest["number"] == 2
    assert platform_facts.changes(newest, now) == ["kernel 6.17.0-1031-nvidia -> 7.0.0-1019-nvidia"]
    assert platform_facts.changes(None, now) == [] and platform_facts.newest_known(str(tmp_path / "none")) is None


def test_the_program_prints_its_json_and_preflight_says_the_drift(tmp_path):
    """As the probe runs it on a node (``python3 PROGRAMS platform_facts KNOWN_GOOD``)."""
    known = tmp_path / "known"
    _known(known, 4, {"kernel": "6.17.0-1031-nvidia", "driver": "580.95.05", "firmware": "", "docker": "28.3.3"})
    env = {"PATH": _tools(tmp_path, nvidia_smi="x", uname="6.17.0-1032-nvidia") + ":/usr/bin:/bin"}
    done = subprocess.run([sys.executable, str(ROOT / "sparkinfra/node"), "platform_facts", str(known)],
                          capture_output=True, text=True, env=env, timeout=60, check=True)
    answer = json.loads(done.stdout)
    assert answer["changes"] == ["kernel 6.17.0-1031-nvidia -> 6.17.0-1032-nvidia"] and answer["known"]["number"] == 4
    check = drift_check("spark-2", {"platform": answer})
    assert check.ok and check.check == "drift" and check.detail == (
        "since known good #4 (lane sim): kernel 6.17.0-1031-nvidia -> 6.17.0-1032-nvidia; "
        "the node rules run again on what it is now")
    assert drift_check("spark-2", {"platform": {**answer, "changes": []}}) is None
    assert drift_check("spark-2", {}) is None  # no node programs yet (a bare node)
