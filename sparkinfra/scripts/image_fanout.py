"""
Run as root on the head: send IMAGE to every worker through the SSH mesh, each worker receiving
only the layers it lacks, all at once from one ``docker save``; then each worker's image ID,
checked against the head's.

    python3 image_fanout.py IMAGE HEAD_ID RECEIVE NAME=IP...

    RECEIVE  the command each worker runs (``image_receive.sh`` through sudo, see transfer.py): it
             says the layers of every image it has, loads what the head sends, says IMAGE's ID

Over 400 lines: it runs as one ``python3 -c`` text with the head's own python3 (stdlib only), so
the saved format's reading (tar headers, docker's v1 IDs) lives here with the fan-out it serves.

Docker loads a saved image layer by layer and opens a layer's file only when it lacks that layer
(its chain ID: the layer and every one below it), so a stream without the files of the layers a
worker has loads the same image there. The stream is ``docker save``'s tar, filtered per worker:

- a layer file named by its digest (``blobs/sha256/<diff ID>``, Docker 25 on) is that layer;
- a legacy layer folder (``<v1 id>/layer.tar``, Docker before 25) is told by its ``<v1 id>/json``,
  which the tar holds before it: the v1 ID is a digest of that JSON with the layer's chain ID and
  parent, computed here for each of the image's layers until one matches;
- everything else (configs, manifests, a layer not told apart) goes to every worker: a daemon that
  keeps layers compressed (containerd's image store) names them by their compressed digest, so its
  images still move whole.

A worker whose load fails after a stream that left layers out gets the whole image (a second
``docker save``), said on stderr; the ID each worker reports stays the check. Prints every
PROGRESS_EVERY seconds (default 5) what it has read of the image and sent to each worker, then a
line per worker:

    image NAME: 120 of about 324 MiB read, 40 MiB/s, ETA 5 s; sent spark-2 12 MiB, spark-3 120 MiB
    image NAME to spark-2: 12 MiB in 3 s, 4 MiB/s; 1 of 2 layers (it has the other 1, 175 MiB)
    image NAME to spark-3: 324 MiB in 8 s, 40 MiB/s; all 2 layers

(sizes under one MiB in KiB).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

BLOCK = 512
CHUNK = 1 << 20
SMALL = 1 << 20  # a file this size or less is read whole before it is sent (a layer's json, a config)
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "Compression=no"]


class Worker:
    """One worker's SSH session: what it has, what it was sent."""

    def __init__(self, name: str, ip: str, receive: str):
        self.name, self.ip = name, ip
        self.errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(SSH + [ip, receive], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errors)
        self.fd = self.proc.stdin.fileno()
        self.chains: set[str] = set()
        self.alive = True
        self.sent = 0
        self.layers_sent: set[int] = set()
        self.layers_kept: dict[int, int] = {}  # position -> bytes the worker has (not sent)
        self.status, self.got, self.seconds = 0, "", 0.0

    def inventory(self) -> None:
        """Reads the worker's layers: a JSON list of diff IDs per image, then ``ready``."""
        for line in self.proc.stdout:
            line = line.strip()
            if line == b"ready":
                return
            try:
                self.chains.update(chain_ids(json.loads(line)))
            except (ValueError, TypeError):
                continue
        self.alive = False  # the session ended before it was ready

    def write(self, data) -> None:
        if not self.alive:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError:  # its load ended (failed): the others go on
            self.alive = False
            return
        self.sent += len(data)

    def finish(self) -> tuple[int, str]:
        """(exit status, the ID it reports) once the stream is sent."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        said = self.proc.stdout.read().split()
        return self.proc.wait(), said[-1].decode() if said else ""

    def said(self) -> str:
        """The last line the session wrote on stderr (docker's or ssh's reason), or its status."""
        self.errors.seek(0)
        lines = self.errors.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"exit {self.status}"


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The chain ID of each layer of an image (docker's: the layer and all below it)."""
    chains: list[str] = []
    for diff in diff_ids:
        chain = diff if not chains else "sha256:" + hashlib.sha256(f"{chains[-1]} {diff}".encode()).hexdigest()
        chains.append(chain)
    return chains


