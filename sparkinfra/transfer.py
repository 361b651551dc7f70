"""
Staging: one image ID and one verified model snapshot on every node, moved head -> workers over
the fabric. Decided here; the operations in ``sparkinfra.operations`` run it.

Images stream ``docker save | ssh | docker load`` from the head to each worker whose image ID
differs (workers in parallel). Snapshots are pulled by each worker from a read-only rsync daemon
that the head runs on its fabric address only while a transfer is under way, in several parallel
streams, resuming partial files (``--append-verify``) and sending only what differs.
"""

from __future__ import annotations

import base64
import shlex

from pyinfra.api import StringCommand

from . import scripts
from .settings import Cluster

MANIFEST = ".sparkinfra-manifest.json"


def repo_dir(model_dir: str, repo: str) -> str:
    """The repository's folder in an HF hub cache: ``<cache>/models--org--name``."""
    return f"{model_dir.rstrip('/')}/models--{repo.replace('/', '--')}"


def models(cluster: Cluster) -> list[tuple[str, str]]:
    """(repo id, revision) of every model the cluster serves: the target, then the drafter."""
    config = cluster.config
    refs = [(config.model, config.model_revision), (config.drafter, config.drafter_revision)]
    return [(repo, rev) for repo, rev in refs if repo]


def tool_source() -> str:
    """The snapshot tool (``sparkinfra/scripts/snapshot_tool.py``), run on nodes with python3."""

    return scripts.text("snapshot_tool.py")


def pull_command(repo: str, source: str, streams: int, deep: bool = False) -> str:
    """
    The command line a worker runs through the SSH mesh (its user's shell, then sudo): the script
    ``scripts/stage_pull.sh`` with its arguments, the snapshot tool among them (base64: the worker
    needs nothing installed but python3 and rsync).

    + source: the head's daemon, ``rsync://<head>:<port>/stage/``
    """
    args = [repo, source, str(int(streams)), "1" if deep else "0", MANIFEST, _b64(tool_source())]
    script = _b64(scripts.text("stage_pull.sh"))
    return f'sudo -n sh -c "$(echo {script} | base64 -d)" stage_pull.sh {shlex.join(args)}'


def head_transfer_command(repo: str, workers: list[str], bind_ip: str, port: int, streams: int,
                          deep: bool = False) -> StringCommand:
    """
    The head's part of a transfer (``scripts/stage_head.sh``, as root): a read-only rsync daemon
    on its fabric address for the pulling workers only, while each runs ``pull_command``.

    + workers: the fabric IP of each worker whose copy differs
    """
    pull = pull_command(repo, f"rsync://{bind_ip}:{int(port)}/stage/", streams, deep)
    return scripts.command("stage_head.sh", repo, bind_ip, str(int(port)), pull, *workers, shell="bash")


def image_fanout_command(image: str, head_id: str, workers: list[tuple[str, str]]) -> StringCommand:
    """
    The head's image fan-out (``scripts/image_fanout.sh``, as root): one ``docker save`` teed to a
    ``docker load`` on each worker, then each worker's image ID checked against ``head_id``.

    + workers: ``(name, fabric IP)`` of each worker whose ID differs
    """
    return scripts.command("image_fanout.sh", image, head_id, *(f"{name}={ip}" for name, ip in workers), shell="bash")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
