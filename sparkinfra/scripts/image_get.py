"""
Runs ON the head (python3, stdlib only; sent with the command by ``operations.stage.image_present``):
put an image there the way the settings say, telling its progress every PROGRESS_EVERY seconds
(env, default 5) in the download's and the pull's form, then one line of what it did:

    python3 -c <this> load REF TARBALL      # docker load < TARBALL
        load REF: 9120 of 29184 MiB, 610 MiB/s, ETA 32 s
        load REF: 29184 MiB in 48 s
    python3 -c <this> pull REF              # Docker's API (the daemon's socket), REF pinned by digest
        pull REF: 6400 of 29184 MiB, 112 MiB/s, ETA 203 s (3 of 11 layers)
        pull REF: 29184 MiB in 260 s (11 layers)
    python3 -c <this> build REF COMMAND     # the site's image_build, a shell command
        build REF: 125 s, <its last line of output>
        build REF: built in 930 s

A load counts the tarball's bytes as docker reads them; a pull sums the layers' bytes as the daemon
reports them (``progressDetail``; a layer's size is known once its download starts). Exit 1 with
docker's own message (stderr) when docker refuses; for a build, the command's last 40 lines.
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

MIB = 1 << 20


def every() -> float:
    return float(os.environ.get("PROGRESS_EVERY") or 5)


class Ticker:
    """Calls ``tell()`` every ``period`` seconds from its own thread until stopped."""

    def __init__(self, period, tell):
        self.period, self.tell, self.done = period, tell, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.done.wait(self.period):
            self.tell()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()  # no progress line after the last one


def rate_line(done, total, began):
    """``X of Y MiB, R MiB/s, ETA S s`` (``X MiB, R MiB/s`` while the total is unknown)."""
    rate = int(done / max(time.monotonic() - began, 1e-3))
    if not total:
        return f"{done // MIB} MiB, {rate // MIB} MiB/s"
    eta = max(total - done, 0) // rate if rate > 0 else 0
    return f"{done // MIB} of {total // MIB} MiB, {rate // MIB} MiB/s, ETA {eta} s"


def load(ref, tarball):
    """``docker load`` fed from ``tarball``, its bytes counted as docker reads them."""
    total, sent, began = os.path.getsize(tarball), [0], time.monotonic()
    proc = subprocess.Popen(["docker", "load"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    out = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    with Ticker(every(), lambda: print(f"load {ref}: {rate_line(sent[0], total, began)}", flush=True)):
        try:
            with open(tarball, "rb") as f:
                for chunk in iter(lambda: f.read(4 * MIB), b""):
                    proc.stdin.write(chunk)
                    sent[0] += len(chunk)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # docker stopped reading: its message says why
        code = proc.wait()
    reader.join()
    if code != 0:
        sys.stderr.write(b"".join(out).decode(errors="replace"))
        print(f"load {ref}: docker load of {tarball} failed (exit {code})", file=sys.stderr)
        return 1
    print(f"load {ref}: {total // MIB} MiB in {time.monotonic() - began:.0f} s", flush=True)
    return 0


class DockerSocket(http.client.HTTPConnection):
    """HTTP to the Docker daemon's unix socket (``DOCKER_HOST=unix://...`` or the default)."""

    def __init__(self, path):
        super().__init__("docker")
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def socket_path():
    host = os.environ.get("DOCKER_HOST", "")
    return host[len("unix://"):] if host.startswith("unix://") else "/var/run/docker.sock"


class Layers:
    """A pull's layers as the daemon reports them: each one's bytes downloaded and its size."""

    def __init__(self):
        self.size, self.got, self.complete = {}, {}, set()

    def update(self, message):
        layer, status = message.get("id"), message.get("status", "")
        detail = message.get("progressDetail") or {}
        if not layer or status.startswith(("Pulling from", "Digest", "Status")):
            return
        self.size.setdefault(layer, 0)
        if status == "Downloading" and detail.get("total"):
            self.size[layer] = detail["total"]
            self.got[layer] = detail.get("current", 0)
        elif status in ("Download complete", "Pull complete", "Already exists"):
            self.got[layer] = self.size[layer]
            self.complete.add(layer)

    def line(self, began):
        return (f"{rate_line(sum(self.got.values()), sum(self.size.values()), began)} "
                f"({len(self.complete)} of {len(self.size)} layers)")


def pull(ref, connection=None):
    """A pull through Docker's API, its layers' bytes summed as the daemon streams them."""
    name, _, digest = ref.partition("@")
    if not digest:
        print(f"pull {ref}: not pinned by digest (name@sha256:...): a tag can name another image tomorrow",
              file=sys.stderr)
        return 1
    query = urllib.parse.urlencode({"fromImage": name, "tag": digest})
    conn = connection or DockerSocket(socket_path())
    began, layers = time.monotonic(), Layers()
    try:
        conn.request("POST", f"/images/create?{query}")
        response = conn.getresponse()
        if response.status != 200:
            body = response.read().decode(errors="replace")
            message = json.loads(body).get("message", body) if body.startswith("{") else body
            print(f"pull {ref}: docker refused: {message.strip()}", file=sys.stderr)
            return 1
        with Ticker(every(), lambda: print(f"pull {ref}: {layers.line(began)}", flush=True)):
            for raw in response:
                if not raw.strip():
                    continue
                message = json.loads(raw)
                if message.get("error"):
                    print(f"pull {ref}: {message['error']}", file=sys.stderr)
                    return 1
                layers.update(message)
    except OSError as exc:
        print(f"pull {ref}: the Docker daemon does not answer at {socket_path()}: {exc}", file=sys.stderr)
        return 1
    finally:
        conn.close()
    total = sum(layers.size.values())
    print(f"pull {ref}: {total // MIB} MiB in {time.monotonic() - began:.0f} s ({len(layers.size)} layers)", flush=True)
    return 0


def build(ref, command):
    """The site's build command, its last line of output told every period."""
    began, lines = time.monotonic(), []
    proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")

    def tell():
        last = next((line for line in reversed(lines) if line.strip()), "")
        print(f"build {ref}: {time.monotonic() - began:.0f} s{', ' + last.strip()[:120] if last else ''}", flush=True)

    with Ticker(every(), tell):
        for line in proc.stdout:
            lines.append(line)
            del lines[:-40]
        code = proc.wait()
    if code != 0:
        sys.stderr.write("".join(lines))
        print(f"build {ref}: the site's image_build failed (exit {code})", file=sys.stderr)
        return 1
    print(f"build {ref}: built in {time.monotonic() - began:.0f} s", flush=True)
    return 0


def main(argv):
    verb, ref, *rest = argv
    if verb == "load":
        return load(ref, rest[0])
    if verb == "pull":
        return pull(ref)
    if verb == "build":
        return build(ref, rest[0])
    print(f"image_get: no verb {verb!r} (load, pull, build)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
