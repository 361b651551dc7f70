"""
Staging: one image ID and one verified model snapshot on every node (``sparkinfra.transfer``
decides the commands).
"""

from __future__ import annotations

import io
import os
import re
import shlex

from pyinfra import host
from pyinfra.api import (
    FileUploadCommand,
    FunctionCommand,
    OperationError,
    QuoteString,
    StringCommand,
    operation,
)
from pyinfra.facts.files import Directory, File, FileContents
from pyinfra.facts.systemd import SystemdStatus

from .. import lanes, scripts, transfer
from ..progress import shown
from ..lanes import images
from ..facts.reading import at_once, gathered, gathered_each, unproxied
from ..facts.stage import DockerImageId, SnapshotManifest, snapshot_tool_command
from ..node.paths import HF_TOKEN_FILE, MANIFEST, RUN
from .files import preparing, put_private, put_secret, refuse

# Staging
# -------


def image_ids(hosts: list, image: str) -> list[str | None]:
    """
    Each host's ID of ``image`` (``None``: not there), read from all of them at once. Raises
    ``OperationError`` naming every host that failed in this run (docker could not be asked there:
    pyinfra reported the fact's error on it) or whose read failed: an error never reads as a
    missing image, so it never triggers a load, build or transfer.
    """

    def read(h):
        try:
            return gathered(h, DockerImageId, image=image), ""
        except Exception as exc:  # a lost connection; pyinfra's "No hosts remaining!"
            return None, f"{type(exc).__name__}: {exc}"

    hosts = [unproxied(h) for h in hosts]  # ``host`` itself: the proxy means nothing in a greenlet
    answers = at_once([(h, read, h, {}) for h in hosts])
    failed = [
        f"{h.name} ({error})" if error else f"{h.name} (failed in this run, its error is above)"
        for h, (_, error) in zip(hosts, answers)
        if error or h in h.state.failed_hosts
    ]
    if failed:
        raise OperationError(
            f"the ID of image {image} could not be read on {', '.join(failed)}: nothing was loaded, built or streamed"
        )
    return [value for value, _ in answers]


def image_get_command(verb: str, image: str, *args: str) -> StringCommand:
    """``scripts/image_get.py VERB IMAGE ARGS``: a load, a pull or the site's build, with its progress."""
    return StringCommand("python3", "-c", QuoteString(scripts.text("image_get.py")), verb, QuoteString(image),
                         *(QuoteString(a) for a in args))


@operation()
def image_present(image: str, image_id: str = "", tarball: str = "", build: str = ""):
    """
    Ensure the image is on this host (the head): loaded from ``tarball`` or built by ``build``
    when missing, and with ``image_id`` when one is given.

    + image: name:tag
    + image_id: the ID it must have (``sha256:...``); empty: any
    + tarball: a ``docker save`` tarball on this host to load when the image is missing
    + build: a shell command on this host that builds the image when it is missing

    A reference pinned by digest (``name@sha256:...``) is pulled when it is missing and nothing
    else is given: a tag is not, since what it names can change between two stages.
    """
    (current,) = image_ids([host], image)
    if current is None:
        # Its bytes, rate and ETA every few seconds (a build: its time and last line), then its total.
        if tarball:
            yield shown(image_get_command("load", image, tarball))
        elif build:
            yield shown(image_get_command("build", image, build))
        elif "@sha256:" in image:
            yield shown(image_get_command("pull", image))
        else:
            yield from refuse(
                f"{host.name}: image {image} is missing; pin it by digest (name@sha256:...) to pull it, give "
                "the lane an image recipe, or set image_tarball or image_build"
            )
            return
        if image_id:
            check = (
                f"got=$(docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)}); "
                f"[ \"$got\" = {shlex.quote(image_id)} ] || "
                f"{{ echo \"{host.name}: {image} is $got, settings want {image_id}\" >&2; exit 1; }}"
            )
            yield StringCommand("sh", "-c", QuoteString(check))
        return
    if image_id and current != image_id:
        yield from refuse(f"{host.name}: image {image} is {current}, settings want {image_id}")
        return
    host.noop(f"{image} is {current}")


