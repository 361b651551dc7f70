"""
What runs on the nodes, as files: the lane runner (``lane_ctl.py``), the snapshot tool, the vLLM
argument check, and the shell the deploys run there. Each is linted and run by the unit tests;
the deploys upload a script, or run its text with its arguments, never shell built in f-strings.
"""

from __future__ import annotations

from pathlib import Path

DIR = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """The script ``name`` of this folder (it must exist)."""
    found = DIR / name
    if not found.is_file():
        raise FileNotFoundError(f"no node script {name} in {DIR}")
    return found


def text(name: str) -> str:
    """The text of the script ``name``."""
    return path(name).read_text(encoding="utf-8")
