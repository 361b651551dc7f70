"""
The Hub stand-in (``sparkbed.hub``) against the real ``huggingface_hub`` client: a small
repository tree in ``tmp_path`` served on 127.0.0.1, downloaded into an HF cache with
``snapshot_download`` the way ``operations.snapshot_downloaded`` calls it.

The client runs in a subprocess (it reads ``HF_ENDPOINT`` at import), with this interpreter or the
one ``HUB_CLIENT_PYTHON`` names: e.g. a venv holding ``huggingface_hub<1`` to check the 0.x client
that older nodes may have. The server's request log (stderr, read with ``capfd``) shows what the
client asked for.

And its git server against the real ``git`` client: a bare repository of two commits, listed,
cloned and fetched over the smart and the dumb HTTP protocols, as a repository recipe's build does.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkbed import hub

CLIENT = os.environ.get("HUB_CLIENT_PYTHON", sys.executable)
SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER_SHA = "f" * 40
REPO = "org/model"
TOKEN = "hf_test_token_0123456789"
BIG = "model.safetensors"
FILES = {
    "config.json": b'{"architectures": ["SyntheticMoE"], "model_type": "llama"}',
    "sub/deep/notes.txt": b"nested\n",
    "sub/empty.txt": b"",
    BIG: random.Random(0).randbytes(1 << 20),
}
CLIENT_SCRIPT = r"""
import json, sys
import huggingface_hub as hh
args = json.loads(sys.argv[1])
try:
    if args["call"] == "snapshot_download":
        out = {"path": hh.snapshot_download(args["repo"], revision=args["revision"], cache_dir=args["cache_dir"],
                                            token=args["token"])}
    else:
        tree = hh.HfApi().list_repo_tree(args["repo"], revision=args["revision"], recursive=True, token=args["token"])
        out = {"tree": [[f.path, getattr(f, "blob_id", None) or f.tree_id] for f in tree]}
except Exception as e:
    out = {"error": type(e).__name__, "status": getattr(getattr(e, "response", None), "status_code", None),
           "message": str(e)}
