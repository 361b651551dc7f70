"""
Staged state: an image's ID, a snapshot's manifest and files.
"""

from __future__ import annotations

import json

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from ..transfer import tool_source


class DockerImageId(FactBase):
    """
    Returns the ID of a local image (``sha256:...``), or ``None`` when it is not there.

    + image: the image name:tag
    """

    @override
    def command(self, image: str) -> StringCommand:
        return StringCommand(
            "docker", "image", "inspect", "--format", QuoteString("{{.Id}}"), QuoteString(image),
            "2>/dev/null", "||", "true",
        )

    @override
    def process(self, output):
        value = " ".join(output).strip()
        return value if value.startswith("sha256:") else None


def snapshot_tool_command(*args: str) -> StringCommand:

    return StringCommand("python3", "-I", "-S", "-c", QuoteString(tool_source()), *(QuoteString(a) for a in args))


class SnapshotManifest(FactBase):
    """
    Returns the manifest state of a snapshot copy on this host:
    ``{"exists": True, "stale": False, "files": 12, "bytes": 2147483648, "digest": "..."}``.
    Equal digests on two hosts mean equal snapshots (paths, sizes, sha256, symlinks).

    + repo_dir: the repository's folder in the HF cache (``.../models--org--name``)
    + deep: hash every file now instead of trusting the size/mtime cache
    """

    @override
    def requires_command(self, *args, **kwargs) -> str:
        return "python3"

    @override
    def command(self, repo_dir: str, deep: bool = False) -> StringCommand:
        return snapshot_tool_command("manifest", repo_dir, *(["--deep"] if deep else []))

    @override
    def process(self, output):
        return json.loads("\n".join(output))


class SnapshotFiles(FactBase):
    """
    Returns the files at the top of a model snapshot folder (symlinks followed) with their sizes,
    ``{"tokenizer.json": 2117, ...}``, or ``{}`` when the folder is missing.

    + path: the snapshot folder (``<cache>/models--org--name/snapshots/<revision>``)
    """

    @staticmethod
    def default():
        return {}

    @override
    def command(self, path: str) -> StringCommand:
        return StringCommand(
            "find", "-L", QuoteString(path), "-maxdepth", "1", "-type", "f", "-printf", QuoteString("%s %f\\n"),
            "2>/dev/null", "||", "true",
        )

    @override
    def process(self, output):
        files = {}
        for line in output:
            size, _, name = line.strip().partition(" ")
            if size.isdigit() and name:
                files[name] = int(size)
        return files