@operation()
def image_built(image: lanes.Image):
    """
    Ensure an image recipe's tag is on this host (the head): when it is missing, the recipe's
    files are uploaded (one tar, into ``images.NODE_DIR/<recipe>/files``) and built there by
    ``scripts/image_build.sh``. Docker's build cache and a repository's checkout stay, so the
    build of a changed recipe redoes only what changed; an unchanged recipe builds nothing.

    + image: the lane's image (``lanes.lane_image``) with its recipe
    """
    if image_ids([host], image.ref)[0]:
        host.noop(f"{image.ref} is built")
        return
    folder = f"{images.NODE_DIR}/{image.name}"
    tarball = f"{RUN}/recipe-{image.name}.tar"
    yield StringCommand("install", "-d", "-m", "700", RUN, QuoteString(folder))
    yield FileUploadCommand(io.BytesIO(images.recipe_tarball(image.folder)), tarball)
    # One line every few seconds naming the build's step, then its time; the log's end on failure.
    yield shown(scripts.command("image_build.sh", image.ref, folder, tarball, *images.build_command_args(image)))


@operation()
def image_on_workers(image: str, workers: list):
    """
    Ensure every worker has the head's image ID: only workers whose ID differs receive it,
    streamed from this host (the head) over the fabric, all at once, each sent only the layers it
    lacks (an image whose top layer changed moves that layer); 0 bytes move otherwise.
    A worker whose ID could not be read (docker not answering) stops the operation, naming it:
    nothing is streamed on an error.

    + image: name:tag
    + workers: ``(pyinfra host, fabric IP)`` of each worker (reached through the SSH mesh)
    """
    (head_id,) = image_ids([host], image)
    if head_id is None:
        if preparing():
            yield StringCommand("echo", f"{image} reaches the workers once it is on the head")
            return
        yield from refuse(f"{host.name}: {image} is not on the head")
        return
    ids = image_ids([w for w, _ in workers], image)
    behind = [(w, ip) for (w, ip), wid in zip(workers, ids) if wid != head_id]
    if not behind:
        host.noop(f"every worker has {image} {head_id[:19]}")
        return
    # What it has read and sent every few seconds, then each worker's bytes, time and layers.
    yield shown(transfer.image_fanout_command(image, head_id, [(w.name, ipaddr) for w, ipaddr in behind]))


@operation()
def snapshot_manifest(repo_dir: str, deep: bool = False, required: bool = True):
    """
    Ensure this host's manifest of a snapshot (path, size, sha256 of every file) is current: the
    files whose size or mtime changed since it was recorded are hashed (``deep``: every file), a
    line every few seconds while they are (a fresh 224 GB snapshot takes minutes), then one line of
    what it hashed. Reading the manifest hashes nothing.

    + repo_dir: the repository's folder in the HF cache
    + deep: hash every file now instead of trusting the size/mtime record (always runs)
    + required: a missing snapshot is an error (the head); else nothing to do (a worker, before its pull)
    """
    state = gathered(host, SnapshotManifest, repo_dir=repo_dir, deep=False) or {}
    if not state.get("exists"):
        if not required:
            host.noop(f"no copy of {repo_dir} yet")
        elif preparing():
            yield StringCommand("echo", f"manifest of {repo_dir} once the snapshot is there")
        else:
            yield from refuse(f"{host.name}: no snapshot at {repo_dir}")
        return
    if not state["stale"] and not deep:
        host.noop(f"manifest of {repo_dir}: {state['files']} files, {state['bytes']} bytes")
        return
    yield shown(snapshot_tool_command("manifest", repo_dir, "--write", "--progress", *(["--deep"] if deep else [])))


def head_manifest(head, repo_dir: str) -> dict | None:
    """The head's manifest of ``repo_dir`` if it is current; ``None`` otherwise."""
    mine = gathered(head, SnapshotManifest, repo_dir=repo_dir, deep=False) or {}
    return mine if mine.get("exists") and not mine.get("stale") else None


def no_head_manifest(head, repo_dir: str):
    """What an operation yields when the head has no current manifest of ``repo_dir``: while
    pyinfra detects changes (the download comes first in the same run), a line saying so; when it
    runs, the refusal naming the head."""
    if preparing():
        yield StringCommand("echo", f"{repo_dir} reaches the workers once the head's manifest is made")
    else:
        yield from refuse(f"{head.name}: no current manifest for {repo_dir}")


