"""
Runs ON a node (python3, stdlib only; shipped inline by sparkinfra.stage): the manifest of a model
snapshot in HF-cache layout, and how a node's copy differs from it.

    python3 - manifest REPO_DIR                      -> {"stale": bool, "files": n, "bytes": n, "digest": ..., "to_hash": n}
    python3 - manifest REPO_DIR --write [--deep] [--progress]
        -> hashes what changed (with --deep: every file) and records it; with --progress, a line every
           PROGRESS_EVERY seconds (default 5) while it hashes, then one line of what it did
    python3 - show REPO_DIR [--deep]                -> the manifest of this copy, every entry
    python3 - compare REPO_DIR MANIFEST_FILE [--deep] -> {"missing": [...], "differ": [...], ...}
    python3 - adopt REPO_DIR MANIFEST_FILE WORK_DIR -> writes this copy's manifest, trusting what the plan's lists pulled
    python3 - plan REPO_DIR MANIFEST_FILE OUT_DIR STREAMS [--deep]
        -> drops what cannot be resumed, writes OUT_DIR/list.N (paths relative to the cache folder)

A worker's pull (stage_pull.py) runs plan, plan_lists and adopt from this file.

A node's manifest digest says everything about its copy: equal digests, equal snapshots (with
``--deep`` every sha256 is computed afresh instead of trusted from the size/mtime cache). Reading
a manifest never hashes (a fresh 224 GB snapshot takes minutes): a copy whose files changed since
the manifest was recorded is ``stale``, its digest unknown until ``--write`` hashes them.

The manifest (``.sparkinfra-manifest.json`` in the repo folder) lists every regular file (relative
path, size, mtime_ns, sha256) and every symlink (target) of the repo folder; sha256 is computed
once and reused while a file's size and mtime stay the same.
"""

import hashlib
import json
import os
import socket
import sys
import time

MANIFEST = ".sparkinfra-manifest.json"
SKIP_PREFIX = (".sparkinfra", ".locks")


def _walk(repo):
    """(path relative to ``repo``, path) of every file and link under it, sorted, the tool's own
    files left out. Relative paths are cut from the walk's (``os.path.relpath`` per file costs
    more than the walk itself on a snapshot of many small files)."""
    top = os.path.normpath(repo)
    for root, dirs, files in os.walk(top):
        linked = [d for d in dirs if os.path.islink(os.path.join(root, d))]
        dirs[:] = sorted(d for d in dirs if d not in linked and not d.startswith(SKIP_PREFIX))
        prefix = "" if root == top else root[len(top) + 1:] + "/"
        for name in sorted(files + linked):
            if name.startswith(SKIP_PREFIX):
                continue
            yield prefix + name, os.path.join(root, name)


def _sha256(path, meter=None):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            if meter:
                meter(len(chunk))
    return digest.hexdigest()


class Meter:
    """Bytes hashed so far, told every ``every`` seconds as the pull and the download tell theirs:
    ``spark-1: hashed 91 of 192 MiB, 18 MiB/s, ETA 5 s``."""

    def __init__(self, total, every):
        self.total, self.every, self.done = total, every, 0
        self.began = self.last = time.monotonic()

    def __call__(self, n):
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            rate = int(self.done / max(now - self.began, 1e-3))
            eta = (self.total - self.done) // rate if rate > 0 else 0
            print(f"{socket.gethostname()}: hashed {self.done >> 20} of {self.total >> 20} MiB, "
                  f"{rate >> 20} MiB/s, ETA {eta} s", flush=True)


def _unchanged(prev, st):
    """Whether a recorded entry still describes a file (same size and mtime: its sha256 holds)."""
    return bool(prev) and prev.get("size") == st.st_size and prev.get("mtime_ns") == st.st_mtime_ns


