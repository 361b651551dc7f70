"""
Staging, decided off-line: ``sparkinfra/scripts/snapshot_tool.py`` (the stdlib script nodes run:
manifests, compare, plan, adopt) on HF-cache-layout snapshots written in ``tmp_path`` by
``sparkbed.snapshots.make_snapshot`` (small sizes), and ``sparkinfra.stage`` (which repos, and the
shell the head and workers run). No host, daemon or network is involved: the shell is only
checked for syntax (``bash -n`` / ``sh -n``) and read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from spark_cluster import load_cluster

from sparkbed.snapshots import make_snapshot
from sparkinfra import transfer
from sparkinfra.scripts import snapshot_tool as tool
from sparkinfra.scripts import stage_pull

KIB = 1024
REV = "0123456789abcdef0123456789abcdef01234567"
REPO = "org/model"
LARGE, LARGE_BYTES, SMALL, SMALL_BYTES = 3, 64 * KIB, 4, 512
CONFIG_JSON = b'{"architectures": ["SyntheticMoE"], "model_type": "llama"}'
MAX_ARG_STRLEN = 128 * KIB


# Helpers
# -------


def head_snapshot(tmp_path: Path, repo: str = REPO, **kw) -> Path:
    """The head's copy: ``<tmp>/head/models--org--model``."""
    sizes = dict(large=LARGE, large_bytes=LARGE_BYTES, small=SMALL, small_bytes=SMALL_BYTES, seed=0)
    sizes.update(kw)
    return make_snapshot(tmp_path / "head", repo, REV, **sizes)


def worker_copy(head: Path, tmp_path: Path) -> Path:
    """An exact copy (links as links, mtimes kept) in ``<tmp>/worker``, without the head's manifest."""
    dest = tmp_path / "worker" / head.name
    shutil.copytree(head, dest, symlinks=True, ignore=shutil.ignore_patterns(tool.MANIFEST))
    return dest


def wanted(head: Path) -> dict:
    """The head's manifest as a worker receives it: written next to the snapshot, read back."""
    tool.manifest(str(head), write=True)
    return json.loads((head / tool.MANIFEST).read_text())


def entries(m: dict) -> dict:
    return {e["path"]: e for e in m["entries"]}


def blob_of(repo: Path, snapshot_file: str) -> str:
    """``blobs/<sha>`` that ``snapshots/REV/<snapshot_file>`` points to."""
    link = repo / "snapshots" / REV / snapshot_file
    return os.path.relpath(os.path.normpath(link.parent / os.readlink(link)), repo)


def large(i: int) -> str:
    return f"model-{i:05d}-of-{LARGE:05d}.safetensors"


def pull(head: Path, worker: Path, out: Path) -> list[str]:
    """
    What the workers' ``rsync -a --files-from=list.N rsync://head/stage/ .`` does, run from
    the cache folder: copy each listed path (files with their mtime, links as links).
    """
    head_root, worker_root = head.parent, worker.parent
    done = []
    for lst in sorted(out.glob("list.*")):
        for line in lst.read_text().splitlines():
            src, dst = head_root / line, worker_root / line
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                if os.path.lexists(dst):
                    dst.unlink()
                os.symlink(os.readlink(src), dst)
            else:
                shutil.copy2(src, dst)
            done.append(line)
    return done


def record_hashing(monkeypatch) -> list[str]:
    """Every file ``snapshot_tool`` reads to hash, in order."""
    calls: list[str] = []
    real = tool._sha256

    def spy(path, meter=None):
        calls.append(path)
        return real(path, meter)

    monkeypatch.setattr(tool, "_sha256", spy)
    return calls


# manifest()
# ----------


def test_manifest_of_a_missing_folder(tmp_path):
    assert tool.manifest(str(tmp_path / "models--none")) == {"exists": False, "stale": True}


def test_manifest_counts_flags_and_a_stable_digest(tmp_path):
    head = head_snapshot(tmp_path)
    n_files = LARGE + SMALL + 1 + 1  # blobs (config.json too) + refs/main
    n_bytes = LARGE * LARGE_BYTES + SMALL * SMALL_BYTES + len(CONFIG_JSON) + len(REV)

    first = tool.manifest(str(head))  # a read hashes nothing: the digest is unknown until written
    assert first == {"exists": True, "stale": True, "written": False, "files": n_files, "bytes": n_bytes,
                     "digest": None, "to_hash": n_bytes}
    assert not (head / tool.MANIFEST).exists()

    written = tool.manifest(str(head), write=True)
    assert (written["stale"], written["written"], written["hashed"]) == (False, True, None)
    assert re.fullmatch(r"[0-9a-f]{64}", written["digest"])
    assert (head / tool.MANIFEST).is_file()
    before = (head / tool.MANIFEST).stat()

    again = tool.manifest(str(head), write=True)
    assert (again["stale"], again["written"]) == (False, False)
    after = (head / tool.MANIFEST).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "rewritten though current"

    current = tool.manifest(str(head))
    assert (current["stale"], current["written"], current["to_hash"]) == (False, False, 0)
    # The manifest does not count itself; every call agrees on the digest.
    assert {(m["files"], m["bytes"], m["digest"]) for m in (written, again, current)} == {
        (n_files, n_bytes, written["digest"])
    }
    assert tool.manifest(str(head), deep=True)["digest"] == written["digest"]


