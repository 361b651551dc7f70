"""
``scripts/image_get.py`` run as the head runs it (``python3 -c <text> VERB ...``): a load against a
stand-in ``docker`` that reads slowly, a pull against a stand-in daemon on a unix socket streaming
the Docker API's pull messages (the form the daemon sends: ``status``, ``id``, ``progressDetail``),
and the site's build command; each tells its progress in the download's form, then its total.
"""

from __future__ import annotations

import json
import os
import re
import socketserver
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from sparkinfra import scripts
from sparkinfra.operations.stage import image_get_command, image_present

from test_operations import FakeHost, rendered
from test_stage_progress import run_on, shown_command

MIB = 1 << 20
REF = "nvcr.io/nvidia/vllm@sha256:" + "ab" * 32


def run(*argv, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", scripts.text("image_get.py"), *argv], capture_output=True, text=True,
                          env={**os.environ, "PROGRESS_EVERY": "0.2", **(env or {})}, timeout=60)


def fake_docker(tmp_path: Path, body: str) -> dict:
    """A ``docker`` first on PATH running ``body`` (sh)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "docker").write_text("#!/bin/sh\n" + body)
    (bindir / "docker").chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}


def test_a_load_tells_the_bytes_docker_has_read_then_its_total(tmp_path):
    tarball = tmp_path / "image.tar"
    tarball.write_bytes(os.urandom(24 * MIB))
    got = tmp_path / "got"
    # docker load reads 4 MiB every 0.1 s: 0.6 s in all, three progress periods
    env = fake_docker(tmp_path, f'while dd bs=4M count=1 iflag=fullblock status=none >> {got} && sleep 0.1; do\n'
                                f'  [ $(stat -c %s {got}) -ge {24 * MIB} ] && break\ndone\necho "Loaded image: x:1"\n')
    result = run("load", "x:1", str(tarball), env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert got.read_bytes() == tarball.read_bytes()
    assert re.fullmatch(r"load x:1: 24 MiB in \d+ s", lines[-1]), lines
    ticks = [re.fullmatch(r"load x:1: (\d+) of 24 MiB, \d+ MiB/s, ETA \d+ s", line) for line in lines[:-1]]
    assert ticks and all(ticks), lines
    assert [int(t[1]) for t in ticks] == sorted(int(t[1]) for t in ticks)


def test_a_load_docker_refuses_names_docker_and_the_tarball(tmp_path):
    tarball = tmp_path / "image.tar"
    tarball.write_bytes(b"not a tar")
    env = fake_docker(tmp_path, 'cat > /dev/null; echo "Error processing tar file(exit status 1): unexpected EOF"; exit 1\n')
    result = run("load", "x:1", str(tarball), env=env)
    assert result.returncode == 1
    assert "unexpected EOF" in result.stderr
    assert result.stderr.strip().endswith(f"load x:1: docker load of {tarball} failed (exit 1)")


# A pull as the daemon streams it (POST /images/create): two layers, one already there.
LAYER_A, LAYER_B, LAYER_C = "4abcf2066143", "9b0a4e0ba2f1", "c6a83fedfae6"
PULL = [
    {"status": "Pulling from nvidia/vllm", "id": "sha256:" + "ab" * 32},
    {"status": "Already exists", "progressDetail": {}, "id": LAYER_C},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": LAYER_A},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": LAYER_B},
    {"status": "Waiting", "progressDetail": {}, "id": LAYER_B},
    *({"status": "Downloading", "progressDetail": {"current": n * MIB, "total": 8 * MIB},
       "progress": f"[=>  ] {n}MB/8.389MB", "id": LAYER_A} for n in range(1, 9)),
    {"status": "Verifying Checksum", "progressDetail": {}, "id": LAYER_A},
    {"status": "Download complete", "progressDetail": {}, "id": LAYER_A},
    *({"status": "Downloading", "progressDetail": {"current": n * MIB, "total": 4 * MIB}, "id": LAYER_B}
      for n in range(1, 5)),
    {"status": "Download complete", "progressDetail": {}, "id": LAYER_B},
    {"status": "Extracting", "progressDetail": {"current": 4 * MIB, "total": 8 * MIB}, "id": LAYER_A},
    {"status": "Pull complete", "progressDetail": {}, "id": LAYER_A},
    {"status": "Pull complete", "progressDetail": {}, "id": LAYER_B},
    {"status": "Digest: sha256:" + "ab" * 32},
    {"status": f"Status: Downloaded newer image for {REF}"},
]


class Daemon(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def fake_daemon(tmp_path: Path, messages: list[dict], status: int = 200, pause: float = 0.05):
    """A stand-in Docker daemon on a unix socket: each POST answered with ``messages``, one JSON
    object per chunk, ``pause`` apart. Returns (socket path, requests seen)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def address_string(self):
            return "unix"

        def log_message(self, *args):
            pass

        def do_POST(self):
            seen.append(self.path)
            if status != 200:
                body = json.dumps({"message": "manifest for nvcr.io/nvidia/vllm not found: manifest unknown"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for message in messages:
                data = (json.dumps(message) + "\r\n").encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                time.sleep(pause)
            self.wfile.write(b"0\r\n\r\n")

    path = str(tmp_path / "docker.sock")
    server = Daemon(path, Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return path, seen, server


def test_a_pull_sums_the_layers_the_daemon_reports(tmp_path):
    path, seen, server = fake_daemon(tmp_path, PULL)
    try:
        result = run("pull", REF, env={"DOCKER_HOST": f"unix://{path}"})
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stderr
    assert seen == [f"/images/create?fromImage=nvcr.io%2Fnvidia%2Fvllm&tag=sha256%3A{'ab' * 32}"]
    lines = result.stdout.splitlines()
    assert re.fullmatch(rf"pull {re.escape(REF)}: 12 MiB in \d+ s \(3 layers\)", lines[-1]), lines
    # before any layer's size is known: bytes and rate only
    ticks = [re.fullmatch(rf"pull {re.escape(REF)}: (\d+)(?: of (\d+))? MiB, \d+ MiB/s(?:, ETA \d+ s)? "
                          r"\((\d) of ([1-3]) layers\)", line) for line in lines[:-1]]
    assert ticks and all(ticks), lines
    assert all(int(t[1]) <= int(t[2] or 0) <= 12 for t in ticks if t[2]), lines
    assert any(t[2] == "12" for t in ticks), lines


def test_a_pull_the_registry_refuses_says_dockers_words(tmp_path):
    error = [PULL[0], {"errorDetail": {"message": "unauthorized: authentication required"},
                       "error": "unauthorized: authentication required"}]
    path, _, server = fake_daemon(tmp_path, error)
    try:
        result = run("pull", REF, env={"DOCKER_HOST": f"unix://{path}"})
    finally:
        server.shutdown()
    (tmp_path / "404").mkdir()
    path, _, server = fake_daemon(tmp_path / "404", [], status=404)
    try:
        refused = run("pull", REF, env={"DOCKER_HOST": f"unix://{path}"})
    finally:
        server.shutdown()
    assert (result.returncode, result.stderr.strip()) == (1, f"pull {REF}: unauthorized: authentication required")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (f"pull {REF}: docker refused: manifest for nvcr.io/nvidia/vllm not found: "
                                      "manifest unknown")


def test_a_pull_without_a_daemon_or_a_digest_says_so(tmp_path):
    gone = run("pull", REF, env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert gone.returncode == 1
    assert gone.stderr.startswith(f"pull {REF}: the Docker daemon does not answer at {tmp_path}/none.sock"), gone.stderr
    tag = run("pull", "nvcr.io/nvidia/vllm:26.01-py3")
    assert tag.returncode == 1 and "not pinned by digest" in tag.stderr


def test_a_build_tells_its_time_and_last_line_then_its_total():
    result = run("build", "site/vllm:1", "for i in 1 2 3 4 5; do echo step $i; sleep 0.15; done")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"build site/vllm:1: built in \d+ s", lines[-1]), lines
    assert lines[:-1] and all(re.fullmatch(r"build site/vllm:1: \d+ s, step [1-5]", line) for line in lines[:-1]), lines


def test_a_failed_build_shows_its_last_lines():
    result = run("build", "site/vllm:1", "seq 1 100; echo 'no space left on device' >&2; exit 3")
    assert result.returncode == 1
    err = result.stderr.splitlines()
    assert err[-2] == "no space left on device" and err[-3] == "100" and "1" not in err[:-41]
    assert err[-1] == "build site/vllm:1: the site's image_build failed (exit 3)"


# The operation: a missing image is put there by the script, shown as it runs.


@pytest.mark.parametrize(("kwargs", "verb", "arg"), [
    ({"tarball": "/srv/vllm-node.tar"}, "load", "/srv/vllm-node.tar"),
    ({"build": "make -C /srv/vllm image"}, "build", "make -C /srv/vllm image"),
    ({}, "pull", None),
])
def test_a_missing_image_is_loaded_built_or_pulled_shown(kwargs, verb, arg):
    image = REF if verb == "pull" else "vllm-node:latest"
    head = FakeHost("spark-1", [{"fact": "DockerImageId", "args": {"image": image}, "value": None}], "execute")
    (command,) = run_on(head, image_present, image=image, **kwargs)[0]
    assert rendered(shown_command(command)) == rendered(image_get_command(verb, image, *([arg] if arg else [])))