@operation()
def snapshot_served(repo_dir: str, head, workers: list = (), bind_ip: str = "", port: int = 0, present: bool = True):
    """
    Ensure the head serves a snapshot, read-only on its fabric address, to the workers whose
    manifest digest differs from its own, from a transient unit (``transfer.STAGE_UNIT``) that
    lives for the transfer only: ``present=True`` while they pull (``snapshot_synced``),
    ``present=False`` after. Run on every node (the workers do nothing).

    + repo_dir: the repository's folder in the HF cache (the same path on every node)
    + head: the pyinfra host holding the snapshot
    + workers: ``(pyinfra host, fabric IP)`` of each worker
    + bind_ip, port: where the daemon listens
    + present: whether the daemon should run (stopped whatever the workers' copies are)
    """
    if host.name != head.name:
        return
    if not present:
        if gathered(host, SystemdStatus, services=transfer.STAGE_UNIT).get(transfer.STAGE_UNIT):
            yield transfer.unserve_command()
        else:
            host.noop(f"nothing serves {repo_dir}")
        return
    mine = head_manifest(host, repo_dir)
    if mine is None:
        yield from no_head_manifest(host, repo_dir)
        return
    theirs = gathered_each([w for w, _ in workers], SnapshotManifest, repo_dir=repo_dir, deep=False)
    behind = [ipaddr for (_, ipaddr), m in zip(workers, theirs) if (m or {}).get("digest") != mine["digest"]]
    if not behind:
        host.noop(f"every worker matches the manifest of {repo_dir}")
        return
    yield transfer.serve_command(repo_dir, behind, bind_ip, port)


@operation()
def snapshot_pulled(repo_dir: str, head, source: str, streams: int):
    """
    Ensure this host's (a worker's) copy of a snapshot matches the head's manifest: when its
    digest differs, it pulls only missing, short (resumed) or differing files, in parallel
    streams, from the head's daemon (``snapshot_served``, started as they start: ``snapshot_synced``),
    every worker at once. Run on every node (the head holds the snapshot).

    + repo_dir: the repository's folder in the HF cache (the same path on every node)
    + head: the pyinfra host holding the snapshot
    + source: the head's daemon (``transfer.source``)
    + streams: parallel rsync streams

    A copy whose manifest is stale (a file touched) differs; its pull compares sizes and the
    sha256 its manifest records (``snapshot_manifest`` ran before, ``deep`` or not).
    """
    if host.name == head.name:
        return
    wanted = head_manifest(head, repo_dir)
    if wanted is None:
        yield from no_head_manifest(head, repo_dir)
        return
    mine = gathered(host, SnapshotManifest, repo_dir=repo_dir, deep=False) or {}
    if mine.get("digest") == wanted["digest"]:
        host.noop(f"{repo_dir} matches the head's manifest")
        return
    # Its bytes, rate and ETA every few seconds, then its total and its time.
    yield shown(transfer.pull_command(repo_dir, source, streams))


@operation()
def snapshot_synced(repo_dir: str, head, workers: list, bind_ip: str, port: int, source: str, streams: int):
    """
    Ensure every worker's copy of a snapshot matches the head's manifest: the head serves it
    (``snapshot_served``) while each worker whose digest differs pulls it (``snapshot_pulled``). One
    operation on every node, so the workers' sessions start with the head's (pyinfra runs an
    operation on every host at once): each pull waits for the daemon's port. ``snapshot_served``
    with ``present=False`` stops the daemon after it.

    + repo_dir: the repository's folder in the HF cache (the same path on every node)
    + head: the pyinfra host holding the snapshot
    + workers: ``(pyinfra host, fabric IP)`` of each worker
    + bind_ip, port: where the head's daemon listens
    + source: the same daemon, as the workers read it (``transfer.source``)
    + streams: parallel rsync streams per worker
    """
    if host.name == head.name:
        yield from snapshot_served._inner(repo_dir=repo_dir, head=head, workers=workers, bind_ip=bind_ip, port=port)
    else:
        yield from snapshot_pulled._inner(repo_dir=repo_dir, head=head, source=source, streams=streams)


