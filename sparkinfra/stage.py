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

from .settings import Cluster

MESH_SSH = "ssh -o BatchMode=yes -o Compression=no -c aes128-gcm@openssh.com"


def repo_dir(model_dir: str, repo: str) -> str:
    """The repository's folder in an HF hub cache: ``<cache>/models--org--name``."""
    return f"{model_dir.rstrip('/')}/models--{repo.replace('/', '--')}"


def models(cluster: Cluster) -> list[tuple[str, str]]:
    """(repo id, revision) of every model the cluster serves: the target, then the drafter."""
    config = cluster.config
    refs = [(config.model, config.model_revision), (config.drafter, config.drafter_revision)]
    return [(repo, rev) for repo, rev in refs if repo]


def split_streams(files: list[tuple[str, int]], streams: int) -> list[list[str]]:
    """Spread files over ``streams`` lists of about equal bytes (largest first, greedy)."""
    buckets: list[tuple[int, list[str]]] = [(0, []) for _ in range(max(1, streams))]
    for path, size in sorted(files, key=lambda f: (-f[1], f[0])):
        i = min(range(len(buckets)), key=lambda b: buckets[b][0])
        total, paths = buckets[i]
        buckets[i] = (total + size, paths + [path])
    return [paths for _, paths in buckets if paths]


def pull_script(diff: dict, sizes: dict[str, int], repo: str, source: str, streams: int) -> str:
    """
    Shell run as root on a worker: drop files that cannot be resumed, then pull what is missing
    or short from ``source`` (``rsync://head:port/stage/``, the head's cache folder) in parallel
    streams. Paths in ``diff`` and ``sizes`` are relative to the repo folder ``repo``.
    """
    root, name = repo.rstrip("/").rsplit("/", 1)
    lines = ["set -u", f"mkdir -p {shlex.quote(repo)}", f"cd {shlex.quote(root)}"]
    for path in diff["differ"] + diff["links"]:
        lines.append(f"rm -f -- {shlex.quote(f'{name}/{path}')}")
    wanted = diff["missing"] + diff["shorter"] + diff["differ"] + diff["links"]
    lists = split_streams([(f"{name}/{p}", sizes.get(p, 0)) for p in wanted], streams)
    lines.append("work=$(mktemp -d); trap 'rm -rf \"$work\"' EXIT")
    for i, paths in enumerate(lists):
        body = "\n".join(paths) + "\n"
        lines.append(f"printf %s {shlex.quote(body)} > \"$work/list.{i}\"")
    for i, _ in enumerate(lists):
        lines.append(
            f"rsync -a --partial --inplace --append-verify --files-from=\"$work/list.{i}\" "
            f"{shlex.quote(source)} . > \"$work/log.{i}\" 2>&1 & pids=\"${{pids:-}} $!\""
        )
    lines.append("rc=0; for p in ${pids:-}; do wait $p || rc=1; done")
    lines.append("if [ $rc != 0 ]; then cat \"$work\"/log.* >&2; fi; exit $rc")
    return "\n".join(lines) + "\n"


def head_transfer_script(
    repo: str, sizes: dict[str, int], pulls: list[tuple[str, dict]], bind_ip: str, port: int, streams: int
) -> str:
    """
    Shell run as root on the head: a read-only rsync daemon on its fabric address, open to the
    pulling workers only and only until they are done; each worker (reached through the SSH mesh)
    runs its ``pull_script`` at the same time.

    + pulls: ``(worker fabric IP, SnapshotDiff of the worker)`` of each worker that differs
    """
    root = repo.rstrip("/").rsplit("/", 1)[0]
    allow = " ".join(ip for ip, _ in pulls)
    conf = (
        f"address = {bind_ip}\nport = {int(port)}\nuse chroot = no\nnumeric ids = yes\n"
        f"reverse lookup = no\n[stage]\npath = {root}\nread only = yes\n"
        f"hosts allow = {allow}\nhosts deny = *\n"
    )
    source = f"rsync://{bind_ip}:{int(port)}/stage/"
    lines = [
        "set -u; run=$(mktemp -d /run/sparkinfra-stage.XXXXXX)",
        f"printf %s {shlex.quote(conf)} > $run/rsyncd.conf",
        "rsync --daemon --no-detach --config=$run/rsyncd.conf & daemon=$!",
        "trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf $run' EXIT",
        f"for i in $(seq 50); do (exec 3<>/dev/tcp/{bind_ip}/{int(port)}) 2>/dev/null && break; sleep 0.1; done",
        "rc=0",
    ]
    for ipaddr, diff in pulls:
        script = pull_script(diff, sizes, repo, source, streams)
        lines.append(f"{MESH_SSH} {ipaddr} {shlex.quote(run_remote(script))} & pids=\"${{pids:-}} $!\"")
    lines.append("for p in $pids; do wait $p || rc=1; done; exit $rc")
    return "\n".join(lines)


def run_remote(script: str) -> str:
    """A command line that runs ``script`` with ``sh`` as root on the far side of an ssh hop."""
    blob = base64.b64encode(script.encode()).decode()
    return f"echo {blob} | base64 -d | sudo -n sh"
