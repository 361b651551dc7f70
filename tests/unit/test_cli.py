"""
``python -m sparkinfra VIEW ...`` (``sparkinfra.cli``): the view named runs with the rest of the
command line; no view, or one it does not know, is refused with the list; ``--help`` lists them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sparkinfra import cli

REPO = Path(__file__).resolve().parents[2]


def test_the_view_named_gets_the_rest_of_the_command_line(monkeypatch):
    seen = []
    monkeypatch.setitem(cli.VIEWS, "status", lambda argv: seen.append(argv) or 3)
    assert cli.main(["status", "inventory/pair.py", "--json"]) == 3
    assert seen == [["inventory/pair.py", "--json"]]


def test_no_view_or_an_unknown_one_is_refused_naming_the_views(capsys):
    assert cli.main([]) == 2
    views = "lanes, status, logs, chat, lock, bench, rollback"
    assert capsys.readouterr().err.startswith(f"sparkinfra: no view given (one of: {views})")
    assert cli.main(["stats"]) == 2
    assert capsys.readouterr().err.startswith("sparkinfra: no view 'stats' (one of: ")


def test_help_lists_every_view(capsys):
    assert cli.main(["--help"]) == 0
    said = capsys.readouterr().out
    assert all(f"python -m sparkinfra {view} " in said for view in cli.VIEWS)


def test_python_m_sparkinfra_runs_a_view():
    done = subprocess.run([sys.executable, "-m", "sparkinfra", "lanes", "--help"], capture_output=True, text=True,
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m sparkinfra lanes ")
