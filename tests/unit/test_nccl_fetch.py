"""
``node/nccl_fetch.py`` against a package index served here (``http.server`` on 127.0.0.1): a
PEP 503 page naming wheels built here with the layout of ``nvidia-nccl-cu13`` for aarch64 and
x86_64; the machine's wheel taken, the lowest glibc first; a version or a machine the index lacks
refused with what it has; a wheel of another sha256 refused; a second run done without the network.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
from nccl_builds import compile_build

from sparkinfra import node

SOURCE = node.DIR / "nccl_fetch.py"
sys.path.insert(0, str(SOURCE.parent))
nccl_fetch = importlib.import_module("nccl_fetch")  # the node scripts, as modules
ni = importlib.import_module("nccl_identity")

PROJECT = "nvidia-nccl-cu13"
WHEELS = {  # file -> the build it carries
    "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_aarch64.whl": "aarch64",
    "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_28_aarch64.whl": "aarch64-new-glibc",
    "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_x86_64.whl": "x86_64",
    "nvidia_nccl_cu13-2.29.7-py3-none-manylinux_2_18_aarch64.whl": "old",
}
WANTED = "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_aarch64.whl"


def wheel(path: Path, library: Path) -> Path:
    """A wheel laid out as nvidia-nccl-cu13's: the library at nvidia/nccl/lib/libnccl.so.2."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("nvidia/__init__.py", "")
        z.write(library, "nvidia/nccl/lib/libnccl.so.2")
        z.writestr("nvidia/nccl/include/nccl.h", "/* not NCCL */\n")
        z.writestr("nvidia_nccl_cu13-2.30.7.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    return path


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """``{"url", "bad", "libs", "stop"}``: ``url`` a good index, ``bad`` one whose page gives the
    wanted wheel another sha256; ``libs`` the library each wheel carries."""
    root = tmp_path_factory.mktemp("index")
    (root / "files").mkdir()
    libs, digests = {}, {}
    for name, flavor in WHEELS.items():
        libs[name] = compile_build(root / "builds" / flavor / "libnccl.so.2", flavor,
                                   22907 if flavor == "old" else 23007)
        digests[name] = hashlib.sha256(wheel(root / "files" / name, libs[name]).read_bytes()).hexdigest()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    base = f"http://127.0.0.1:{server.server_address[1]}"
    for top, wrong in (("simple", False), ("bad/simple", True)):
        page = root / top / PROJECT / "index.html"
        page.parent.mkdir(parents=True)
        anchors = []
        for i, name in enumerate(WHEELS):
            digest = "0" * 64 if wrong and name == WANTED else digests[name]
            href = f"{base}/files/{name}" if i % 2 else f"../../{'../' if wrong else ''}files/{name}"
            anchors.append(f'<a href="{href}#sha256={digest}" data-requires-python="&gt;=3">{name}</a><br/>')
        anchors.append('<a href="../../files/nvidia_nccl_cu13-2.30.7.tar.gz">nvidia_nccl_cu13-2.30.7.tar.gz</a>')
        page.write_text("<!DOCTYPE html><html><body>\n" + "\n".join(anchors) + "\n</body></html>\n")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    found = {"url": f"{base}/simple", "bad": f"{base}/bad/simple", "libs": libs, "digests": digests}
    found["stop"] = lambda: (server.shutdown(), server.server_close())
    yield found
    if thread.is_alive():
        found["stop"]()


def fetch(index_url: str, tmp: Path, *extra: str, version: str = "2.30.7", machine: str = "aarch64"):
    return subprocess.run([sys.executable, str(SOURCE), "--index", index_url, "--project", PROJECT,
                           "--version", version, "--machine", machine, "--dest", str(tmp / "opt/nccl/lib/libnccl.so.2"),
                           "--record", str(tmp / "etc/sparkinfra/nccl-pin.json"), *extra],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PROGRESS_EVERY": "0"}, check=False)


def test_a_version_the_index_lacks_is_refused_with_what_it_has(index, tmp_path):
    done = fetch(index["url"], tmp_path, version="2.30.9")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (f"nccl: no {PROJECT} 2.30.9 wheel for aarch64 at {index['url']}/{PROJECT}/; "
                                   "versions there: 2.29.7, 2.30.7")
    done = fetch(index["url"], tmp_path, machine="ppc64le")
    assert done.returncode == 2 and "(2.30.7 is there for manylinux_2_18_aarch64, manylinux_2_18_x86_64, " \
                                    "manylinux_2_28_aarch64)" in done.stderr
    assert not (tmp_path / "opt").exists()


def test_a_wheel_of_another_sha256_is_refused_and_nothing_left(index, tmp_path):
    done = fetch(index["bad"], tmp_path)
    assert done.returncode == 4 and f"nccl: {WANTED} from {index['bad']} has sha256 " in done.stderr, done.stderr
    assert "refused" in done.stderr and "Traceback" not in done.stderr
    assert list((tmp_path / "opt/nccl/lib").iterdir()) == [] and not (tmp_path / "etc").exists()


def test_a_network_error_is_one_line(index, tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = fetch(f"http://127.0.0.1:{port}/simple", tmp_path)
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"nccl: GET http://127.0.0.1:{port}/simple/{PROJECT}/ failed: ")
    assert len(done.stderr.strip().splitlines()) == 1
    done = fetch(index["url"].replace("simple", "nothing/here"), tmp_path)
    assert done.returncode == 3 and done.stderr.strip().endswith("failed: HTTP 404 File not found"), done.stderr


def test_the_machines_wheel_is_fetched_once(index, tmp_path):
    """Last in this file: it stops the index to show the second run asks nothing of it."""
    done = fetch(index["url"], tmp_path)
    assert done.returncode == 0, done.stderr
    dest, record_path = tmp_path / "opt/nccl/lib/libnccl.so.2", tmp_path / "etc/sparkinfra/nccl-pin.json"
    lib = index["libs"][WANTED]
    assert dest.read_bytes() == lib.read_bytes()  # aarch64, the lowest glibc: not 2_28's, not x86_64's
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644 and stat.S_IMODE(record_path.stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "opt/nccl").stat().st_mode) == 0o755
    record = json.loads(record_path.read_text())
    assert record == {"version": "2.30.7", "sha256": ni.sha256(str(lib)), "build_id": ni.build_id(str(lib)),
                      "source": {"index": index["url"], "project": PROJECT, "file": WANTED,
                                 "wheel_sha256": index["digests"][WANTED]}}
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"nccl: {WANTED}: 0 of 0 MiB (100%), ")
    assert lines[-1] == (f"nccl: fetched {WANTED} (0 MiB) from {index['url']}: libnccl.so.2 2.30.7 "
                         f"sha256 {record['sha256'][:12]} build-id {record['build_id'][:12]}")
    assert sorted(p.name for p in dest.parent.iterdir()) == ["libnccl.so.2"]  # no temp left
    index["stop"]()
    again = fetch(index["url"], tmp_path)
    assert again.returncode == 0 and again.stdout.startswith("nccl: already fetched"), again.stderr
    dest.write_bytes(b"another file")  # the dest no longer the record's: fetched again (the index is gone)
    assert fetch(index["url"], tmp_path).returncode == 3