@operation()
def snapshot_matches(repo_dir: str, head):
    """
    Ensure this host's copy of a snapshot matches the head's manifest (checked, never changed
    here: the head stages it). A mismatch after staging is an error naming the files (by size and
    by the sha256 this copy's manifest records).

    + repo_dir: the repository's folder in the HF cache
    + head: the pyinfra host holding the manifest
    """
    if preparing():
        return
    wanted = gathered(head, SnapshotManifest, repo_dir=repo_dir, deep=False) or {}
    mine = gathered(host, SnapshotManifest, repo_dir=repo_dir, deep=False) or {}
    if wanted.get("digest") and mine.get("digest") == wanted["digest"]:
        host.noop(f"{repo_dir} matches the head's manifest ({mine['files']} files)")
        return
    # Name the files: compare against the head's manifest, placed here for that.
    content = "\n".join(gathered(head, FileContents, path=f"{repo_dir}/{MANIFEST}") or [])
    check = f"{RUN}/{MANIFEST}.{host.name}"
    yield FunctionCommand(lambda state, host: put_private(host, content, check), (), {})  # 0600 from its first byte
    yield StringCommand(
        "sh", "-c", QuoteString(
            f"python3 -c {shlex.quote(transfer.tool_source())} compare {shlex.quote(repo_dir)} {check}"
            f" | python3 -c {shlex.quote(_MISMATCH)} {shlex.quote(host.name)} {shlex.quote(repo_dir)}"
        ),
    )


_MISMATCH = (
    "import json, sys; d = json.load(sys.stdin); "
    "bad = d['missing'] + d['shorter'] + d['differ'] + d['links']; "
    "print(f'{sys.argv[1]}: {sys.argv[2]} does not match the head manifest: {bad[:20]}', file=sys.stderr); "
    "sys.exit(1)"
)


# A download's token, for its length only: one fixed name, so a run that died is cleaned by the next.


@operation()
def snapshot_downloaded(repo: str, revision: str, cache_dir: str, image: str, token_env: str = "HF_TOKEN",
                        endpoint: str = ""):
    """
    Ensure a model snapshot is in this host's HF cache, downloaded once with ``huggingface_hub``
    when it is not (``scripts/hf_download.py``: its bytes, rate and ETA every few seconds) -- the
    lane image's own copy, so the host needs nothing but docker. The token
    (from the controller's ``token_env``) reaches the host only as a 0600 file, mounted read-only
    into the download and removed after it; it is never on a command line or in the output.

    + repo, revision: the repository and its pinned revision
    + cache_dir: the HF hub cache folder (``model_dir``)
    + image: an image with python3 and huggingface_hub (the lane image, staged before)
    + token_env: the controller environment variable holding the token (may be unset)
    + endpoint: the hub's URL (``HF_ENDPOINT``, a mirror); empty: huggingface.co
    """
    repo_path = transfer.repo_dir(cache_dir, repo)
    if gathered(host, Directory, path=f"{repo_path}/snapshots/{revision}") or (
        not re.fullmatch(r"[0-9a-f]{40}", revision) and gathered(host, File, path=f"{repo_path}/refs/{revision}")
    ):
        if gathered(host, File, path=HF_TOKEN_FILE):  # a download killed before it removed its token
            yield StringCommand("rm", "-f", HF_TOKEN_FILE)
            return
        host.noop(f"{repo}@{revision} is in {cache_dir}")
        return
    token = os.environ.get(token_env, "")
    token_file = HF_TOKEN_FILE
    if token:
        # Not files.put: its --diff output would print the token. A function command holds the
        # token in a closure (its repr names only the function) and uploads it into a 0600 file.
        def upload_token(state, host):
            # The folder is root-only (0700) before the token is in it.
            host.run_shell_command(StringCommand("install", "-d", "-m", "700", RUN), _sudo=True)
            return put_secret(host, token, token_file)

        yield FunctionCommand(upload_token, (), {})
    run = [
        "docker", "run", "--rm", "--network", "host", "--entrypoint", "python3",
        "-v", f"{shlex.quote(cache_dir)}:{shlex.quote(cache_dir)}",
        *(["-v", f"{token_file}:/run/hf_token:ro"] if token else []),
        *(["-e", f"HF_ENDPOINT={shlex.quote(endpoint)}"] if endpoint else []),
        shlex.quote(image), "-c", shlex.quote(scripts.text("hf_download.py")),
        shlex.quote(repo), shlex.quote(revision), shlex.quote(cache_dir), shlex.quote(token_env),
    ]
    # Its progress (bytes, rate, ETA every 5 s; then what it fetched) is printed as it comes.
    command = f"mkdir -p {shlex.quote(cache_dir)} && {' '.join(run)}; rc=$?; rm -f {token_file}; exit $rc"
    yield shown(StringCommand(command))