def test_manifest_lists_files_with_sha256_and_snapshot_links_as_links(tmp_path):
    head = head_snapshot(tmp_path)
    got = entries(tool.build(str(head)))
    blobs = {p: e for p, e in got.items() if p.startswith("blobs/")}
    links = {p: e for p, e in got.items() if "link" in e}
    assert set(got) == set(blobs) | set(links) | {"refs/main"}
    assert len(blobs) == len(links) == LARGE + SMALL + 1
    for path, e in blobs.items():
        assert set(e) == {"path", "size", "mtime_ns", "sha256"}
        assert path == f"blobs/{e['sha256']}"  # content-addressed: the name is the sha256
        assert e["size"] == (head / path).stat().st_size
        assert e["mtime_ns"] == (head / path).stat().st_mtime_ns
    assert got["refs/main"]["size"] == len(REV)
    for path, e in links.items():
        assert set(e) == {"path", "link"}
        assert path.startswith(f"snapshots/{REV}/")
        assert os.path.normpath(os.path.join(os.path.dirname(path), e["link"])) in blobs
    top = got[f"snapshots/{REV}/{large(1)}"]["link"]
    assert re.fullmatch(r"\.\./\.\./blobs/[0-9a-f]{64}", top)
    assert re.fullmatch(r"\.\./\.\./\.\./blobs/[0-9a-f]{64}", got[f"snapshots/{REV}/extra/part-0000.json"]["link"])
    cfg = got[f"snapshots/{REV}/config.json"]["link"]
    assert got[os.path.normpath(f"snapshots/{REV}/{cfg}")]["size"] == len(CONFIG_JSON)


def test_manifest_skips_its_own_files_and_locks(tmp_path):
    head = head_snapshot(tmp_path)
    digest = tool.manifest(str(head), write=True)["digest"]
    (head / ".locks").mkdir()
    (head / ".locks" / "x.lock").write_text("")
    (head / tool.MANIFEST).with_suffix(".json.tmp").write_text("{}")
    m = tool.manifest(str(head))
    assert (m["stale"], m["digest"]) == (False, digest)


def test_digest_changes_with_a_files_content(tmp_path):
    head = head_snapshot(tmp_path)
    before = tool.manifest(str(head), write=True)
    blob = head / blob_of(head, "extra/part-0001.json")
    blob.write_bytes(b"\0" * SMALL_BYTES)  # same size, new mtime: hashed again
    after = tool.manifest(str(head))
    assert (after["stale"], after["digest"], after["to_hash"]) == (True, None, SMALL_BYTES)
    assert (after["files"], after["bytes"]) == (before["files"], before["bytes"])
    rewritten = tool.manifest(str(head), write=True)
    assert rewritten["digest"] != before["digest"]
    assert tool.manifest(str(head)) == {**after, "stale": False, "digest": rewritten["digest"], "to_hash": 0}


def test_digest_changes_with_a_link_target(tmp_path):
    head = head_snapshot(tmp_path)
    before = tool.manifest(str(head), write=True)["digest"]
    link = head / "snapshots" / REV / "config.json"
    link.unlink()
    link.symlink_to(os.path.relpath(head / blob_of(head, large(1)), link.parent))
    assert tool.manifest(str(head))["digest"] != before


def test_digest_ignores_mtime_but_the_manifest_goes_stale(tmp_path):
    head = head_snapshot(tmp_path)
    before = tool.manifest(str(head), write=True)
    blob = head / blob_of(head, large(2))
    st = blob.stat()
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    after = tool.manifest(str(head))
    assert (after["stale"], after["digest"], after["to_hash"]) == (True, None, LARGE_BYTES)
    assert tool.manifest(str(head), write=True)["digest"] == before["digest"]  # the content is the same


def test_cached_sha256_is_reused_while_size_and_mtime_hold(tmp_path, monkeypatch):
    head = head_snapshot(tmp_path)
    before = tool.manifest(str(head), write=True)
    blob = head / blob_of(head, large(1))
    st = blob.stat()
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF
    blob.write_bytes(bytes(data))
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (blob.stat().st_size, blob.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)

    hashed = record_hashing(monkeypatch)
    trusted = tool.manifest(str(head))
    assert hashed == []  # nothing read again: every size and mtime held
    assert (trusted["stale"], trusted["digest"]) == (False, before["digest"])

    deep = tool.manifest(str(head), deep=True)
    assert len(hashed) == LARGE + SMALL + 2  # every file, read afresh
    assert deep["stale"] and deep["digest"] != before["digest"]


# compare()
# ---------


def test_compare_an_identical_copy_is_in_sync(tmp_path):
    head = head_snapshot(tmp_path)
    worker = worker_copy(head, tmp_path)
    for deep in (False, True):
        assert tool.compare(str(worker), wanted(head), deep=deep) == {
            "missing": [], "shorter": [], "differ": [], "links": [], "extra": [],
            "bytes_needed": 0, "in_sync": True,
        }


def test_compare_a_missing_copy_needs_everything(tmp_path):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    got = tool.compare(str(tmp_path / "worker" / head.name), m)
    files = [e for e in m["entries"] if "size" in e]
    assert got["missing"] == [e["path"] for e in files]
    assert got["links"] == [e["path"] for e in m["entries"] if "link" in e]
    assert (got["shorter"], got["differ"], got["extra"]) == ([], [], [])
    assert got["bytes_needed"] == sum(e["size"] for e in files) == tool.manifest(str(head))["bytes"]
    assert got["in_sync"] is False


def damage(worker: Path) -> dict:
    """Break a worker's copy in every way compare() tells apart; what each break should be called."""
    gone, cut, grown = (blob_of(worker, large(i)) for i in (1, 2, 3))
    flipped = blob_of(worker, "extra/part-0002.json")
    (worker / gone).unlink()
    with open(worker / cut, "r+b") as f:
        f.truncate(10_000)
    with open(worker / grown, "ab") as f:
        f.write(b"x" * 100)
    data = bytearray((worker / flipped).read_bytes())
    data[0] ^= 0xFF
    (worker / flipped).write_bytes(bytes(data))

    snap = worker / "snapshots" / REV
    no_link = f"snapshots/{REV}/config.json"
    (snap / "config.json").unlink()
    wrong_link = f"snapshots/{REV}/extra/part-0001.json"
    (snap / "extra" / "part-0001.json").unlink()
    (snap / "extra" / "part-0001.json").symlink_to("../../../blobs/" + "0" * 64)
    file_not_link = f"snapshots/{REV}/extra/part-0003.json"
    (snap / "extra" / "part-0003.json").unlink()
    (snap / "extra" / "part-0003.json").write_bytes(b"a file where a link belongs")
    return {"missing": gone, "shorter": cut, "differ": grown, "same_size": flipped,
            "links": sorted([no_link, wrong_link, file_not_link])}