def build(repo, cached=None, deep=False, meter=None):
    """The manifest of ``repo``, reusing ``cached`` hashes of files whose size and mtime are unchanged
    (with ``deep``, none); ``meter`` is told the bytes as they are hashed."""
    old = {} if deep else {e["path"]: e for e in (cached or {}).get("entries", [])}
    entries = []
    for rel, path in _walk(repo):
        if os.path.islink(path):
            entries.append({"path": rel, "link": os.readlink(path)})
            continue
        st = os.stat(path)
        prev = old.get(rel)
        sha = prev["sha256"] if _unchanged(prev, st) else _sha256(path, meter)
        entries.append({"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha})
    body = json.dumps(
        [{k: v for k, v in e.items() if k != "mtime_ns"} for e in entries], sort_keys=True
    ).encode()
    return {"entries": entries, "digest": hashlib.sha256(body).hexdigest()}


def _recorded(repo):
    """The manifest last written next to this copy, or ``None``."""
    try:
        with open(os.path.join(repo, MANIFEST)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def quick(repo, recorded):
    """What a read of the manifest says without hashing: ``(stale, files, bytes, to_hash)``, stale
    when any file or link differs from ``recorded`` by path, size, mtime or target; ``to_hash`` the
    bytes of the files a write would hash."""
    entries = {e["path"]: e for e in (recorded or {}).get("entries", [])}
    seen, files, size, to_hash, stale = 0, 0, 0, 0, recorded is None
    for rel, path in _walk(repo):
        seen += 1
        prev = entries.get(rel)
        if os.path.islink(path):
            stale = stale or not prev or prev.get("link") != os.readlink(path)
            continue
        st = os.stat(path)
        files, size = files + 1, size + st.st_size
        if not _unchanged(prev, st):
            stale, to_hash = True, to_hash + st.st_size
    return stale or seen != len(entries), files, size, to_hash


def manifest(repo, write=False, deep=False, cached=None, progress=None):
    """
    The manifest state of ``repo``. A read (neither ``write`` nor ``deep``) hashes nothing: a copy
    changed since its manifest was recorded is ``stale``, its ``digest`` ``None`` and ``to_hash``
    the bytes a write would hash. ``write`` hashes what changed (``deep``: every file) and records
    it when it differs; ``progress`` (seconds) prints a line that often while it hashes.
    """
    path = os.path.join(repo, MANIFEST)
    on_disk = _recorded(repo)
    if not os.path.isdir(repo):
        return {"exists": False, "stale": True}
    if not write and not deep:
        stale, files, size, to_hash = quick(repo, on_disk)
        return {
            "exists": True, "stale": stale, "written": False, "files": files, "bytes": size,
            "digest": None if stale else on_disk.get("digest"), "to_hash": to_hash,
        }
    cached = on_disk if cached is None else cached
    # What it will hash: every file's bytes with deep, else those whose size or mtime changed.
    meter = Meter(quick(repo, cached)[2 if deep else 3], progress) if progress is not None else None
    fresh = build(repo, cached, deep, meter)
    stale = on_disk is None or on_disk.get("entries") != fresh["entries"]
    if stale and write:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(fresh))  # the C encoder: json.dump encodes in Python
        os.replace(tmp, path)
    files = [e for e in fresh["entries"] if "size" in e]
    return {
        "exists": True,
        "stale": stale and not write,
        "written": stale and write,
        "files": len(files),
        "bytes": sum(e["size"] for e in files),
        "digest": fresh["digest"],
        "hashed": meter.done if meter else None,
    }


def compare(repo, wanted, deep=False):
    """How ``repo`` differs from the manifest ``wanted``: what to send, what to drop first. A file
    of the wanted size differs when its sha256 does: hashed now with ``deep``, else as this copy's
    manifest recorded it while its size and mtime hold (a deep ``manifest --write`` just before)."""
    own = {} if deep else {e["path"]: e for e in (_recorded(repo) or {}).get("entries", [])}
    missing, shorter, differ, links = [], [], [], []
    need = 0
    for e in wanted["entries"]:
        path = os.path.join(repo, e["path"])
        if "link" in e:
            if not os.path.islink(path) or os.readlink(path) != e["link"]:
                links.append(e["path"])
            continue
        if not os.path.isfile(path) or os.path.islink(path):
            missing.append(e["path"])
            need += e["size"]
            continue
        size = os.path.getsize(path)
        if size < e["size"]:
            shorter.append(e["path"])  # an interrupted transfer: resumed, not resent
            need += e["size"] - size
        elif size > e["size"] or _sha256_of(path, own.get(e["path"]), deep) not in (None, e["sha256"]):
            differ.append(e["path"])
            need += e["size"]
    wanted_paths = {e["path"] for e in wanted["entries"]}
    extra = [rel for rel, _ in _walk(repo) if rel not in wanted_paths] if os.path.isdir(repo) else []
    return {
        "missing": missing, "shorter": shorter, "differ": differ, "links": links, "extra": extra,
        "bytes_needed": need, "in_sync": not (missing or shorter or differ or links or extra),
    }


def _sha256_of(path, recorded, deep):
    """A file's sha256: hashed with ``deep``, else ``recorded``'s while it holds, else ``None`` (unknown)."""
    if deep:
        return _sha256(path)
    return recorded["sha256"] if recorded and "sha256" in recorded and _unchanged(recorded, os.stat(path)) else None


def plan(repo, wanted, out_dir, streams, deep=False):
    """Drop files that cannot be resumed and files the head does not have; spread what to pull
    over ``streams`` lists (by bytes)."""
    diff = compare(repo, wanted, deep)
    name = os.path.basename(repo.rstrip("/"))
    # The worker's repo folder mirrors the head's: files the head does not have go too.
    for rel in diff["differ"] + diff["links"] + diff["extra"]:
        path = os.path.join(repo, rel)
        if os.path.lexists(path):
            os.remove(path)
    sizes = {e["path"]: e.get("size", 0) for e in wanted["entries"]}
    todo = sorted(diff["missing"] + diff["shorter"] + diff["differ"] + diff["links"], key=lambda p: (-sizes[p], p))
    buckets = [[0, []] for _ in range(max(1, streams))]
    for rel in todo:
        bucket = min(buckets, key=lambda b: b[0])
        bucket[0] += sizes[rel]
        bucket[1].append(f"{name}/{rel}")
    written = 0
    for i, (_, paths) in enumerate(b for b in buckets if b[1]):
        with open(os.path.join(out_dir, f"list.{i}"), "w") as f:
            f.write("\n".join(paths) + "\n")
        written += 1
    return {"lists": written, "bytes_needed": diff["bytes_needed"]}


def adopt(repo, wanted, pulled):
    """
    Record this copy's manifest after a transfer: rsync checked every file it wrote against the
    sender's, so a pulled file whose size matches the head's entry takes the head's sha256 (with
    its own mtime) instead of being read again. Every other file keeps its own cached hash (or is
    hashed here if its size or mtime changed).

    + pulled: the paths (relative to the repo folder) the transfer wrote
    """
    own = {e["path"]: e for e in (_recorded(repo) or {}).get("entries", [])}
    theirs = {e["path"]: e for e in wanted["entries"] if "size" in e}
    for rel in pulled:
        path = os.path.join(repo, rel)
        if rel in theirs and os.path.isfile(path) and not os.path.islink(path):
            st = os.stat(path)
            if st.st_size == theirs[rel]["size"]:
                own[rel] = {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                            "sha256": theirs[rel]["sha256"]}
    return manifest(repo, write=True, cached={"entries": list(own.values())})


def plan_lists(work_dir):
    """The ``list.N`` files a plan wrote in ``work_dir`` (one per stream), in order."""
    return [os.path.join(work_dir, entry) for entry in sorted(os.listdir(work_dir))
            if entry.startswith("list.") and entry[5:].isdigit()]


def pulled_paths(work_dir, name):
    """The repo-relative paths listed in a plan's ``list.N`` files."""
    paths = []
    for listed in plan_lists(work_dir):
        with open(listed) as f:
            paths += [line.strip()[len(name) + 1:] for line in f if line.strip().startswith(name + "/")]
    return paths


def main(argv):
    deep = "--deep" in argv
    if argv[0] == "manifest" and "--progress" in argv:
        began = time.monotonic()
        every = float(os.environ.get("PROGRESS_EVERY") or 5)
        state = manifest(argv[1], write="--write" in argv, deep=deep, progress=every)
        if not state["exists"]:
            print(f"{socket.gethostname()}: no snapshot at {argv[1]}", file=sys.stderr)
            return 1
        print(f"{socket.gethostname()}: manifest of {os.path.basename(argv[1].rstrip('/'))}: {state['files']} files, "
              f"{state['bytes'] >> 20} MiB, {state['hashed'] >> 20} MiB hashed in {time.monotonic() - began:.0f} s"
              f"{'' if state['written'] else ', unchanged'}", flush=True)
    elif argv[0] == "manifest":
        print(json.dumps(manifest(argv[1], write="--write" in argv, deep=deep)))
    elif argv[0] == "show":
        print(json.dumps(build(argv[1], _recorded(argv[1]), deep) if os.path.isdir(argv[1]) else {"entries": []}))
    elif argv[0] == "compare":
        with open(argv[2]) as f:
            print(json.dumps(compare(argv[1], json.load(f), deep=deep)))
    elif argv[0] == "adopt":
        with open(argv[2]) as f:
            wanted = json.load(f)
        name = os.path.basename(argv[1].rstrip("/"))
        print(json.dumps(adopt(argv[1], wanted, pulled_paths(argv[3], name))))
    elif argv[0] == "plan":
        with open(argv[2]) as f:
            print(json.dumps(plan(argv[1], json.load(f), argv[3], int(argv[4]), deep=deep)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