def test_the_page_forms():
    """Relative and absolute hrefs with their fragment, a PEP 691 JSON page, compressed tags."""
    html = (b'<a href="../../f/nvidia_nccl_cu13-2.30.7-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl'
            b'#sha256=' + b"ab" * 32 + b'">x.whl</a><a href="https://h/y/linux.whl">nvidia_nccl_cu13-2.30.7-py3-none-linux_aarch64.whl</a>')
    files = nccl_fetch.page_files(html, "text/html", "https://i/simple/nvidia-nccl-cu13/")
    assert files[0][1:] == ("https://i/f/nvidia_nccl_cu13-2.30.7-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
                            "ab" * 32)
    assert files[1] == ("nvidia_nccl_cu13-2.30.7-py3-none-linux_aarch64.whl", "https://h/y/linux.whl", None)
    files = [(name.replace("x.whl", "nvidia_nccl_cu13-2.30.7-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl"),
              url, digest) for name, url, digest in files]
    assert nccl_fetch.choose(files, "Nvidia_NCCL.cu13", "2.30.7", "aarch64")[1].endswith("manylinux_2_17_aarch64.whl")
    assert nccl_fetch.choose(files[1:], PROJECT, "2.30.7", "aarch64")[0].endswith("linux_aarch64.whl")
    page = json.dumps({"meta": {"api-version": "1.0"}, "name": PROJECT, "files": [
        {"filename": WANTED, "url": f"../../files/{WANTED}", "hashes": {"sha256": "cd" * 32}}]}).encode()
    assert nccl_fetch.page_files(page, "application/vnd.pypi.simple.v1+json", "https://i/simple/p/") == [
        (WANTED, f"https://i/files/{WANTED}", "cd" * 32)]


def test_a_token_goes_to_the_index_host_only():
    assert nccl_fetch._auth("https://i/simple/p/", "https://i/simple", "t") == {"Authorization": "Bearer t"}
    assert nccl_fetch._auth("https://files.example/f.whl", "https://i/simple", "t") == {}
    assert nccl_fetch._auth("https://i/f.whl", "https://i/simple", "u:p")["Authorization"].startswith("Basic ")