def test_compare_classifies_each_difference(tmp_path):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    worker = worker_copy(head, tmp_path)
    d = damage(worker)
    (worker / "blobs" / "stray").write_bytes(b"left over")

    got = tool.compare(str(worker), m)
    assert got["missing"] == [d["missing"]]
    assert got["shorter"] == [d["shorter"]]
    assert got["differ"] == [d["differ"]]  # longer than the head's: cannot be resumed
    assert sorted(got["links"]) == d["links"]
    assert got["extra"] == ["blobs/stray"]
    # a missing or longer file is sent whole, a short one only its tail; links cost no bytes
    assert got["bytes_needed"] == LARGE_BYTES + (LARGE_BYTES - 10_000) + LARGE_BYTES
    assert got["in_sync"] is False

    deep = tool.compare(str(worker), m, deep=True)
    assert sorted(deep["differ"]) == sorted([d["differ"], d["same_size"]])
    assert deep["shorter"] == [d["shorter"]]  # still resumed (--append-verify checks the whole file)
    assert deep["bytes_needed"] == got["bytes_needed"] + SMALL_BYTES


def test_compare_trusts_the_copys_recorded_sha256_while_it_holds(tmp_path):
    """A same-size file that differs is found without hashing when this copy's manifest (written
    by a deep ``manifest --write`` just before) records its sha256; not while nothing records it."""
    head = head_snapshot(tmp_path)
    m = wanted(head)
    worker = worker_copy(head, tmp_path)
    d = damage(worker)
    assert d["same_size"] not in tool.compare(str(worker), m)["differ"]  # nothing recorded: sizes only
    tool.manifest(str(worker), write=True, deep=True)
    got = tool.compare(str(worker), m)
    assert sorted(got["differ"]) == sorted([d["differ"], d["same_size"]])
    assert got == tool.compare(str(worker), m, deep=True)


def test_compare_only_extra_files_is_not_in_sync(tmp_path):
    head = head_snapshot(tmp_path)
    worker = worker_copy(head, tmp_path)
    (worker / "blobs" / "stray").write_bytes(b"left over")
    got = tool.compare(str(worker), wanted(head))
    assert (got["extra"], got["bytes_needed"], got["in_sync"]) == (["blobs/stray"], 0, False)


# plan()
# ------


def read_lists(out: Path) -> list[list[str]]:
    names = sorted(p.name for p in out.glob("list.*"))
    assert names == [f"list.{i}" for i in range(len(names))], names
    return [(out / n).read_text().splitlines() for n in names]


def test_plan_drops_what_cannot_be_resumed_and_lists_the_rest(tmp_path):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    worker = worker_copy(head, tmp_path)
    d = damage(worker)
    (worker / "blobs" / "stray").write_bytes(b"left over")
    out = tmp_path / "out"
    out.mkdir()
    diff = tool.compare(str(worker), m)
    assert diff["extra"] == ["blobs/stray"]

    got = tool.plan(str(worker), m, str(out), 3)

    assert not os.path.lexists(worker / d["differ"])
    assert not os.path.lexists(worker / "blobs" / "stray")  # the head does not have it: dropped, not listed
    for link in d["links"]:
        assert not os.path.lexists(worker / link)
    assert (worker / d["shorter"]).stat().st_size == 10_000  # kept: resumed, not resent
    assert (worker / d["same_size"]).exists()  # sizes only: not seen, kept
    lists = read_lists(out)
    assert got == {"lists": len(lists), "bytes_needed": diff["bytes_needed"]}
    assert all(lists), "an empty list"
    lines = [line for lst in lists for line in lst]
    needed = [d["missing"], d["shorter"], d["differ"], *d["links"]]
    assert sorted(lines) == sorted(f"{head.name}/{p}" for p in needed)  # each exactly once
    assert len(lines) == len(set(lines))


def test_plan_deep_drops_same_size_files_that_differ(tmp_path):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    worker = worker_copy(head, tmp_path)
    d = damage(worker)
    out = tmp_path / "out"
    out.mkdir()
    tool.plan(str(worker), m, str(out), 2, deep=True)
    assert not os.path.exists(worker / d["same_size"])
    assert f"{head.name}/{d['same_size']}" in {line for lst in read_lists(out) for line in lst}


def test_plan_spreads_by_bytes_largest_first(tmp_path):
    head = head_snapshot(tmp_path, large=7, large_bytes=64 * KIB, small=9, small_bytes=3 * KIB)
    # vary the sizes so that the spreading is visible
    m = wanted(head)
    for i, e in enumerate(x for x in m["entries"] if x.get("size") == 64 * KIB):
        e["size"] = (i + 1) * 8 * KIB
    sizes = {f"{head.name}/{e['path']}": e.get("size", 0) for e in m["entries"]}
    out = tmp_path / "out"
    out.mkdir()
    streams = 3

    got = tool.plan(str(tmp_path / "worker" / head.name), m, str(out), streams)

    lists = read_lists(out)
    assert got["lists"] == len(lists) == streams
    lines = [line for lst in lists for line in lst]
    assert sorted(lines) == sorted(sizes)
    for lst in lists:
        assert [sizes[p] for p in lst] == sorted((sizes[p] for p in lst), reverse=True), "not largest first"
    largest = sorted(sizes, key=lambda p: -sizes[p])[:streams]
    assert {lst[0] for lst in lists} == set(largest)  # the largest files start different streams
    loads = [sum(sizes[p] for p in lst) for lst in lists]
    assert max(loads) - min(loads) <= max(sizes.values())


def test_plan_never_writes_more_lists_than_files(tmp_path):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    worker = worker_copy(head, tmp_path)
    (worker / blob_of(worker, large(1))).unlink()
    (worker / blob_of(worker, large(2))).unlink()
    out = tmp_path / "out"
    out.mkdir()
    assert tool.plan(str(worker), m, str(out), 8)["lists"] == 2
    assert [len(lst) for lst in read_lists(out)] == [1, 1]