def members(raw: bytes) -> list[tuple[str, bytes]]:
    """The members of a JSON object, each value as its exact bytes."""
    out: list[tuple[str, bytes]] = []
    i, n = raw.index(b"{") + 1, len(raw)
    while i < n:
        while i < n and raw[i] in b" \t\r\n,":
            i += 1
        if i >= n or raw[i] == ord("}"):
            break
        end = _string_end(raw, i)
        key = json.loads(raw[i:end])
        i = raw.index(b":", end) + 1
        while raw[i] in b" \t\r\n":
            i += 1
        start, depth = i, 0
        while i < n:
            c = raw[i]
            if c == ord('"'):
                i = _string_end(raw, i)
                if depth == 0:
                    break
                continue
            if c in b"{[":
                depth += 1
            elif c in b"}]":
                if depth == 0:
                    break
                depth -= 1
                if depth == 0:
                    i += 1
                    break
            elif c == ord(",") and depth == 0:
                break
            i += 1
        out.append((key, raw[start:i].rstrip()))
    return out


def _string_end(raw: bytes, i: int) -> int:
    """The index after the JSON string that starts at ``raw[i]``."""
    i += 1
    while raw[i] != ord('"'):
        i += 2 if raw[i] == ord("\\") else 1
    return i + 1


def v1_position(raw: bytes, chains: list[str]) -> int | None:
    """
    Which of the image's layers a legacy layer folder holds, from its ``json``: docker's v1 ID is
    the sha256 of that JSON without ``id``, with the layer's chain ID (``layer_id``) and its
    parent's v1 ID, keys sorted (with or without ``os``: docker versions differ); None if no layer
    gives the folder's ID.
    """
    try:
        fields = dict(members(raw))
        v1id = json.loads(fields.pop("id"))
        parent = json.loads(fields.pop("parent", b'""'))
    except (ValueError, KeyError):
        return None
    if parent and not parent.startswith("sha256:"):
        parent = "sha256:" + parent
    variants = [fields] + ([{k: v for k, v in fields.items() if k != "os"}] if "os" in fields else [])
    for variant in variants:
        for position, chain in enumerate(chains):
            given = dict(variant, layer_id=json.dumps(chain).encode())
            if parent:
                given["parent"] = json.dumps(parent).encode()
            text = b"{" + b",".join(json.dumps(k).encode() + b":" + v for k, v in sorted(given.items())) + b"}"
            if hashlib.sha256(text).hexdigest() == v1id:
                return position
    return None


def octal(field: bytes) -> int:
    if field[0] & 0x80:  # base-256 (GNU), for sizes over 8 GiB
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    return int(digits or b"0", 8)


def pax(data: bytes) -> dict[str, str]:
    records, i = {}, 0
    while i < len(data):
        space = data.index(b" ", i)
        length = int(data[i:space])
        key, _, value = data[space + 1:i + length - 1].partition(b"=")
        records[key.decode()] = value.decode("utf-8", "surrogateescape")
        i += length
    return records


def padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def read_up_to(fd: int, size: int) -> bytes:
    """``size`` bytes from a pipe, fewer only at its end."""
    parts, left = [], size
    while left:
        part = os.read(fd, left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def read_exactly(fd: int, size: int) -> bytes:
    data = read_up_to(fd, size)
    if len(data) != size:
        raise EOFError("docker save ended inside an entry")
    return data


class Stream:
    """The image's tar, read once, each entry sent to the workers that need it."""

    def __init__(self, fd: int, image_layers: list[str], workers: list[Worker], partial: bool):
        self.fd, self.workers, self.partial = fd, workers, partial
        self.diffs, self.chains = image_layers, chain_ids(image_layers)
        self.read = 0
        self.legacy: dict[str, int] = {}  # legacy layer folder -> its position

    def positions(self, name: str) -> list[int]:
        """The image's layers an entry holds (none: not a layer file, or not told apart)."""
        folder, _, base = name.rpartition("/")
        if base == "layer.tar" and folder in self.legacy:
            return [self.legacy[folder]]
        if folder == "blobs/sha256":
            return [i for i, diff in enumerate(self.diffs) if diff == "sha256:" + base]
        return []

    def to(self, name: str, size: int) -> list[Worker]:
        """The workers that get an entry: all, but a layer file only those that lack its layer."""
        at = self.positions(name)
        chosen = []
        for worker in self.workers:
            if self.partial and at and all(self.chains[i] in worker.chains for i in at):
                for i in at:
                    worker.layers_kept[i] = size
            else:
                worker.layers_sent.update(at)
                chosen.append(worker)
        return chosen

    def run(self) -> None:
        extended = b""  # pax or GNU long-name headers, sent (or not) with the entry they describe
        long_name = None
        pax_fields: dict[str, str] = {}
        while True:
            header = read_up_to(self.fd, BLOCK)
            if not header:
                break
            self.read += len(header)
            if len(header) < BLOCK:
                raise EOFError("docker save ended inside a header")
            if header == bytes(BLOCK):  # the end: the rest (zero blocks) to everyone
                rest = header + b"".join(iter(lambda: os.read(self.fd, CHUNK), b""))
                for worker in self.workers:
                    worker.write(extended + rest)
                return
            kind = header[156:157]
            size = octal(header[124:136])
            name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if header[257:262] == b"ustar" and header[345] != 0:
                name = header[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape") + "/" + name
            if kind in (b"x", b"L", b"K"):  # pax, GNU long name, GNU long link name
                data = read_exactly(self.fd, padded(size))
                self.read += len(data)
                extended += header + data
                if kind == b"x":
                    pax_fields = pax(data[:size])
                elif kind == b"L":
                    long_name = data[:size].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                continue
            name = pax_fields.get("path", long_name or name)
            size = int(pax_fields.get("size", size))
            if kind == b"g":
                name = ""
            head, extended, long_name, pax_fields = extended + header, b"", None, {}
            body = 0 if kind in (b"1", b"2", b"3", b"4", b"5", b"6") else padded(size)  # links, devices, folders, fifos
            if body <= SMALL:
                data = read_exactly(self.fd, body)
                self.read += body
                if name.endswith("/json") and self.partial:
                    found = v1_position(data[:size], self.chains)
                    if found is not None:
                        self.legacy[name.rpartition("/")[0]] = found
                for worker in self.to(name, size):
                    worker.write(head + data)
                continue
            chosen = self.to(name, size)
            for worker in chosen:
                worker.write(head)
            self.body(body, [w for w in chosen if w.alive])

    def body(self, left: int, chosen: list[Worker]) -> None:
        """A large entry's data, to each chosen worker: spliced pipe to pipe when it goes to one
        (no copy through this process), copied once per worker otherwise."""
        if len(chosen) == 1 and hasattr(os, "splice"):
            worker, spliced = chosen[0], False
            try:
                while left:
                    moved = os.splice(self.fd, worker.fd, min(left, 4 * CHUNK))
                    if not moved:
                        raise EOFError("docker save ended inside a layer")
                    self.read += moved
                    worker.sent += moved
                    left -= moved
                    spliced = True
                return
            except OSError as error:
                if error.errno == errno.EPIPE or spliced:  # its load ended (failed): the rest for nobody
                    worker.alive = False
                    chosen = []  # else: no splice here (not a pipe): copied below
        buffer = bytearray(CHUNK)
        while left:
            got = os.readv(self.fd, [memoryview(buffer)[:min(CHUNK, left)]])
            if not got:
                raise EOFError("docker save ended inside a layer")
            self.read += got
            left -= got
            for worker in chosen:
                worker.write(memoryview(buffer)[:got])


def mib(n: int) -> int:
    return n >> 20


def size(n: float) -> str:
    """Bytes in MiB, or in KiB under one MiB (a changed top layer is often that small)."""
    return f"{int(n) >> 10} KiB" if n < 1 << 20 else f"{int(n) >> 20} MiB"


def progress(image: str, stream: Stream, total: int, workers: list[Worker], done: threading.Event) -> None:
    every = float(os.environ.get("PROGRESS_EVERY", "5"))
    start = time.monotonic()
    while not done.wait(every):
        seconds = max(time.monotonic() - start, 1e-3)
        rate = stream.read / seconds
        line = f"image {image}: {mib(stream.read)}"
        if total and stream.read < total:
            line += f" of about {mib(total)} MiB read, {mib(int(rate))} MiB/s"
            if rate >= 1:
                line += f", ETA {int((total - stream.read) / rate)} s"
        else:
            line += f" MiB read, {mib(int(rate))} MiB/s"
        sent = ", ".join(f"{w.name} {size(w.sent)}" for w in workers)
        print(f"{line}; sent {sent}", flush=True)


def inspected(image: str):
    """A function giving IMAGE's (diff IDs, size) from ``docker image inspect``, started now, read
    once when first asked."""
    proc = subprocess.Popen(["docker", "image", "inspect", image], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    found: list[tuple[list[str], int]] = []

    def layers_and_size() -> tuple[list[str], int]:
        if not found:
            out, _ = proc.communicate()
            try:
                info = json.loads(out)[0]
                found.append((list(info["RootFS"]["Layers"]), int(info.get("Size") or 0)))
            except (ValueError, IndexError, KeyError, TypeError):
                found.append(([], 0))
        return found[0]

    return layers_and_size


def send(image: str, receive: str, targets: list[tuple[str, str]], layers_and_size,
         partial: bool) -> tuple[list[Worker], int]:
    """One ``docker save`` of IMAGE streamed to each target's RECEIVE session; the workers, done, and
    the save's exit status. The save packs, the workers' sessions start and the head's inspect run
    all at once."""
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    workers = [Worker(name, ip, receive) for name, ip in targets]
    layers, total = layers_and_size()
    for worker in workers:
        worker.inventory()
    stream = Stream(save.stdout.fileno(), layers, workers, partial)
    done = threading.Event()
    reporter = threading.Thread(target=progress, args=(image, stream, total, workers, done), daemon=True)
    began = time.monotonic()
    reporter.start()
    try:
        stream.run()
    except (EOFError, ValueError, OSError) as error:
        print(f"image {image}: the saved stream is cut or unreadable ({error})", file=sys.stderr)
        for worker in workers:
            worker.alive = False
    finally:
        done.set()
        reporter.join()
    saved = save.wait()
    seconds = time.monotonic() - began
    for worker in workers:
        worker.status, worker.got = worker.finish()
        if saved != 0:
            worker.status = worker.status or 1
        worker.seconds = seconds
    return workers, saved


def summary(image: str, worker: Worker, count: int, cut: bool = False) -> str:
    s = max(int(round(worker.seconds)), 0)
    line = (f"image {image} to {worker.name}: {'cut after ' if cut else ''}{size(worker.sent)} in {s} s, "
            f"{size(worker.sent / max(worker.seconds, 1e-3))}/s; ")
    kept = {i: n for i, n in worker.layers_kept.items() if i not in worker.layers_sent}
    if kept:
        line += f"{count - len(kept)} of {count} layers (it has the other {len(kept)}, {size(sum(kept.values()))})"
    else:
        line += f"all {count} layers" if count != 1 else "its one layer"
    return line


def main(argv: list[str]) -> int:
    image, head_id, receive, *pairs = argv
    targets = [tuple(pair.split("=", 1)) for pair in pairs]
    layers_and_size = inspected(image)
    workers, saved = send(image, receive, targets, layers_and_size, True)
    if saved != 0:  # the head's own side: its docker stopped (a reboot, a restart), nothing to retry
        print(f"image {image}: the head's docker save failed (exit {saved}, its error above): the stream was cut "
              "on the head, not by a worker", file=sys.stderr)
    retry = [w for w in workers if (w.status != 0 or w.got != head_id) and w.layers_kept and saved == 0]
    for worker in retry:
        print(f"{worker.name}: its load of the layers it lacked failed ({worker.said()}); "
              f"sending all of {image}", file=sys.stderr)
    if retry:
        again, saved = send(image, receive, [(w.name, w.ip) for w in retry], layers_and_size, False)
        workers = [w for w in workers if w not in retry] + again
    workers.sort(key=lambda w: [name for name, _ in targets].index(w.name))
    rc = 0
    for worker in workers:
        print(summary(image, worker, len(layers_and_size()[0]), cut=saved != 0), flush=True)
    for worker in workers:
        if worker.got != head_id:
            reason = " (the head's save failed)" if saved != 0 else f" ({worker.said()})" if worker.status else ""
            print(f"{worker.name}: {image} is {worker.got or 'missing'}, the head has {head_id}{reason}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
