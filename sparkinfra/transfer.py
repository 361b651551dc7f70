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

from . import scripts
from .settings import Cluster

MANIFEST = ".sparkinfra-manifest.json"
MESH_SSH = "ssh -o BatchMode=yes -o Compression=no"


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


def pull_script(repo: str, source: str, streams: int, deep: bool = False) -> str:
    """
    Shell run as root on a worker: fetch the head's manifest from ``source`` (the head's daemon,
    ``rsync://head:port/stage/``), drop what cannot be resumed, pull what is missing or short in
    parallel streams, then record this copy's own manifest (its cache of sizes and sha256).
    """
    tool = tool_source()
    root, name = repo.rstrip("/").rsplit("/", 1)
    q = shlex.quote
    return "\n".join([
        "set -eu",
        "work=$(mktemp -d); trap 'rm -rf \"$work\"' EXIT",
        f"printf %s {q(base64.b64encode(tool.encode()).decode())} | base64 -d > \"$work/tool.py\"",
        f"mkdir -p {q(repo)}",
        f"rsync -a {q(f'{source}{name}/{MANIFEST}')} \"$work/manifest.json\"",
        f"python3 \"$work/tool.py\" plan {q(repo)} \"$work/manifest.json\" \"$work\" {int(streams)}"
        + (" --deep" if deep else "") + " > \"$work/plan.json\"",
        f"cd {q(root)}",
        *progress_lines(repo, "\"$work/plan.json\""),
        "trap 'kill $progress 2>/dev/null; rm -rf \"$work\"' EXIT",
        "pids=",
        "for list in \"$work\"/list.*; do [ -e \"$list\" ] || continue",
        f"  rsync -a --partial --inplace --append-verify --files-from=\"$list\" {q(source)} . "
        "> \"$list.log\" 2>&1 & pids=\"$pids $!\"",
        "done",
        "rc=0; for p in $pids; do wait $p || rc=1; done",
        "if [ $rc != 0 ]; then cat \"$work\"/list.*.log >&2; exit $rc; fi",
        f"python3 \"$work/tool.py\" adopt {q(repo)} \"$work/manifest.json\" \"$work\" > /dev/null",
    ]) + "\n"


def progress_lines(repo: str, plan: str, every: int = 5) -> list[str]:
    """
    Shell that prints the transfer's progress every ``every`` seconds in the background (bytes,
    rate, ETA; one line each, so pyinfra -v shows them as they come) and sets ``$progress`` to
    its PID. Killing that PID ends the loop and its sleep at once: ssh returns only once nothing
    holds its output open.

    + plan: the plan's JSON (its ``bytes_needed``)
    """
    q = shlex.quote
    return [
        f"need=$(sed 's/.*\"bytes_needed\": \\([0-9]*\\).*/\\1/' {plan}); "
        f"start=$(du -sb {q(repo)} | cut -f1); t0=$(date +%s)",
        f"( nap=; trap 'kill $nap 2>/dev/null; exit 0' TERM; while sleep {int(every)} & nap=$!; wait $nap; do "
        "now=$(du -sb " + q(repo) + " | cut -f1); d=$((now - start)); "
        "s=$(( $(date +%s) - t0 )); r=$(( d / (s > 0 ? s : 1) )); "
        "left=$(( need > d ? need - d : 0 )); "
        "echo \"$(hostname): $((d >> 20)) of $((need >> 20)) MiB, $((r >> 20)) MiB/s, "
        "ETA $(( r > 0 ? left / r : 0 )) s\"; done ) & progress=$!",
    ]


def head_transfer_script(repo: str, workers: list[str], bind_ip: str, port: int, streams: int, deep: bool = False) -> str:
    """
    Shell run as root on the head: a read-only rsync daemon on its fabric address, open to the
    pulling workers only and only until they are done; each worker (reached through the SSH mesh)
    runs its ``pull_script`` at the same time.

    + workers: the fabric IP of each worker whose copy differs
    """
    root = repo.rstrip("/").rsplit("/", 1)[0]
    conf = (
        f"address = {bind_ip}\nport = {int(port)}\nuse chroot = no\nnumeric ids = yes\n"
        # uid root: huggingface_hub writes some cache files 0600 (trees/<rev>.json); still read-only,
        # and open only to the workers' fabric addresses for the transfer's duration.
        f"reverse lookup = no\n[stage]\npath = {root}\nread only = yes\nuid = root\ngid = root\n"
        f"hosts allow = {' '.join(workers)}\nhosts deny = *\n"
    )
    source = f"rsync://{bind_ip}:{int(port)}/stage/"
    remote = run_remote(pull_script(repo, source, streams, deep))
    lines = [
        "set -u; run=$(mktemp -d /run/sparkinfra-stage.XXXXXX)",
        f"printf %s {shlex.quote(conf)} > $run/rsyncd.conf",
        "rsync --daemon --no-detach --config=$run/rsyncd.conf & daemon=$!",
        # KILL: on TERM rsync's daemon lingers ~0.4 s; it serves nothing once every pull is done.
        "trap 'kill -KILL $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf $run' EXIT",
        f"for i in $(seq 50); do (exec 3<>/dev/tcp/{bind_ip}/{int(port)}) 2>/dev/null && break; sleep 0.1; done",
        f"pull={shlex.quote(remote)}",  # the same for every worker: once, whatever their number
        "rc=0; pids=",
    ]
    for ipaddr in workers:
        lines.append(f"{MESH_SSH} {ipaddr} \"$pull\" & pids=\"$pids $!\"")
    lines.append("for p in $pids; do wait $p || rc=1; done; exit $rc")
    return "\n".join(lines)


def run_remote(script: str) -> str:
    """A command line that runs ``script`` with ``sh`` as root on the far side of an ssh hop."""
    blob = base64.b64encode(script.encode()).decode()
    return f"echo {blob} | base64 -d | sudo -n sh"


def image_fanout_script(image: str, head_id: str, workers: list[tuple[str, str]]) -> str:
    """
    Shell run as root (bash) on the head: one ``docker save`` of ``image``, teed to a ``docker
    load`` on each worker through the SSH mesh, all at once (the head reads and packs the image
    once, however many workers receive it); then each worker's image ID, checked against the head's.
    A worker that fails to load does not stop the others; it ends the script with an error
    naming both IDs.

    + workers: ``(name, fabric IP)`` of each worker whose ID differs
    """
    q = shlex.quote
    lines = ["set -u -o pipefail; rc=0; pids=; fifos=$(mktemp -d); trap 'rm -rf \"$fifos\"' EXIT"]
    for i, (_, ipaddr) in enumerate(workers):
        lines.append(
            f"mkfifo \"$fifos/{i}\"; {MESH_SSH} {ipaddr} 'sudo -n docker load -q' < \"$fifos/{i}\" >/dev/null "
            "& pids=\"$pids $!\""
        )
    outputs = " ".join(f'"$fifos/{i}"' for i in range(len(workers)))
    # -p: a worker whose load ends early does not cut the stream to the others.
    lines.append(f"docker save {q(image)} | tee -p {outputs} >/dev/null || rc=1")
    lines.append("for p in $pids; do wait $p || rc=1; done")
    for name, ipaddr in workers:
        lines.append(
            f"got=$({MESH_SSH} {ipaddr} \"sudo -n docker image inspect --format '{{{{.Id}}}}' {q(image)}\" 2>/dev/null); "
            f"[ \"$got\" = {q(head_id)} ] || {{ echo \"{name}: {image} is ${{got:-missing}}, the head has {head_id}\" >&2; rc=1; }}"
        )
    lines.append("exit $rc")
    return "\n".join(lines)