def test_plan_of_a_copy_in_sync_writes_nothing(tmp_path):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    worker = worker_copy(head, tmp_path)
    before = tool.build(str(worker))
    out = tmp_path / "out"
    out.mkdir()
    assert tool.plan(str(worker), m, str(out), 4) == {"lists": 0, "bytes_needed": 0}
    assert list(out.iterdir()) == []
    assert tool.build(str(worker)) == before


# adopt()
# -------


def lines_to_paths(lines: list[str], name: str) -> list[str]:
    """``<name>/<rel>`` list lines -> repo-relative paths."""
    assert all(line.startswith(name + "/") for line in lines), lines
    return [line[len(name) + 1:] for line in lines]


def regular_files(repo: Path) -> set[str]:
    return {rel for rel, path in tool._walk(str(repo)) if not os.path.islink(path)}


@pytest.mark.parametrize("own_manifest", [True, False])
def test_pull_then_adopt_reaches_the_heads_digest_without_reading_pulled_files(tmp_path, monkeypatch, own_manifest):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    worker = worker_copy(head, tmp_path)
    if own_manifest:  # a worker staged before: its own manifest caches every hash
        tool.manifest(str(worker), write=True)
    damage(worker)
    out = tmp_path / "out"
    out.mkdir()
    tool.plan(str(worker), m, str(out), 3, deep=True)  # deep: the same-size change is pulled too
    copied = pull(head, worker, out)
    pulled = tool.pulled_paths(str(out), worker.name)
    assert sorted(pulled) == sorted(lines_to_paths(copied, worker.name))
    pulled_files = regular_files(worker) & set(pulled)
    assert len(pulled_files) == 4  # missing, shorter, differ, same size (links are pulled too, not hashed)

    hashed = record_hashing(monkeypatch)
    got = tool.adopt(str(worker), m, pulled)

    read = {os.path.relpath(p, worker) for p in hashed}
    assert not read & pulled_files, "a pulled file was read: its size matches, the head's sha256 is taken"
    # the rest: from the worker's own cache, or (without one) hashed here, once each
    assert read == (set() if own_manifest else regular_files(worker) - pulled_files)
    assert len(hashed) == len(read)
    # With its own manifest, the repaired copy is again what that manifest recorded (pulled files
    # carry the head's mtime, as rsync -a leaves them): already current, not rewritten.
    assert got["written"] is (not own_manifest) and got["digest"] == m["digest"]
    mine = json.loads((worker / tool.MANIFEST).read_text())
    theirs = entries(m)
    for path, e in entries(mine).items():
        if "sha256" in e:
            assert e["sha256"] == theirs[path]["sha256"]
            assert e["mtime_ns"] == (worker / path).stat().st_mtime_ns  # its own mtime
    assert tool.manifest(str(worker)) == {**tool.manifest(str(head)), "stale": False, "written": False}
    assert tool.manifest(str(worker), deep=True)["digest"] == m["digest"]
    assert tool.compare(str(worker), m, deep=True)["in_sync"]


@pytest.mark.parametrize("size", [10_000, LARGE_BYTES + 1])
def test_adopt_hashes_a_wrongly_sized_pulled_file_itself(tmp_path, monkeypatch, size):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    worker = worker_copy(head, tmp_path)
    tool.manifest(str(worker), write=True)
    bad = blob_of(worker, large(2))
    with open(worker / bad, "r+b") as f:
        f.truncate(size)

    hashed = record_hashing(monkeypatch)
    got = tool.adopt(str(worker), m, [bad])

    assert [os.path.relpath(p, worker) for p in hashed] == [bad]
    assert got["written"] and got["digest"] != m["digest"]
    mine = entries(json.loads((worker / tool.MANIFEST).read_text()))
    assert mine[bad]["size"] == size
    assert mine[bad]["sha256"] == tool._sha256(str(worker / bad)) != entries(m)[bad]["sha256"]


def test_adopt_hashes_a_pulled_file_the_head_does_not_list(tmp_path, monkeypatch):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    worker = worker_copy(head, tmp_path)
    tool.manifest(str(worker), write=True)
    (worker / "blobs" / "stray").write_bytes(b"x" * SMALL_BYTES)

    hashed = record_hashing(monkeypatch)
    got = tool.adopt(str(worker), m, ["blobs/stray", "blobs/not-there", f"snapshots/{REV}/config.json"])

    assert [os.path.relpath(p, worker) for p in hashed] == ["blobs/stray"]
    assert got["digest"] != m["digest"]
    stray = entries(json.loads((worker / tool.MANIFEST).read_text()))["blobs/stray"]
    assert stray["sha256"] == tool._sha256(str(worker / "blobs" / "stray"))


def test_adopt_does_not_record_a_missing_file(tmp_path):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    worker = worker_copy(head, tmp_path)
    tool.manifest(str(worker), write=True)
    gone = blob_of(worker, large(1))
    (worker / gone).unlink()
    got = tool.adopt(str(worker), m, [gone])  # listed, but the transfer did not leave it
    assert got["digest"] != m["digest"]
    assert gone not in entries(json.loads((worker / tool.MANIFEST).read_text()))
    assert got["files"] == tool.manifest(str(head))["files"] - 1


