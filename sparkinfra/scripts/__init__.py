"""
What reaches the nodes as text sent with a command, before or outside the node programs
(``sparkinfra/node``, placed whole): the shell of facts, the converge lock and preflight, which run
before anything is placed; the staging's programs and the snapshot tool; ``status``'s and
``logs``' readers. Each is linted and run by the unit tests; the deploys run a script's text with
its arguments, never shell built in f-strings.
"""

from __future__ import annotations

from pathlib import Path

from pyinfra.api import QuoteString, StringCommand

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


def command(name: str, *args: str, shell: str = "sh") -> StringCommand:
    """``<shell> -c <text of name> name ARGS...``: the script run on a node with its arguments,
    nothing installed there first."""
    return StringCommand(shell, "-c", QuoteString(text(name)), name, *(QuoteString(str(a)) for a in args))
