"""
Run as root on a worker whose copy differs from the head's (pyinfra runs it on its connection to
the worker, after the head started its rsync daemon): wait for the daemon, take the head's
manifest from it, drop what cannot be resumed, pull what is missing or short in parallel streams
(resumed with ``--append-verify``), then record this copy's own manifest. Prints its progress
every PROGRESS_EVERY seconds (default 5), then what it pulled:

    spark-2: 91 of 192 MiB, 18 MiB/s, ETA 5 s
    spark-2: 192 MiB in 10 s, 19 MiB/s

    python3 stage_pull.py REPO SOURCE STREAMS DEEP TOOL

    REPO      the repository's folder in the HF cache (models--org--name)
    SOURCE    the head's daemon, rsync://<head fabric ip>:<port>/stage/ (or a local folder)
    STREAMS   parallel rsync streams
    DEEP      1: hash every file, not only those whose size or mtime changed; 0: do not
    TOOL      the snapshot tool (snapshot_tool.py), base64: its manifest, plan and record

One process from the plan to the record, started on a connection that is already open: the
step's fixed cost is what a transfer with nothing to move takes, paid by every pull. Each
connection to the daemon sets TCP_NODELAY (as the daemon does): rsync's handshake is a few small
messages each way, and with Nagle's algorithm against delayed ACKs each stream's start costs
~0.1 s instead of ~0.03 s.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types


WAIT_SECONDS = 10


def wait_for(address: str, seconds: float = WAIT_SECONDS) -> None:
    """Wait until ``HOST:PORT`` accepts a TCP connection (the head's daemon, started as the
    worker's session was); an error naming it after ``seconds``."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise SystemExit(f"the head's rsync daemon at {address} did not answer in {seconds} s: {error}")
            time.sleep(0.02)


def rsync(source: str, *args: str) -> list[str]:
    """An rsync command line reading from ``source``: TCP_NODELAY on a connection to a daemon."""
    return ["rsync", *(["--sockopts=TCP_NODELAY"] if source.startswith("rsync://") else []), *args]


def heads_manifest(source: str, name: str, manifest: str, work: str) -> tuple[dict, subprocess.Popen]:
    """The head's manifest of the repository ``name``, taken from ``source`` (what the pulls read),
    and the rsync that took it, to reap later. rsync puts the file in place (a rename) only once its
    checksum matched the sender's, then waits for its receiver process by polling every 20 ms: the
    manifest is read as soon as it is in place, not at rsync's exit."""
    path = os.path.join(work, manifest)
    fetch = subprocess.Popen(rsync(source, f"{source}{name}/{manifest}", path), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not os.path.exists(path) and fetch.poll() is None:
        time.sleep(0.001)
    if not os.path.exists(path):
        raise SystemExit(f"the head's manifest of {name} could not be read from {source}: {fetch.stderr.read().strip()}")
    with open(path) as f:
        return json.load(f), fetch


def apparent_size(folder: str) -> int:
    """The bytes of every file and link under ``folder`` (``du -sb``'s count, without folders)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def progress(repo: str, need: int, start: int, began: float, done: threading.Event) -> None:
    every = float(os.environ.get("PROGRESS_EVERY", "5"))
    host = socket.gethostname()
    while not done.wait(every):
        moved = apparent_size(repo) - start
        seconds = max(int(time.monotonic() - began), 1)
        rate = moved // seconds
        eta = max(need - moved, 0) // rate if rate > 0 else 0
        print(f"{host}: {moved >> 20} of {need >> 20} MiB, {rate >> 20} MiB/s, ETA {eta} s", flush=True)


def main(argv: list[str]) -> int:
    repo, source, streams, deep, tool_text = argv
    repo = repo.rstrip("/")
    tool = types.ModuleType("snapshot_tool")
    exec(compile(base64.b64decode(tool_text), "snapshot_tool.py", "exec"), tool.__dict__)
    os.makedirs(repo, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        if source.startswith("rsync://"):
            wait_for(source[len("rsync://"):].split("/", 1)[0])
        wanted, fetch = heads_manifest(source, os.path.basename(repo), tool.MANIFEST, work)
        need = tool.plan(repo, wanted, work, int(streams), deep=deep == "1")["bytes_needed"]
        start, began = apparent_size(repo), time.monotonic()
        done = threading.Event()
        reporter = threading.Thread(target=progress, args=(repo, need, start, began, done), daemon=True)
        reporter.start()
        pulls = []
        for listed in tool.plan_lists(work):
            log = open(listed + ".log", "w+b")
            command = rsync(source, "-a", "--partial", "--inplace", "--append-verify", f"--files-from={listed}", source, ".")
            pulls.append((subprocess.Popen(command, cwd=os.path.dirname(repo), stdin=subprocess.DEVNULL,
                                           stdout=log, stderr=subprocess.STDOUT), log))
        failed = [log for proc, log in pulls if proc.wait() != 0]
        done.set()
        reporter.join()  # no progress line after the last one
        for log in failed:
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace"))
        if failed:
            return 1
        moved, seconds = apparent_size(repo) - start, max(int(time.monotonic() - began), 0)
        tool.adopt(repo, wanted, tool.pulled_paths(work, os.path.basename(repo)))
        fetch.wait()  # long done: reaped, not read (a file rsync put in place matched its checksum)
    rate = moved // max(seconds, 1)
    print(f"{socket.gethostname()}: {moved >> 20} MiB in {seconds} s, {rate >> 20} MiB/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