def test_adopt_keeps_the_workers_own_hash_of_a_same_size_file_it_did_not_pull(tmp_path, monkeypatch):
    """
    A same-size corrupted file is not seen by a sizes-only plan, so it is not pulled: adopt must
    not hand it the head's sha256. Its own hash stands and the digest tells the copies apart.
    """
    head = head_snapshot(tmp_path)
    m = wanted(head)
    worker = worker_copy(head, tmp_path)
    tool.manifest(str(worker), write=True)
    d = damage(worker)  # same_size: changed after the worker's manifest (new mtime)
    out = tmp_path / "out"
    out.mkdir()
    tool.plan(str(worker), m, str(out), 2)
    pull(head, worker, out)
    pulled = tool.pulled_paths(str(out), worker.name)
    assert d["same_size"] not in pulled

    hashed = record_hashing(monkeypatch)
    got = tool.adopt(str(worker), m, pulled)

    assert [os.path.relpath(p, worker) for p in hashed] == [d["same_size"]]  # its mtime moved
    own = tool._sha256(str(worker / d["same_size"]))
    mine = entries(json.loads((worker / tool.MANIFEST).read_text()))
    assert mine[d["same_size"]]["sha256"] == own != entries(m)[d["same_size"]]["sha256"]
    assert got["digest"] != m["digest"]
    assert got["digest"] == tool.manifest(str(worker), deep=True)["digest"]  # the truth about this copy

    # The worker's manifest already knew the corrupted file (cached hash, size and mtime held):
    # adopting again keeps that hash and reads nothing.
    hashed.clear()
    again = tool.adopt(str(worker), m, pulled)
    assert hashed == [] and again["digest"] == got["digest"]

    # A deep plan sees it, pulls it, and the copies converge.
    out2 = tmp_path / "out2"
    out2.mkdir()
    tool.plan(str(worker), m, str(out2), 2, deep=True)
    pull(head, worker, out2)
    pulled = tool.pulled_paths(str(out2), worker.name)
    assert pulled == [d["same_size"]]
    assert tool.adopt(str(worker), m, pulled)["digest"] == m["digest"]


def test_adopt_with_nothing_pulled_on_a_copy_in_sync(tmp_path, monkeypatch):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    worker = worker_copy(head, tmp_path)
    tool.manifest(str(worker), write=True)
    out = tmp_path / "out"
    out.mkdir()
    assert tool.plan(str(worker), m, str(out), 4)["lists"] == 0
    assert tool.pulled_paths(str(out), worker.name) == []
    hashed = record_hashing(monkeypatch)
    got = tool.adopt(str(worker), m, [])
    assert hashed == [] and (got["written"], got["digest"]) == (False, m["digest"])


def test_pulled_paths_reads_only_the_plans_lists(tmp_path):
    name = "models--org--model"
    (tmp_path / "list.0").write_text(f"{name}/blobs/a\n{name}/snapshots/{REV}/x.json\n")
    (tmp_path / "list.1").write_text(f"  {name}/blobs/b  \n\n{name}-2/blobs/other\n{name}blobs/c\n")
    (tmp_path / "list.10").write_text(f"{name}/blobs/d\n")
    (tmp_path / "list.0.log").write_text(f"{name}/blobs/log\n")  # the pull script's rsync logs
    (tmp_path / "list.x").write_text(f"{name}/blobs/x\n")
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "plan.json").write_text(f"{name}/blobs/plan\n")
    got = tool.pulled_paths(str(tmp_path), name)
    assert sorted(got) == ["blobs/a", "blobs/b", "blobs/d", f"snapshots/{REV}/x.json"]
    assert tool.pulled_paths(str(tmp_path), "models--other") == []
    empty = tmp_path / "empty"
    empty.mkdir()
    assert tool.pulled_paths(str(empty), name) == []


def test_pulled_paths_round_trips_a_plan(tmp_path):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    out = tmp_path / "out"
    out.mkdir()
    tool.plan(str(tmp_path / "worker" / head.name), m, str(out), 3)
    lines = [line for lst in read_lists(out) for line in lst]
    assert sorted(tool.pulled_paths(str(out), head.name)) == sorted(lines_to_paths(lines, head.name))
    assert sorted(tool.pulled_paths(str(out), head.name)) == sorted(e["path"] for e in m["entries"])


def test_staging_converges_on_a_worker_with_an_extra_file(tmp_path):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    worker = worker_copy(head, tmp_path)
    (worker / blob_of(worker, large(1))).unlink()
    stray = worker / "blobs" / ("f" * 64)
    stray.write_bytes(b"a blob of another revision")
    old_rev = worker / "snapshots" / ("9" * 40)
    old_rev.mkdir()
    (old_rev / "config.json").symlink_to("../../blobs/" + "f" * 64)
    out = tmp_path / "out"
    out.mkdir()
    tool.plan(str(worker), m, str(out), 2)
    assert not os.path.lexists(stray) and not os.path.lexists(old_rev / "config.json")
    pull(head, worker, out)
    assert tool.adopt(str(worker), m, tool.pulled_paths(str(out), worker.name))["digest"] == m["digest"]
    assert tool.compare(str(worker), m, deep=True)["in_sync"]


# main()
# ------


