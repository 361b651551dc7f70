"""
Files of a node, each read with one command: kind, owner, mode, digest.
"""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from .. import scripts


class FileState(FactBase):
    """
    Returns what a file operation needs to know about ``path`` in one command (pyinfra's
    ``files.put`` asks three: ``File``, ``Directory`` of its folder and ``Sha1File``):

    .. code:: python

        {"kind": "file", "mode": "644", "user": "root", "group": "root",
         "sha1": "…", "parent": True}

    ``kind`` is ``file``, ``absent`` or ``other`` (a link, folder or device in the way); ``mode``,
    ``user``, ``group`` and ``sha1`` are ``None`` unless it is a file. ``parent``: its folder exists.

    + path: the file
    """

    @override
    def command(self, path: str) -> StringCommand:
        return scripts.command("file_state.sh", path)

    @override
    def process(self, lines):
        lines = [line.strip() for line in lines if line.strip()]
        state = {"kind": "absent", "mode": None, "user": None, "group": None, "sha1": None,
                 "parent": bool(lines) and lines[-1] == "parent"}
        head = lines[0].split() if lines else []
        if head[:1] == ["other"]:
            state["kind"] = "other"
        elif head[:1] == ["file"] and len(head) == 4 and len(lines) >= 3:
            state.update(kind="file", mode=head[1], user=head[2], group=head[3], sha1=lines[1].split()[0])
        return state


class FileDigest(FactBase):
    """
    Returns the first line of a small marker file, or ``None`` when it is missing.

    + path: the file
    """

    @override
    def command(self, path: str) -> StringCommand:
        return StringCommand("head", "-n1", QuoteString(path), "2>/dev/null", "||", "true")

    @override
    def process(self, output):
        return output[0].strip() if output and output[0].strip() else None


class FolderDigests(FactBase):
    """
    Returns the sha256 of every file under a folder by its path there (``{"lane_ctl.py": "…"}``),
    Python's ``__pycache__`` left out; ``{}`` when it is missing: a whole folder compared in one command.

    + path: the folder
    """

    @staticmethod
    def default():
        return {}

    @override
    def command(self, path: str) -> StringCommand:
        return StringCommand("cd", QuoteString(path), "2>/dev/null", "&&", "find", ".", "-type", "f",
                             "-not", "-path", QuoteString("*/__pycache__/*"), "-exec", "sha256sum", "{}", "+", "||", "true")

    @override
    def process(self, output):
        found = {}
        for line in output:
            digest, _, name = line.strip().partition("  ")
            if name.startswith("./"):
                found[name[2:]] = digest
        return found
