"""
A user's authorized SSH keys, read with one command.
"""

from __future__ import annotations

from pyinfra.api import FactBase, StringCommand
from typing_extensions import override

from .. import scripts


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
        return scripts.command("authorized_keys.sh", user)

    @override
    def process(self, lines):
        if len(lines) < 3:
            return None
        ssh_dir, file = (line.split() if len(line.split()) == 4 else [line.strip(), None, None, None]
                         for line in lines[1:3])
        keys = [line for line in lines[3:] if line.strip()]
        return {"home": lines[0], "ssh_dir": ssh_dir, "file": file, "lines": keys}
