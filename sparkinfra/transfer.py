"""
Staging: one image ID and one verified model snapshot on every node, moved head -> workers over
the fabric. Decided here; the operations in ``sparkinfra.operations`` run it.

Images stream from one ``docker save`` on the head to a ``docker load`` on each worker whose image
ID differs (workers in parallel), each sent only the layers it lacks. Snapshots are pulled by
each worker whose copy differs (on pyinfra's own connection to it, every worker at once) from a
read-only rsync daemon that the head runs on its fabric address only while a transfer is under
way (a transient unit, ``STAGE_UNIT``), in several parallel streams, resuming partial files
(``--append-verify``) and sending only what differs.
"""

from __future__ import annotations

import base64
import shlex

from pyinfra.api import QuoteString, StringCommand

from . import scripts
from .node.paths import STAGE_CONF, STAGE_UNIT
from .settings import Cluster

# The head's rsync daemon while workers pull (scripts/stage_serve.sh starts it, the deploy stops it).


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


def serve_command(repo: str, workers: list[str], bind_ip: str, port: int, conf: str = STAGE_CONF) -> StringCommand:
    """
    The head's part of a transfer (``scripts/stage_serve.sh``, as root): a read-only rsync
    daemon on its fabric address for the pulling workers only, started as ``STAGE_UNIT``.

    + workers: the fabric IP of each worker whose copy differs
    + conf: the daemon's config file
    """
    return scripts.command("stage_serve.sh", STAGE_UNIT, conf, repo, bind_ip, str(int(port)), *workers, shell="bash")


def unserve_command() -> StringCommand:
    """The head's daemon stopped once every worker has pulled: killed (as its unit's stop would,
    ``KillSignal=SIGKILL``), without the stop job's wait (~20 ms); its unit's ``ExecStopPost``
    removes the config, and a next serve that finds the unit still there stops it first
    (``scripts/stage_serve.sh``)."""
    return StringCommand("systemctl", "kill", "--signal=SIGKILL", STAGE_UNIT)


def pull_command(repo: str, source: str, streams: int, deep: bool = False) -> StringCommand:
    """
    A worker's part (``scripts/stage_pull.py``, as root): the head's manifest from ``source``,
    then the pull of what differs, its progress, and its record. The snapshot tool goes on the
    line (base64): the worker needs nothing installed but python3 and rsync.

    + source: the head's daemon, ``rsync://<head>:<port>/stage/``
    """
    args = [repo, source, str(int(streams)), "1" if deep else "0", _b64(tool_source())]
    # -S: stdlib only, ~5 ms less
    return StringCommand("python3", "-S", "-c", QuoteString(scripts.text("stage_pull.py")), *map(QuoteString, args))


def source(bind_ip: str, port: int) -> str:
    """The rsync URL of the head's daemon (its one module, ``stage``)."""
    return f"rsync://{bind_ip}:{int(port)}/stage/"


def image_fanout_command(image: str, head_id: str, workers: list[tuple[str, str]]) -> StringCommand:
    """
    The head's image fan-out (``scripts/image_fanout.py``, as root): one ``docker save``, each
    worker sent only the layers it lacks (``scripts/image_receive.sh`` in its SSH session says
    which it has, then loads), then each worker's image ID checked against ``head_id``.

    + workers: ``(name, fabric IP)`` of each worker whose ID differs
    """
    receive = _as_root_inline("image_receive.sh", "sh", "image_receive.sh", image)
    return StringCommand("python3", "-c", QuoteString(scripts.text("image_fanout.py")), QuoteString(image),
                         QuoteString(head_id), QuoteString(receive), *(QuoteString(f"{name}={ip}") for name, ip in workers))


def _as_root_inline(name: str, runner: str, *args: str) -> str:
    """The command line that runs the script ``name`` as root on a worker through the head's SSH
    mesh (its user's shell, then sudo): ``runner -c <its text>``, the text sent base64 on the line
    (nothing installed there first)."""
    return f'sudo -n {runner} -c "$(echo {_b64(scripts.text(name))} | base64 -d)" {shlex.join(args)}'


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
