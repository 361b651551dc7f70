"""
A user's authorized SSH keys, read with one command.
"""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override


class AuthorizedKeys(FactBase):
    """
    Returns what ``ssh_key_authorized`` checks, in one command (pyinfra's ``Home``,
    ``Directory``, ``FindInFile`` and ``File`` would be four): ``user``'s home, the kind, owner,
    group and mode of ``~/.ssh`` and ``~/.ssh/authorized_keys``, and that file's lines.

    .. code:: python

        {"home": "/home/ubuntu", "ssh_dir": ["directory", "ubuntu", "ubuntu", "700"],
         "file": ["file", "ubuntu", "ubuntu", "600"], "lines": ["from=\"10.0.0.1\" ssh-ed25519 …"]}

    A kind is ``directory``, ``file``, ``absent`` or ``other``. ``None`` if ``user`` has no home.

    + user: the user whose keys these are
    """

    @override
    def command(self, user: str) -> StringCommand:
        return StringCommand("sh", "-c", QuoteString(
            'h=$(getent passwd "$1" | cut -d: -f6); [ -n "$h" ] || exit 0; echo "$h"; '
            'for p in "$h/.ssh" "$h/.ssh/authorized_keys"; do '
            'if [ -L "$p" ]; then echo other; '
            'elif [ -d "$p" ]; then stat -c "directory %U %G %a" -- "$p"; '
            'elif [ -f "$p" ]; then stat -c "file %U %G %a" -- "$p"; '
            'elif [ -e "$p" ]; then echo other; else echo absent; fi; done; '
            'cat -- "$h/.ssh/authorized_keys" 2>/dev/null || true'
        ), "-", QuoteString(user))

    @override
    def process(self, output):
        return parse_authorized_keys(output)


def parse_authorized_keys(lines) -> dict | None:
    """``AuthorizedKeys``' output as a dict (see there)."""
    if len(lines) < 3:
        return None
    ssh_dir, file = (line.split() if len(line.split()) == 4 else [line.strip(), None, None, None]
                     for line in lines[1:3])
    return {"home": lines[0], "ssh_dir": ssh_dir, "file": file, "lines": [line for line in lines[3:] if line.strip()]}