out["version"] = hh.__version__
print(json.dumps(out))
"""


# Helpers
# -------


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def etag(data: bytes) -> str:
    """What the blob is named in the cache: sha256 for LFS-sized files, else the git blob id."""
    return hashlib.sha256(data).hexdigest() if len(data) >= hub.LFS_MIN_SIZE else git_blob_sha1(data)


@pytest.fixture
def root(tmp_path) -> Path:
    """``root/org/model/<SHA>/...`` with ``refs/main`` naming it."""
    repo = tmp_path / "hub" / "org" / "model"
    for rel, data in FILES.items():
        (repo / SHA / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / SHA / rel).write_bytes(data)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA + "\n")
    return tmp_path / "hub"


@pytest.fixture
def start(root):
    """Start a server on 127.0.0.1 (``start(token=..., drop_after=...)``); its endpoint URL."""
    servers = []

    def _start(**kwargs) -> str:
        server = hub.serve(root, "127.0.0.1", 0, **kwargs)
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield _start
    for server in servers:
        server.shutdown()
        server.server_close()


def client(endpoint: str, tmp_path: Path, call: str = "snapshot_download", *, repo: str = REPO,
           revision: str = SHA, token: str | None = TOKEN, offline: bool = False) -> dict:
    """Run ``huggingface_hub`` against ``endpoint`` in a fresh process; what it returned or raised."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf_home"), HF_HUB_DISABLE_PROGRESS_BARS="1",
               HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_OFFLINE="1" if offline else "0")
    args = {"call": call, "repo": repo, "revision": revision, "cache_dir": str(tmp_path / "cache"), "token": token}
    proc = subprocess.run([CLIENT, "-c", CLIENT_SCRIPT, json.dumps(args)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def major(result: dict) -> int:
    return int(result["version"].split(".")[0])


def server_log(capfd) -> str:
    """What the server logged since the last call (its last line may trail the client's exit a little)."""
    log = capfd.readouterr().err
    time.sleep(0.05)
    return log + capfd.readouterr().err


def log_lines(log: str, method: str, rel: str) -> list[str]:
    """The server's log lines for ``method`` on the file ``rel`` of ``REPO``."""
    return [line for line in log.splitlines() if f'"{method} /{REPO}/resolve/' in line and f'/{rel}"' in line]


def storage(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "models--org--model"


def assert_snapshot(tmp_path: Path, path: str) -> None:
    """The snapshot holds every file, as relative symlinks to content-addressed blobs."""
    snapshot = storage(tmp_path) / "snapshots" / SHA
    assert Path(path) == snapshot
    for rel, data in FILES.items():
        link = snapshot / rel
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        assert link.resolve() == (storage(tmp_path) / "blobs" / etag(data)).resolve()
        assert link.read_bytes() == data
    assert not list((storage(tmp_path) / "blobs").glob("*.incomplete"))


def request(endpoint: str, method: str, path: str, headers: dict | None = None):
    """One request with http.client; (status, headers, body)."""
    conn = http.client.HTTPConnection(endpoint.removeprefix("http://"), timeout=10)
    conn.request(method, path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, resp.headers, body


# The client's paths
# ------------------


def test_snapshot_download_fills_the_cache_then_works_offline(start, tmp_path, capfd):
    endpoint = start(token=TOKEN)
    result = client(endpoint, tmp_path)
    assert "path" in result, result
    assert_snapshot(tmp_path, result["path"])
    log = server_log(capfd)
    gets = log_lines(log, "GET", BIG)
    assert gets and all(" 200 " in line and "range=-" in line for line in gets)
    assert "auth=ok" in log and TOKEN not in log
    assert "/tree/" in log or "/revision/" in log  # the file list came from the API

    offline = client(endpoint, tmp_path, offline=True)
    assert offline["path"] == result["path"]
    assert server_log(capfd) == ""  # not a single request

    by_branch = client(endpoint, tmp_path, revision="main")
    assert by_branch["path"] == result["path"]
    assert (storage(tmp_path) / "refs" / "main").read_text() == SHA
    assert not log_lines(server_log(capfd), "GET", BIG)  # the blobs were there already


def test_gated_repository_needs_the_token(start, tmp_path, capfd):
    endpoint = start(token=TOKEN)
    missing = client(endpoint, tmp_path, token=None)
    assert (missing["error"], missing["status"]) == ("GatedRepoError", 401), missing
    wrong = client(endpoint, tmp_path, token="hf_wrong_token_987")
    assert wrong["status"] == 401 and "Invalid credentials in Authorization header" in wrong["message"], wrong
    assert not (storage(tmp_path) / "snapshots").exists() or not any((storage(tmp_path) / "snapshots").iterdir())
    log = server_log(capfd)
    assert "auth=none" in log and "auth=bad" in log
    assert TOKEN not in log and "hf_wrong_token_987" not in log


def test_unknown_revision_and_repository(start, tmp_path):
    endpoint = start(token=TOKEN)
    for revision in (OTHER_SHA, "no-such-branch"):
        result = client(endpoint, tmp_path, revision=revision)
        assert (result["error"], result["status"]) == ("RevisionNotFoundError", 404), result
    result = client(endpoint, tmp_path, repo="org/missing")
    assert (result["error"], result["status"]) == ("RepositoryNotFoundError", 404), result


def test_cut_download_is_resumed_with_a_range_request(root, start, tmp_path, capfd):
    """
    Every download without ``Range`` is cut after 11 MiB, of a 12 MiB file. The client writes what
    it received in 10 MiB chunks (``DOWNLOAD_CHUNK_SIZE``), then: 1.x and later retry within the
    call (httpx's RemoteProtocolError) with ``Range`` from there; 0.x fails the call (requests'
    ChunkedEncodingError), keeps ``<etag>.incomplete`` and resumes from it on the next call.
    """
    shard, data, cut = "shard.safetensors", random.Random(1).randbytes(12 << 20), 11 << 20
    (root / REPO / SHA / shard).write_bytes(data)
    endpoint = start(token=TOKEN, drop_after=cut)
    result = client(endpoint, tmp_path)
    if "error" in result:
        assert major(result) == 0, result
        partial = storage(tmp_path) / "blobs" / f"{etag(data)}.incomplete"
        assert 0 < partial.stat().st_size <= cut and data.startswith(partial.read_bytes())
        result = client(endpoint, tmp_path)
    assert "path" in result, result
    assert_snapshot(tmp_path, result["path"])
    assert (Path(result["path"]) / shard).read_bytes() == data
    gets = log_lines(server_log(capfd), "GET", shard)
    assert f" 200 {cut} range=- " in gets[0], gets
    resumed = [re.search(r" 206 (\d+) range=bytes=(\d+)- ", line) for line in gets[1:]]
    assert any(m and 0 < int(m[2]) <= cut and int(m[1]) == len(data) - int(m[2]) for m in resumed), gets


def test_partial_blob_left_by_an_earlier_run(start, tmp_path, capfd):
    """
    0.x resumes ``blobs/<etag>.incomplete`` with a Range request. 1.x and later download into a
    per-process ``<etag>.<random>.incomplete`` and never read another run's partial file: they
    download the whole file and leave the old one alone.
    """
    endpoint = start(token=TOKEN)
    half = len(FILES[BIG]) // 2
    partial = storage(tmp_path) / "blobs" / f"{etag(FILES[BIG])}.incomplete"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(FILES[BIG][:half])
    result = client(endpoint, tmp_path)
    assert "path" in result, result
    assert (storage(tmp_path) / "snapshots" / SHA / BIG).read_bytes() == FILES[BIG]
    gets = log_lines(server_log(capfd), "GET", BIG)
    if major(result) == 0:
        assert len(gets) == 1 and f" 206 {half} range=bytes={half}- " in gets[0], gets
        assert not partial.exists()
    else:
        assert len(gets) == 1 and f" 200 {len(FILES[BIG])} range=- " in gets[0], gets
        assert partial.read_bytes() == FILES[BIG][:half]


def test_tree_listing_pages_and_git_ids(start, tmp_path, monkeypatch):
    """The listing follows ``Link`` pages; its ids are git's (LFS files as their pointers)."""
    monkeypatch.setattr(hub, "PAGE_SIZE", 2)
    endpoint = start()
    result = client(endpoint, tmp_path, "list_repo_tree", token=None)
    ids = dict(result["tree"])
    assert sorted(ids) == sorted([*FILES, "sub", "sub/deep"]), result
    if shutil.which("git") is None:
        pytest.skip("no git to compare object ids with")
    work = tmp_path / "git"
    shutil.copytree(tmp_path / "hub" / "org" / "model" / SHA, work)
    sha256 = hashlib.sha256(FILES[BIG]).hexdigest()
    (work / BIG).write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {1 << 20}\n")
    git = ["git", "-C", str(work), "-c", "core.autocrlf=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    tree = subprocess.run([*git, "write-tree"], check=True, capture_output=True, text=True).stdout.strip()
    for path, oid in ids.items():
        assert subprocess.run([*git, "rev-parse", f"{tree}:{path}"], check=True, capture_output=True,
                              text=True).stdout.strip() == oid, path


# The HTTP details
# ----------------


def test_resolve_headers_ranges_and_errors(start):
    endpoint = start(token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    big = FILES[BIG]
    status, headers, body = request(endpoint, "HEAD", f"/{REPO}/resolve/main/{BIG}", auth)
    assert (status, body) == (200, b"")
    assert headers["X-Repo-Commit"] == SHA
    assert headers["ETag"] == headers["X-Linked-Etag"] == f'"{hashlib.sha256(big).hexdigest()}"'
    assert headers["Content-Length"] == headers["X-Linked-Size"] == str(len(big))
    assert not [k for k in headers if k.lower().startswith("x-xet")]  # plain HTTP downloads, never Xet

    status, headers, body = request(endpoint, "GET", f"/{REPO}/resolve/{SHA}/config.json", auth)
    assert (status, body) == (200, FILES["config.json"])
    assert headers["ETag"] == f'"{git_blob_sha1(FILES["config.json"])}"'
    assert "X-Linked-Etag" not in headers

    status, headers, body = request(endpoint, "GET", f"/{REPO}/resolve/{SHA}/{BIG}", {**auth, "Range": "bytes=-10"})
    assert (status, body) == (206, big[-10:])
    assert headers["Content-Range"] == f"bytes {len(big) - 10}-{len(big) - 1}/{len(big)}"
    status, headers, _ = request(endpoint, "GET", f"/{REPO}/resolve/{SHA}/{BIG}", {**auth, "Range": f"bytes={len(big)}-"})
    assert (status, headers["Content-Range"]) == (416, f"bytes */{len(big)}")

    status, headers, body = request(endpoint, "GET", f"/{REPO}/resolve/{SHA}/nope.bin", auth)
    assert (status, headers["X-Error-Code"], headers["X-Repo-Commit"]) == (404, "EntryNotFound", SHA)
    assert json.loads(body)["error"]
    status, _, _ = request(endpoint, "GET", f"/{REPO}/resolve/{SHA}/sub/../../{OTHER_SHA}/x", auth)
    assert status == 404
    status, headers, _ = request(endpoint, "HEAD", f"/{REPO}/resolve/{SHA}/{BIG}")
    assert (status, headers["X-Error-Code"]) == (401, "GatedRepo")

    status, _, body = request(endpoint, "GET", f"/api/models/{REPO}/revision/main?blobs=true")
    info = json.loads(body)
    assert (status, info["id"], info["sha"]) == (200, REPO, SHA)
    siblings = {s["rfilename"]: s for s in info["siblings"]}
    assert sorted(siblings) == sorted(FILES)
    assert siblings[BIG]["lfs"]["sha256"] == hashlib.sha256(big).hexdigest()
    status, headers, _ = request(endpoint, "GET", f"/api/models/{REPO}/revision/{OTHER_SHA}")
    assert (status, headers["X-Error-Code"]) == (404, "RevisionNotFound")
    status, headers, _ = request(endpoint, "GET", "/api/models/org/missing")
    assert (status, headers["X-Error-Code"]) == (404, "RepoNotFound")


@pytest.mark.parametrize("flag", ["true", "True"])  # httpx (huggingface_hub 1.x and later), requests (0.x)
def test_model_info_with_files_metadata_gives_each_files_size(start, flag):
    """What a download asks first for the revision's size: ``model_info(files_metadata=True)``."""
    endpoint = start(token=TOKEN)
    status, _, body = request(endpoint, "GET", f"/api/models/{REPO}/revision/{SHA}?blobs={flag}")
    siblings = {s["rfilename"]: s for s in json.loads(body)["siblings"]}
    assert status == 200 and {rel: s["size"] for rel, s in siblings.items()} == {k: len(v) for k, v in FILES.items()}
    assert siblings["config.json"]["blobId"] == git_blob_sha1(FILES["config.json"])
    _, _, body = request(endpoint, "GET", f"/api/models/{REPO}/revision/{SHA}")
    assert all("size" not in s for s in json.loads(body)["siblings"])
    status, _, _ = request(endpoint, "GET", f"/api/models/{REPO}/revision/{SHA}?blobs={flag}",
                           {"Authorization": "Bearer hf_wrong_token_987"})
    assert status == 401  # the same gate as every request


def test_command_line_serves_until_sigterm(root, tmp_path, git_root):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "sparkbed.hub", "--root", str(root), "--host", "127.0.0.1",
                             "--port", "0", "--token-file", str(token_file), "--git", str(git_root[0])],
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()
        endpoint = re.search(r"http://127\.0\.0\.1:\d+", first).group(0)
        status, _, body = request(endpoint, "GET", f"/{REPO}/resolve/main/config.json",
                               {"Authorization": f"Bearer {TOKEN}"})
        assert (status, body) == (200, FILES["config.json"])
        assert git("ls-remote", f"{endpoint}/git/x.git", "main").split() == [git_root[2], "refs/heads/main"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        log = first + proc.stderr.read()
        assert "config.json\" 200" in log and TOKEN not in log
    finally:
        proc.kill()
        proc.wait()


# The git server
# --------------

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t.invalid"}
DUMB_SHALLOW = "dumb http transport does not support shallow capabilities"
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="no git")


def git(*args: str, cwd: Path | None = None, check: bool = True, **env: str) -> str:
    """The git client, with no proxy and no user or system config; its stdout (stderr too when ``check`` is off)."""
    clean = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and not k.startswith("GIT_")}
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**clean, **GIT_ENV, **env})
    if check:
        assert proc.returncode == 0, proc.stderr
        return proc.stdout
    return proc.stdout + proc.stderr + f"\nrc={proc.returncode}"


@pytest.fixture
def git_root(tmp_path) -> tuple[Path, str, str]:
    """``git/x.git``: a bare repository whose ``main`` has two commits, its server info current;
    (the folder, the first commit, the second)."""
    if shutil.which("git") is None:
        pytest.skip("no git")
    work = tmp_path / "work"
    git("init", "-q", "-b", "main", str(work))
    (work / "build.sh").write_text("#!/bin/sh\necho one\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "one", cwd=work)
    (work / "build.sh").write_text("#!/bin/sh\necho two\n")
    git("commit", "-q", "-am", "two", cwd=work)
    first, second = git("rev-list", "main", cwd=work).split()[::-1]
    bare = tmp_path / "git" / "x.git"
    git("clone", "-q", "--bare", str(work), str(bare))
    git("--git-dir", str(bare), "update-server-info")
    return tmp_path / "git", first, second


@pytest.fixture
def git_server(start, git_root):
    """``serve(smart)``: a hub serving ``git_root`` (``smart``: git http-backend too); the repository's URL."""
    return lambda smart=True: start(token=TOKEN, git=git_root[0], git_smart=smart) + "/git/x.git"


@pytest.mark.parametrize("smart", [True, False], ids=["smart", "dumb"])
def test_git_lists_clones_and_fetches_a_commit_by_id(git_server, git_root, tmp_path, smart, capfd):
    """Never gated (a public build repository); over either protocol ``ls-remote`` names ``main``'s
    commit, a clone has both commits, and a commit that no branch names is fetched by its id."""
    _, first, second = git_root
    url = git_server(smart)
    assert git("ls-remote", url, "main").split() == [second, "refs/heads/main"]
    git("clone", "-q", url, str(tmp_path / "clone"))
    assert git("log", "--format=%H", cwd=tmp_path / "clone").split() == [second, first]
    git("init", "-q", str(tmp_path / "by-id"))
    git("fetch", "-q", url, first, cwd=tmp_path / "by-id")
    git("checkout", "-q", "--force", "--detach", first, cwd=tmp_path / "by-id")
    assert (tmp_path / "by-id" / "build.sh").read_text() == "#!/bin/sh\necho one\n"
    log = server_log(capfd)
    assert "auth=git" in log and TOKEN not in log
    assert ("POST /git/x.git/git-upload-pack" in log) == smart


def test_a_shallow_fetch_of_a_commit_needs_the_smart_protocol(git_server, git_root, tmp_path):
    """What a repository recipe's build runs (image_build.sh): ``git fetch --depth 1 URL COMMIT``, then
    a detached checkout. As on GitHub, over the smart protocol; the dumb one has no shallow fetch,
    whether the server has no http-backend or the client asks for dumb (``GIT_SMART_HTTP=0``)."""
    _, first, _ = git_root
    smart, dumb = git_server(True), git_server(False)
    src = tmp_path / "src"
    git("init", "-q", str(src))
    git("fetch", "-q", "--depth", "1", smart, first, cwd=src)
    git("checkout", "-q", "--force", "--detach", first, cwd=src)
    assert git("rev-list", "--count", "HEAD", cwd=src).strip() == "1"
    assert (src / ".git" / "shallow").read_text().strip() == first
    for url, env in ((dumb, {}), (smart, {"GIT_SMART_HTTP": "0"})):
        other = tmp_path / f"dumb-{len(env)}"
        git("init", "-q", str(other))
        out = git("fetch", "-q", "--depth", "1", url, first, cwd=other, check=False, **env)
        assert DUMB_SHALLOW in out and out.endswith("rc=128"), out
        git("fetch", "-q", url, "main", cwd=other, **env)  # what works there: a whole fetch, then the id
        git("checkout", "-q", "--detach", first, cwd=other, **env)


def test_the_git_server_is_read_only_and_serves_the_repositories_alone(git_server, git_root, tmp_path):
    folder, _, second = git_root
    url = git_server()
    endpoint, path = url.rsplit("/git/", 1)[0], "/git/x.git"
    git("clone", "-q", url, str(tmp_path / "clone"))
    (tmp_path / "clone" / "new").write_text("x")
    git("add", "-A", cwd=tmp_path / "clone")
    git("commit", "-q", "-m", "three", cwd=tmp_path / "clone")
    out = git("push", url, "HEAD:main", cwd=tmp_path / "clone", check=False)
    assert "403" in out and not out.endswith("rc=0"), out
    assert git("--git-dir", str(folder / "x.git"), "rev-parse", "main").strip() == second
    status, _, _ = request(endpoint, "GET", f"{path}/info/refs?service=git-receive-pack")
    assert status == 403
    status, headers, body = request(endpoint, "GET", f"{path}/HEAD")
    assert (status, body) == (200, b"ref: refs/heads/main\n")
    assert request(endpoint, "HEAD", f"{path}/info/refs")[0] == 200
    (folder / "secret").write_text("outside every repository")
    for bad in (f"{path}/config", f"{path}/hooks/pre-receive.sample", f"{path}/description", f"{path}/objects/../config",
                f"{path}/../secret", "/git/..%2Fsecret", f"{path}/%2E%2E/%2E%2E/secret", "/git/x.git", "/git/",
                "/git/nope.git/HEAD", f"{path}/info/../../secret"):
        assert request(endpoint, "GET", bad)[0] == 404, bad
    assert request(endpoint, "POST", f"{path}/info/refs")[0] in (404, 405)
    assert request(endpoint, "POST", f"/{REPO}/resolve/main/config.json")[0] == 405


def test_upload_pack_takes_a_chunked_or_gzipped_request(git_server, git_root):
    """git sends a large request chunked, and gzips one of more than 1 KiB; protocol v2's ls-refs here."""
    _, _, second = git_root
    endpoint, path = git_server().rsplit("/git/", 1)[0], "/git/x.git/git-upload-pack"

    def pkt(line: str) -> bytes:
        return f"{len(line) + 4:04x}{line}".encode()

    body = pkt("command=ls-refs\n") + b"0001" + pkt("ref-prefix refs/heads/\n") + b"0000"
    headers = {"Git-Protocol": "version=2", "Content-Type": "application/x-git-upload-pack-request"}
    for kwargs in ({"body": iter([body[:9], body[9:]]), "encode_chunked": True},
                   {"body": gzip.compress(body), "headers": {**headers, "Content-Encoding": "gzip"}}):
        conn = http.client.HTTPConnection(endpoint.removeprefix("http://"), timeout=10)
        conn.request("POST", path, **{"headers": headers, **kwargs})
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, pkt(f"{second} refs/heads/main\n") + b"0000")
        assert resp.getheader("Content-Type") == "application/x-git-upload-pack-result"
        conn.close()
