"""deploys/stage.py: one image ID everywhere, every snapshot matching the head's manifest, resolvable offline."""

import json
import shlex

import pytest

from sparkinfra import lanes, transfer
from sparkinfra.facts.stage import (
    DockerImageId,
    SnapshotManifest,
    snapshot_tool_command,
)


def _head(cluster):
    return next(t for t in cluster if t.node.rank == 0)


def _staged_image(cluster) -> str:
    """What deploys/stage.py puts on every node: the lane's image (as the lock pins it), else the cluster's."""
    config = cluster.config
    return (lanes.lane_image(lanes.find_lane(config.lane), config.image, dict(cluster.pins)).ref if config.lane
            else config.image)


def test_every_node_has_the_heads_image(cluster):
    config = cluster[0].cluster.config
    image = _staged_image(cluster[0].cluster)
    ids = {t.node.name: t.fact(DockerImageId, image=image) for t in cluster}
    head_id = ids[_head(cluster).node.name]
    assert head_id, f"{image} is not on the head"
    if config.image_id and image == config.image:
        assert head_id == config.image_id, f"head has {head_id}, settings want {config.image_id}"
    assert all(i == head_id for i in ids.values()), f"{image} differs: {ids}"


def _snapshots(cluster):
    return transfer.models(cluster[0].cluster) if cluster else []


def _entries(target, repo_dir, deep):
    out = target.root(snapshot_tool_command("show", repo_dir, *(["--deep"] if deep else [])).get_raw_value())
    return {e["path"]: {k: v for k, v in e.items() if k != "mtime_ns"} for e in json.loads(out.stdout)["entries"]}


def test_every_snapshot_matches_the_heads_manifest(cluster, request):
    deep = request.config.getoption("deep")
    config = cluster[0].cluster.config
    head = _head(cluster)
    for repo, _ in _snapshots(cluster):
        repo_dir = transfer.repo_dir(config.model_dir, repo)
        wanted = head.fact(SnapshotManifest, repo_dir=repo_dir)
        assert wanted.get("exists") and not wanted.get("stale"), f"no current manifest of {repo} on the head: {wanted}"
        for t in cluster:
            got = t.fact(SnapshotManifest, repo_dir=repo_dir, deep=deep)
            if got.get("digest") == wanted["digest"]:
                continue
            # A digest that differs, or none (a copy changed since its manifest was recorded: reading
            # hashes nothing): compare every entry, hashing what changed (deep: everything).
            theirs, mine = _entries(head, repo_dir, False), _entries(t, repo_dir, deep)
            bad = sorted(p for p in theirs.keys() | mine.keys() if mine.get(p) != theirs.get(p))
            if bad:
                pytest.fail(f"{t}: {repo} differs from the head's manifest ({'sha256' if deep else 'sizes'}): {bad[:20]}")


def test_snapshots_resolve_offline_in_the_image_on_every_node(node):
    """What a lane container does: HF_HUB_OFFLINE=1 snapshot_download finds the pinned revision."""
    config = node.cluster.config
    models = transfer.models(node.cluster)
    if not models:
        pytest.skip("no model in the settings")
    for repo, revision in models:
        code = (
            "import sys; from huggingface_hub import snapshot_download; "
            "print(snapshot_download(sys.argv[1], revision=sys.argv[2], cache_dir=sys.argv[3]))"
        )
        out = node.root(
            f"docker run --rm --network none -e HF_HUB_OFFLINE=1 --entrypoint python3 "
            f"-v {shlex.quote(config.model_dir)}:{shlex.quote(config.model_dir)}:ro {shlex.quote(_staged_image(node.cluster))} "
            f"-c {shlex.quote(code)} {shlex.quote(repo)} {shlex.quote(revision)} {shlex.quote(config.model_dir)}"
        )
        assert out.rc == 0, f"{node}: {repo}@{revision} does not resolve offline: {out.stderr[-800:]}"
        assert out.stdout.strip().endswith(f"/snapshots/{revision}"), out.stdout


def test_the_heads_transfer_daemon_is_gone_once_staging_is_done(cluster):
    """The head's rsync daemon lives for a transfer only (deploys/stage.py starts it before the
    workers pull and stops it after): nothing is left serving the weights on the fabric."""
    head = _head(cluster)
    port = head.cluster.config.stage_port
    active = head.root(f"systemctl is-active {transfer.STAGE_UNIT}").stdout.strip()
    listening = head.root(f"ss -Hltn 'sport = :{port}'").stdout.strip()
    assert active != "active", f"{head}: {transfer.STAGE_UNIT} is still {active}"
    assert not listening, f"{head}: something still listens on the stage port {port}: {listening}"
