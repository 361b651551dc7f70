"""
Runs ON the head, inside the lane image (python3 and huggingface_hub; shipped inline by
sparkinfra.operations.stage): download one model snapshot into an HF hub cache.

    python3 -c <this file> REPO REVISION CACHE_DIR [TOKEN_ENV]

The token is read from /run/hf_token (a 0600 file mounted read-only) when it is there; it is never
printed. TOKEN_ENV, the controller's variable it came from, is named when the Hub refuses (401 or
403: a gated or private repository) with the token or without one. The revision's size comes first
from the hub (``model_info(files_metadata=True)``, else ``list_repo_tree``; unknown if both fail).
huggingface_hub's own progress bars are off (tqdm's ``\\r`` bars are one endless line once
captured): instead, every PROGRESS_EVERY seconds (env, default 5) one line from the bytes under
the repository's ``blobs`` folder (``*.incomplete`` too)::

    download owner/name@0123456789ab: 91 of 192 MiB, 18 MiB/s, ETA 5 s

(``download owner/name@0123456789ab: 91 MiB, 18 MiB/s`` when the size is unknown: what this run
fetched), and once it is done ``download owner/name: 192 MiB in 10 s`` (what this run fetched).
A failure is one line on stderr, and exit status 1.
"""

import os
import sys
import threading
import time

TOKEN_FILE = "/run/hf_token"
MIB = 1 << 20


def revision_blobs(hh, repo, revision, token):
    """``{blob name in the cache: size}`` of every file of the revision, or None when the hub does
    not say. A blob is named by its ETag: an LFS file's sha256, another file's git blob id."""
    def blobs(files):
        found = {}
        for f in files:
            size = getattr(f, "size", None)
            lfs = getattr(f, "lfs", None)  # a dataclass, or a dict in older clients
            name = (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)) or getattr(
                f, "blob_id", None)
            if size is None or not name:
                if getattr(f, "tree_id", None) is not None:  # a folder of list_repo_tree
                    continue
                return None
            found[name] = max(found.get(name, 0), size)
        return found

    api = hh.HfApi()
    try:
        found = blobs(api.model_info(repo, revision=revision, files_metadata=True, token=token).siblings or [])
        if found is not None:
            return found
    except Exception:  # noqa: BLE001 -- an older hub or mirror: try the listing
        pass
    try:
        return blobs(api.list_repo_tree(repo, revision=revision, recursive=True, token=token))
    except Exception:  # noqa: BLE001 -- the download itself says what is wrong
        return None


def have(blob_dir, sizes):
    """The bytes of the revision in ``blob_dir``: each blob (or its largest ``.incomplete``), at most
    its size; every file there when ``sizes`` is None."""
    got = {}
    try:
        names = os.listdir(blob_dir)
    except OSError:
        return 0
    for name in names:
        key = name.split(".", 1)[0] if sizes is not None else name
        if sizes is not None and key not in sizes:
            continue
        try:
            size = os.stat(os.path.join(blob_dir, name)).st_size
        except OSError:  # renamed or removed since the listing
            continue
        got[key] = max(got.get(key, 0), size)
    if sizes is None:
        return sum(got.values())
    return sum(min(size, sizes[key]) for key, size in got.items())


def progress_line(label, done, total, rate):
    """``label: 91 of 192 MiB, 18 MiB/s, ETA 5 s`` (no total: ``label: 91 MiB, 18 MiB/s``; no ETA at 0 B/s)."""
    line = f"{label}: {done // MIB} of {total // MIB} MiB" if total is not None else f"{label}: {done // MIB} MiB"
    line += f", {int(rate) // MIB} MiB/s"
    if total is not None and rate > 0:
        line += f", ETA {int(max(total - done, 0) / rate)} s"
    return line


class Progress:
    """One line every ``every`` seconds while the download runs, from the bytes in ``blob_dir``."""

    def __init__(self, label, blob_dir, sizes, every):
        self.label, self.blob_dir, self.sizes, self.every = label, blob_dir, sizes, every
        self.total = sum(sizes.values()) if sizes is not None else None
        self.start, self.first = time.monotonic(), have(blob_dir, sizes)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.wait(self.every):
            done = have(self.blob_dir, self.sizes)
            rate = (done - self.first) / max(time.monotonic() - self.start, 1e-3)
            if self.total is None:  # what this run fetched: the folder may hold other revisions' blobs
                done -= self.first
            print(progress_line(self.label, max(done, 0), self.total, rate), flush=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def fetched(self):
        """(bytes fetched by this run, seconds)."""
        return max(have(self.blob_dir, self.sizes) - self.first, 0), time.monotonic() - self.start


def refused(exc, token, token_env):
    """What to add to a failure the Hub answered 401 or 403: which token went, from where."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status not in (401, 403) or not token_env:
        return ""
    if token:
        return (f" (sent the token from the controller's {token_env}: the Hub refuses it, or the model is gated "
                "and that account has not accepted its terms)")
    return f" (sent no token: the controller's {token_env} is unset or empty; export it and converge again)"


def main(argv):
    repo, revision, cache_dir, *rest = argv
    token_env = rest[0] if rest else ""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # before huggingface_hub reads it
    token = None
    if os.path.exists(TOKEN_FILE):
        with open(TOKEN_FILE) as f:
            token = f.read().strip() or None
    import huggingface_hub as hh

    every = float(os.environ.get("PROGRESS_EVERY") or 5)
    sizes = revision_blobs(hh, repo, revision, token)
    blob_dir = os.path.join(cache_dir, "models--" + repo.replace("/", "--"), "blobs")
    with Progress(f"download {repo}@{revision[:12]}", blob_dir, sizes, every) as progress:
        try:
            hh.snapshot_download(repo, revision=revision, cache_dir=cache_dir, token=token)
        except Exception as exc:  # noqa: BLE001 -- one line, never a header's value
            print(f"download {repo}@{revision[:12]} failed: {type(exc).__name__}: {exc}{refused(exc, token, token_env)}",
                  file=sys.stderr, flush=True)
            return 1
    fetched, seconds = progress.fetched()
    print(f"download {repo}: {fetched // MIB} MiB in {int(seconds)} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
