"""
Staged state: an image's ID, a snapshot's manifest and files.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pyinfra.api import FactBase, FactProcessError, QuoteString, StringCommand
from typing_extensions import override

from ..transfer import tool_source

# What docker says of a name it does not know (``image inspect``, ``container inspect``, ``inspect``;
# "Error: ..." or "Error response from daemon: ...", by version).
DOCKER_ABSENT = ("No such image", "No such container", "No such object")


def docker_answer(output: list[str], is_value: Callable[[str], bool]) -> str | None:
    """
    A docker command's answer, its errors included (run with ``2>&1 || true``): the first line
    ``is_value`` accepts; ``None`` when docker says there is no such image, container or object;
    else ``FactProcessError`` ("docker could not be asked: <error>"), which pyinfra reports on this
    host, at the default verbosity, and fails the host: a daemon that does not answer is never a
    missing image or container.
    """
    lines = [line.strip() for line in output if line.strip()]
    for line in lines:
        if is_value(line):
            return line
    if any(absent in line for line in lines for absent in DOCKER_ABSENT):
        return None
    raise FactProcessError(f"docker could not be asked: {'; '.join(lines) or 'no answer'}")


class DockerImageId(FactBase):
    """
    Returns the ID of a local image (``sha256:...``), or ``None`` when it is not there. Docker's
    other errors (no daemon) are the fact's error, on this host (``docker_answer``).

    + image: the image name:tag
    """

    @override
    def command(self, image: str) -> StringCommand:
        return StringCommand(
            "docker", "image", "inspect", "--format", QuoteString("{{.Id}}"), QuoteString(image),
            "2>&1", "||", "true",
        )

    @override
    def process(self, output):
        return docker_answer(output, lambda line: line.startswith("sha256:"))


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