def run_main(capsys, *argv) -> dict:
    assert tool.main([str(a) for a in argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_main_manifest(tmp_path, capsys):
    head = head_snapshot(tmp_path)
    digest = tool.build(str(head))["digest"]
    assert run_main(capsys, "manifest", tmp_path / "nothing") == {"exists": False, "stale": True}
    got = run_main(capsys, "manifest", head)
    assert (got["stale"], got["written"], got["digest"]) == (True, False, None)
    got = run_main(capsys, "manifest", head, "--write")
    assert (got["stale"], got["written"], got["digest"]) == (False, True, digest)
    got = run_main(capsys, "manifest", head, "--deep")
    assert (got["stale"], got["written"], got["digest"]) == (False, False, digest)


def test_main_manifest_progress_tells_what_it_hashes(tmp_path, capsys, monkeypatch):
    head = head_snapshot(tmp_path)
    monkeypatch.setenv("PROGRESS_EVERY", "0")  # a line for every chunk read
    host = socket.gethostname()
    assert tool.main(["manifest", str(head), "--write", "--progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    total = LARGE * LARGE_BYTES + SMALL * SMALL_BYTES + len(CONFIG_JSON) + len(REV)
    assert re.fullmatch(rf"{host}: hashed \d+ of {total >> 20} MiB, \d+ MiB/s, ETA \d+ s", lines[0]), lines[0]
    assert re.fullmatch(rf"{host}: manifest of {head.name}: {LARGE + SMALL + 2} files, {total >> 20} MiB, "
                        rf"{total >> 20} MiB hashed in \d+ s", lines[-1]), lines[-1]
    assert tool.main(["manifest", str(head), "--write", "--progress"]) == 0  # current: nothing hashed
    assert capsys.readouterr().out.splitlines() == [
        f"{host}: manifest of {head.name}: {LARGE + SMALL + 2} files, {total >> 20} MiB, 0 MiB hashed in 0 s, unchanged"
    ]
    assert tool.main(["manifest", str(tmp_path / "nothing"), "--write", "--progress"]) == 1
    assert capsys.readouterr().err == f"{host}: no snapshot at {tmp_path / 'nothing'}\n"


def test_main_show(tmp_path, capsys):
    head = head_snapshot(tmp_path)
    assert run_main(capsys, "show", tmp_path / "nothing") == {"entries": []}
    assert run_main(capsys, "show", head) == tool.build(str(head))
    tool.manifest(str(head), write=True)
    assert run_main(capsys, "show", head, "--deep") == json.loads((head / tool.MANIFEST).read_text())


def test_main_compare_plan_adopt(tmp_path, capsys):
    head = head_snapshot(tmp_path)
    m = wanted(head)
    manifest_file = head / tool.MANIFEST
    worker = worker_copy(head, tmp_path)
    d = damage(worker)
    expected = tool.compare(str(worker), m)

    assert run_main(capsys, "compare", worker, manifest_file) == expected
    deep = run_main(capsys, "compare", worker, manifest_file, "--deep")
    assert d["same_size"] in deep["differ"]

    out = tmp_path / "out"
    out.mkdir()
    got = run_main(capsys, "plan", worker, manifest_file, out, "2")
    assert got == {"lists": 2, "bytes_needed": expected["bytes_needed"]}
    assert len(read_lists(out)) == 2

    pull(head, worker, out)
    (out / "list.0.log").write_text("rsync output\n")  # what the pull script leaves next to the lists
    got = run_main(capsys, "adopt", str(worker) + "/", manifest_file, out)
    # sizes only: the same-size flipped file was not seen nor pulled, so it keeps its own hash
    assert got["written"] is True and got["digest"] != m["digest"]
    mine = entries(json.loads((worker / tool.MANIFEST).read_text()))
    assert mine[d["same_size"]]["sha256"] == tool._sha256(str(worker / d["same_size"]))
    assert got["digest"] == tool.manifest(str(worker), deep=True)["digest"]

    out2 = tmp_path / "out2"
    out2.mkdir()
    assert run_main(capsys, "plan", worker, manifest_file, out2, "2", "--deep")["lists"] == 1
    pull(head, worker, out2)
    got = run_main(capsys, "adopt", worker, manifest_file, out2)
    assert (got["written"], got["digest"]) == (True, m["digest"])


def test_the_tool_runs_standalone_as_nodes_run_it(tmp_path):
    """``python3 -c <source> manifest DIR`` (how ``sparkinfra.facts`` ships it): stdlib only."""
    head = head_snapshot(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", transfer.tool_source(), "manifest", str(head)],
        capture_output=True, text=True, timeout=10,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == tool.manifest(str(head))


# sparkinfra.stage
# ----------------


@pytest.mark.parametrize("model_dir, repo, expected", [
    ("/var/lib/sparkinfra/hf", "org/name", "/var/lib/sparkinfra/hf/models--org--name"),
    ("/var/lib/sparkinfra/hf/", "Org/Name-1.5B", "/var/lib/sparkinfra/hf/models--Org--Name-1.5B"),
    ("/hf", "name", "/hf/models--name"),
])
def test_repo_dir(model_dir, repo, expected):
    assert transfer.repo_dir(model_dir, repo) == expected


def test_repo_dir_is_where_the_hf_cache_puts_it(tmp_path):
    made = make_snapshot(tmp_path, "Org/Name-1.5B", REV, large=0, large_bytes=0, small=0)
    assert transfer.repo_dir(str(tmp_path), "Org/Name-1.5B") == str(made)


def test_models_target_then_drafter(tmp_path):
    cluster = load_cluster(tmp_path, {"model": "org/target", "model_revision": "abc123",
                                      "drafter": "org/draft", "drafter_revision": "def456"})
    assert transfer.models(cluster) == [("org/target", "abc123"), ("org/draft", "def456")]


def test_models_without_drafter_or_model(tmp_path):
    assert transfer.models(load_cluster(tmp_path, {"model": "org/target"})) == [("org/target", "main")]
    assert transfer.models(load_cluster(tmp_path, {"model": "org/target", "drafter": ""})) == [("org/target", "main")]
    assert transfer.models(load_cluster(tmp_path)) == []


REPO_DIR = "/var/lib/sparkinfra/hf/models--org--model"
SCRIPTS = Path(transfer.scripts.DIR)
NODE = Path(transfer.scripts.DIR).parent / "node"


# The node scripts (sparkinfra/scripts/*.sh, sparkinfra/node/*.sh): linted, and run here with stand-ins only for what
# the test cannot do (systemd, docker, an rsync daemon on the fabric)
# ---------------------------------------------------------------------------------------------


def test_node_shell_scripts_pass_shellcheck():
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert shellcheck, "shellcheck is not installed (make setup installs it)"
    found = sorted([*SCRIPTS.glob("*.sh"), *NODE.glob("*.sh")])  # the node programs' too
    assert {p.name for p in found} >= {"stage_serve.sh", "image_receive.sh", "apply_mods.sh"}
    proc = subprocess.run([shellcheck, "--severity=style", *map(str, found)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def stubs(tmp_path: Path, **scripts: str) -> dict:
    """An environment whose PATH finds these stand-ins (name -> sh script body) first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run_pull(tmp_path: Path, head: Path, worker_repo: Path, env: dict, deep: bool = False,
             source: str = "", **popen):
    """``pull_command`` as pyinfra runs it on a worker (``sh -c``, its sudo aside), pulling from
    a local source (the head's manifest read from there too) unless given one."""
    command = transfer.pull_command(str(worker_repo), source or f"{head.parent}/", 4, deep).get_raw_value()
    return subprocess.Popen(["sh", "-c", command], env=env, text=True, stdin=subprocess.DEVNULL, **popen)


def staged_head(tmp_path: Path, **kw) -> Path:
    head = head_snapshot(tmp_path, **kw)
    assert tool.main(["manifest", str(head), "--write"]) == 0
    return head


@pytest.mark.parametrize("deep", [False, True])
def test_pull_fetches_a_snapshot_and_records_the_heads_manifest(tmp_path, capsys, deep):
    head = staged_head(tmp_path)
    capsys.readouterr()
    worker = tmp_path / "worker" / head.name
    env = dict(os.environ)
    proc = run_pull(tmp_path, head, worker, env, deep, stderr=subprocess.PIPE)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert tool.manifest(str(worker))["digest"] == tool.manifest(str(head))["digest"]
    assert (worker / tool.MANIFEST).exists() and not tool.manifest(str(worker))["stale"]


def test_pull_resumes_a_short_file_and_sends_only_what_is_missing(tmp_path, capsys):
    head = staged_head(tmp_path)
    worker = worker_copy(head, tmp_path)
    shard = next(worker.rglob("model-00001-of-*.safetensors")).resolve()
    whole = shard.read_bytes()
    shard.write_bytes(whole[: len(whole) // 2])  # a transfer cut short
    log = tmp_path / "rsync.log"
    env = stubs(tmp_path, rsync=f'echo "$*" >> {log}\nexec /usr/bin/rsync "$@"\n')
    proc = run_pull(tmp_path, head, worker, env, stderr=subprocess.PIPE)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert shard.read_bytes() == whole
    pulls = [line for line in log.read_text().splitlines() if "--files-from" in line]
    assert pulls and all("--append-verify" in line and "--partial" in line for line in pulls)
    assert tool.manifest(str(worker))["digest"] == tool.manifest(str(head))["digest"]


PULL_PROGRESS = r"[\w.-]+: \d+ of \d+ MiB, \d+ MiB/s, ETA \d+ s"
PULL_DONE = r"[\w.-]+: (\d+) MiB in (\d+) s, \d+ MiB/s"


def test_pull_reports_progress_then_what_it_pulled_and_lets_go_of_its_output_at_the_end(tmp_path):
    head = staged_head(tmp_path, large_bytes=1 << 20)  # 3 MiB and a few KiB to pull
    worker = tmp_path / "worker" / head.name
    slow_rsync = 'case "$*" in *--files-from*) sleep 2.5;; esac\nexec /usr/bin/rsync "$@"\n'
    env = {**stubs(tmp_path, rsync=slow_rsync), "PROGRESS_EVERY": "1"}
    began = time.monotonic()
    proc = run_pull(tmp_path, head, worker, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    took = time.monotonic() - began
    *progress, last = proc.stdout.read().splitlines()
    assert progress and all(re.fullmatch(PULL_PROGRESS, line) for line in progress), progress
    assert len(progress) <= took + 1, "more than one line a second"
    done = re.fullmatch(PULL_DONE, last)
    assert done and done[1] == "3" and 2 <= int(done[2]) <= took + 1, last
    # asleep in its 30 s wait when the pull ends: the loop must end with it, not at its next tick
    env["PROGRESS_EVERY"] = "30"
    shutil.rmtree(worker)
    proc = run_pull(tmp_path, head, worker, env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=10)  # to the end of its output
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the progress loop still holds the output open")
    assert re.fullmatch(PULL_DONE, out.strip()), "not only the last line"
    assert proc.returncode == 0


def test_pull_from_the_heads_daemon_waits_for_its_port_reads_its_manifest_there_and_sets_tcp_nodelay(tmp_path):
    """The pull starts as the head's daemon does: it waits until the port answers (here 1 s late),
    takes the head's manifest from the daemon, then every rsync stream sets TCP_NODELAY (a stream's
    handshake is a few small messages: ~0.1 s each with Nagle against delayed ACKs, ~0.03 s without)."""
    head = staged_head(tmp_path)
    worker = tmp_path / "worker" / head.name
    log = tmp_path / "rsync.log"
    # The stand-in daemon's rsync: it logs each call and hands out the head's manifest when asked for
    # it, put in place by a rename once whole, as rsync does (a plain cp is seen half-written).
    env = stubs(tmp_path, rsync=(f'echo "$(date +%s.%N) $*" >> {log}\n'
                                 f'case "$*" in *{tool.MANIFEST}*) for a; do :; done; '
                                 f'cp {head / tool.MANIFEST} "$a.part" && mv "$a.part" "$a";; esac\n'))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    began = time.time()
    source = f"rsync://127.0.0.1:{port}/stage/"
    proc = run_pull(tmp_path, head, worker, env, source=source, stderr=subprocess.PIPE)
    time.sleep(1)
    with socket.socket() as daemon:
        daemon.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        daemon.bind(("127.0.0.1", port))
        daemon.listen()
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    (first_at, first), *pulls = [line.split(" ", 1) for line in log.read_text().splitlines()]
    assert float(first_at) >= began + 1, "the manifest was asked for before the daemon listened"
    assert first.startswith("--sockopts=TCP_NODELAY ") and f" {source}{head.name}/{tool.MANIFEST} " in first
    assert pulls and all("--sockopts=TCP_NODELAY" in args and args.endswith(f"{source} .") for _, args in pulls), pulls


def test_the_pull_reads_the_manifest_once_in_place_not_at_the_rsyncs_exit(tmp_path):
    """rsync puts the manifest in place, then waits ~20 ms for its receiver process (here 2 s): the
    plan and the pulls go on meanwhile, and the pull still ends with the snapshot recorded."""
    head = staged_head(tmp_path)
    worker = tmp_path / "worker" / head.name
    log = tmp_path / "rsync.log"
    env = stubs(tmp_path, rsync=(f'case "$*" in *--files-from*) echo "pull $(date +%s.%N)" >> {log}; '
                                 'exec /usr/bin/rsync "$@";; esac\n'
                                 f'/usr/bin/rsync "$@" || exit\nsleep 2\necho "exit $(date +%s.%N)" >> {log}\n'))
    proc = run_pull(tmp_path, head, worker, env, stderr=subprocess.PIPE)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    events = dict(line.split() for line in log.read_text().splitlines())
    assert float(events["pull"]) < float(events["exit"]) - 1, events
    assert tool.manifest(str(worker))["digest"] == tool.manifest(str(head))["digest"]


def test_a_pull_whose_source_has_no_manifest_ends_naming_it(tmp_path):
    head = staged_head(tmp_path)
    (head / tool.MANIFEST).unlink()
    proc = run_pull(tmp_path, head, tmp_path / "worker" / head.name, dict(os.environ),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.wait(timeout=30) == 1
    assert f"the head's manifest of {head.name} could not be read from {head.parent}/" in proc.stderr.read()


def test_the_pulls_wait_for_a_daemon_that_never_answers_ends_naming_it():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    began = time.monotonic()
    with pytest.raises(SystemExit, match=rf"the head's rsync daemon at 127\.0\.0\.1:{port} did not answer in 0\.5 s"):
        stage_pull.wait_for(f"127.0.0.1:{port}", seconds=0.5)
    assert time.monotonic() - began < 3


def test_pull_and_serve_commands_ship_no_file_list_and_fit_one_argument(tmp_path):
    """However many files a snapshot has, the commands carry none of them (each worker plans its
    own, from the manifest it reads from the head's daemon); on 8 nodes (7 workers) the head's
    command grows by the addresses only, and each is one argument under Linux's MAX_ARG_STRLEN."""
    repo = make_snapshot(tmp_path / "hf", REPO, REV, large=2, large_bytes=KIB, small=400, small_bytes=16)
    workers = [f"10.213.1.{i}" for i in range(2, 9)]
    pull = transfer.pull_command(str(repo), transfer.source("10.213.1.1", 8730), 64, True).get_raw_value()
    serve = transfer.serve_command(str(repo), workers, "10.213.1.1", 8730).get_raw_value()
    for command in (pull, serve):
        assert "safetensors" not in command and "part-0000" not in command
        assert len(command) < MAX_ARG_STRLEN
    one = transfer.serve_command(str(repo), workers[:1], "10.213.1.1", 8730).get_raw_value()
    assert len(serve) - len(one) < KIB


def serve_run(tmp_path: Path, workers: list[str], stale: bool = False):
    """``serve_command`` run with stand-ins for systemctl and systemd-run (each keeps its arguments;
    systemd-run also the daemon's config as it was when the unit started). ``stale``: a unit a run
    that died left is still there: systemd-run refuses the name until systemctl stops it, whose
    ``ExecStopPost`` removes the config."""
    seen = tmp_path / "seen"
    seen.mkdir()
    repo = tmp_path / "hf" / "models--org--name"
    repo.mkdir(parents=True)
    conf = tmp_path / "run/stage-rsyncd.conf"
    if not stale:
        (seen / "stopped").touch()
    env = stubs(
        tmp_path,
        systemctl=f'echo "$*" >> {seen}/systemctl\ntouch {seen}/stopped\nrm -f {conf}\n',
        **{"systemd-run": (f'[ -e {seen}/stopped ] || {{ echo "Unit was already loaded" >&2; exit 1; }}\n'
                           f'printf "%s\\n" "$@" > {seen}/systemd-run\n'
                           f'for a; do case "$a" in --config=*) cp "${{a#--config=}}" {seen}/rsyncd.conf;; esac; done\n')},
    )
    command = transfer.serve_command(str(repo), workers, "10.213.1.1", 8730, conf=str(conf))
    proc = subprocess.run(["sh", "-c", command.get_raw_value()], env=env, capture_output=True, text=True, timeout=60)
    return proc, seen, repo


def rsyncd_conf(text: str) -> dict:
    conf, section = {}, ""
    for raw in text.splitlines():
        if raw.startswith("["):
            section = raw.strip("[]")
            continue
        key, _, value = raw.partition("=")
        conf[(section, key.strip())] = value.strip()
    return conf


@pytest.mark.parametrize("stale", [False, True])
def test_the_head_serves_read_only_to_the_workers_from_a_transient_unit_that_ends(tmp_path, stale):
    workers = ["10.213.1.2", "10.213.1.3", "10.213.1.4"]
    proc, seen, repo = serve_run(tmp_path, workers, stale=stale)
    assert proc.returncode == 0, proc.stderr
    # a unit a run that died left behind is stopped, then this run's started (with its config);
    # none there: no stop (one systemd-run, which does not wait for the start job)
    stops = (seen / "systemctl").read_text() if (seen / "systemctl").exists() else ""
    assert stops == (f"stop {transfer.STAGE_UNIT}\n" if stale else "")
    conf = rsyncd_conf((seen / "rsyncd.conf").read_text())
    assert conf[("", "address")] == "10.213.1.1" and conf[("", "port")] == "8730"
    assert conf[("", "socket options")] == "TCP_NODELAY"
    assert conf[("stage", "path")] == str(repo.parent)
    assert conf[("stage", "read only")] == "yes"
    assert conf[("stage", "hosts allow")].split() == workers
    assert conf[("stage", "hosts deny")] == "*"
    run = (seen / "systemd-run").read_text().splitlines()
    assert f"--unit={transfer.STAGE_UNIT}" in run and "--collect" in run and "--no-block" in run
    # killed once the pulls are done (transfer.unserve_command): a success, not a failed unit
    assert {"--property=KillSignal=SIGKILL", "--property=SuccessExitStatus=SIGKILL", "--property=RuntimeMaxSec=6h"} <= set(run)
    conf_file = tmp_path / "run/stage-rsyncd.conf"
    assert f"--property=ExecStopPost=/bin/rm -f {conf_file}" in run
    assert run[-4:] == ["rsync", "--daemon", "--no-detach", f"--config={conf_file}"]
    assert oct(conf_file.parent.stat().st_mode & 0o777) == "0o700"


# The image fan-out (image_fanout.py, image_receive.sh): tests/unit/test_image_fanout.py
