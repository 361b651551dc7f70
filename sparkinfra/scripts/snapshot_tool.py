"""
Runs ON a node (python3, stdlib only; shipped inline by sparkinfra.stage): the manifest of a model
snapshot in HF-cache layout, and how a node's copy differs from it.

    python3 - manifest REPO_DIR [--write] [--deep]  -> {"stale": bool, "files": n, "bytes": n, "digest": ...}
    python3 - show REPO_DIR [--deep]                -> the manifest of this copy, every entry
    python3 - compare REPO_DIR MANIFEST_FILE [--deep] -> {"missing": [...], "differ": [...], ...}
    python3 - adopt REPO_DIR MANIFEST_FILE WORK_DIR -> writes this copy's manifest, trusting what the plan's lists pulled
    python3 - plan REPO_DIR MANIFEST_FILE OUT_DIR STREAMS [--deep]
        -> drops what cannot be resumed, writes OUT_DIR/list.N (paths relative to the cache folder)

A worker's pull (stage_pull.py) runs plan, plan_lists and adopt from this file.

A node's manifest digest says everything about its copy: equal digests, equal snapshots (with
``--deep`` every sha256 is computed afresh instead of trusted from the size/mtime cache).

The manifest (``.sparkinfra-manifest.json`` in the repo folder) lists every regular file (relative
path, size, mtime_ns, sha256) and every symlink (target) of the repo folder; sha256 is computed
once and reused while a file's size and mtime stay the same.
"""

import hashlib
import json
import os
import sys

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


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build(repo, cached=None, deep=False):
    """The manifest of ``repo``, reusing ``cached`` hashes of files whose size and mtime are unchanged."""
    old = {} if deep else {e["path"]: e for e in (cached or {}).get("entries", [])}
    entries = []
    for rel, path in _walk(repo):
        if os.path.islink(path):
            entries.append({"path": rel, "link": os.readlink(path)})
            continue
        st = os.stat(path)
        prev = old.get(rel)
        if prev and prev.get("size") == st.st_size and prev.get("mtime_ns") == st.st_mtime_ns:
            sha = prev["sha256"]
        else:
            sha = _sha256(path)
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


def manifest(repo, write=False, deep=False, cached=None):
    path = os.path.join(repo, MANIFEST)
    on_disk = _recorded(repo)
    if not os.path.isdir(repo):
        return {"exists": False, "stale": True}
    fresh = build(repo, on_disk if cached is None else cached, deep)
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
    }


def compare(repo, wanted, deep=False):
    """How ``repo`` differs from the manifest ``wanted``: what to send, what to drop first."""
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
        elif size > e["size"] or (deep and _sha256(path) != e["sha256"]):
            differ.append(e["path"])
            need += e["size"]
    wanted_paths = {e["path"] for e in wanted["entries"]}
    extra = [rel for rel, _ in _walk(repo) if rel not in wanted_paths] if os.path.isdir(repo) else []
    return {
        "missing": missing, "shorter": shorter, "differ": differ, "links": links, "extra": extra,
        "bytes_needed": need, "in_sync": not (missing or shorter or differ or links or extra),
    }


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
    if argv[0] == "manifest":
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
