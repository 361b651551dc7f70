"""
A local stand-in for the Hugging Face Hub's HTTP API: enough of it for ``huggingface_hub``'s
``snapshot_download`` / ``hf_hub_download`` (with ``HF_ENDPOINT=http://HOST:PORT``) to fill an HF
cache from plain folders, with no Xet and no CDN redirect.

Repositories are folders under ``root``: ``root/<org>/<name>/<sha>/...files...`` (``<sha>`` a
40-hex commit id), and ``root/<org>/<name>/refs/<ref>`` text files naming a sha (``refs/main``
for ``revision="main"``). Served (model repositories only):

- ``GET /api/models/<org>/<name>[/revision/<rev>]``: model info (``sha``, ``siblings``; with
  ``?blobs=true`` (or ``True``: ``model_info(files_metadata=True)``) each sibling's ``size``,
  ``blobId`` and ``lfs``, which is how a download learns the revision's size first);
- ``GET /api/models/<org>/<name>/tree/<rev>[/<path>]?recursive=&cursor=``: the tree listing, 1000
  entries a page, more through a ``Link: <...>; rel="next"`` header;
- ``HEAD``/``GET /<org>/<name>/resolve/<rev>/<path>``: the file, with ``X-Repo-Commit``, ``ETag``
  (sha256 of the content for files of ``LFS_MIN_SIZE`` bytes or more, stored as LFS; else the git
  blob sha1), ``X-Linked-Etag``/``X-Linked-Size`` for LFS files, and single ``Range`` requests
  (206, or 416).

Errors are the hub's: a status, ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``, ``GatedRepo``), ``X-Error-Message`` and ``{"error": ...}``. With a token, the
repositories are gated as on the hub: info and listings stay public, file downloads without
``Authorization: Bearer <token>`` get 401 ``GatedRepo``, and any other token gets 401 "Invalid
credentials in Authorization header" everywhere. One line per request goes to stderr, never with
a header's value other than ``Range``.

Beside it, a Python package index (PEP 503 "simple", never gated) over a folder of wheels
(``index``): ``GET /simple/`` lists the projects, ``GET /simple/<project>/`` (names normalized;
other spellings redirect) lists each file as ``<a href="../../packages/FILE#sha256=HEX">FILE</a>``,
``GET /packages/FILE`` serves it. Each ``.whl`` sent whole appends one line to ``downloads``.

And git repositories, read-only and never gated, as GitHub serves a build repository
(``git``: a folder of bare repositories ``<name>.git``): ``/git/<name>.git/...`` answers git's
"smart" HTTP protocol (``info/refs?service=git-upload-pack`` and ``POST .../git-upload-pack``, run
by ``git http-backend``: shallow fetches and fetches of a commit by its id, as on GitHub; pushes
are refused) and its "dumb" one (the static files ``HEAD``, ``info/refs``, ``objects/info/*``,
loose objects and packs, as ``git update-server-info`` keeps them; nothing else of the repository,
no path outside it). A client that asks with ``GIT_SMART_HTTP=0`` gets the dumb protocol only.

``python -m sparkbed.hub --root DIR --host H --port P [--token-file F] [--index DIR [--downloads F]]
[--git DIR [--git-dumb]]`` serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import html
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

LFS_MIN_SIZE = 1 << 20  # files this large are served as LFS files (ETag = sha256)
PAGE_SIZE = 1000  # the hub's tree listing page (without expand)
CHUNK = 1 << 20
SHA_RE = re.compile(r"[0-9a-f]{40}")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"
DIST_FILE_RE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._]*?)-[0-9][^/]*\.(whl|tar\.gz|zip)")
GIT_REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.git")
# What a dumb-protocol client reads of a bare repository (git's http-fetch/remote-curl): nothing else.
GIT_DUMB_RE = re.compile(r"HEAD|info/refs|objects/info/(packs|alternates|http-alternates)"
                         r"|objects/[0-9a-f]{2}/[0-9a-f]{38,62}|objects/pack/pack-[0-9a-f]{40,64}\.(pack|idx)")

_hashes: dict[tuple, dict] = {}
_hash_lock = threading.Lock()
_file_locks: dict[str, threading.Lock] = {}
_log_lock = threading.Lock()


def log(line: str) -> None:
    """One line to stderr, whole even when threads log at once."""
    with _log_lock:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


# Content and git object ids
# --------------------------


def file_meta(path: Path) -> dict:
    """Size, LFS flag, git blob id and ETag of a file; memoized on (inode, size, mtime)."""
    st = path.stat()
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _hashes:
        return _hashes[key]
    with _hash_lock:
        lock = _file_locks.setdefault(str(path), threading.Lock())
    with lock:  # one hashing per file, however many requests wait for it
        if key in _hashes:
            return _hashes[key]
        lfs = st.st_size >= LFS_MIN_SIZE
        digest = hashlib.sha256() if lfs else hashlib.sha1(b"blob %d\0" % st.st_size)
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
        meta = {"size": st.st_size, "lfs": None, "oid": digest.hexdigest(), "etag": digest.hexdigest()}
        if lfs:
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{meta['etag']}\nsize {st.st_size}\n"
            meta["oid"] = hashlib.sha1(b"blob %d\0%s" % (len(pointer), pointer.encode())).hexdigest()
            meta["lfs"] = {"oid": meta["etag"], "size": st.st_size, "pointerSize": len(pointer)}
        _hashes[key] = meta
        return meta


def tree_oid(folder: Path) -> str:
    """The git tree id of a folder as served (LFS files as their pointers)."""
    entries = []
    for child in folder.iterdir():
        if child.is_dir():
            entries.append((child.name + "/", b"40000 %s\0" % child.name.encode(), tree_oid(child)))
        elif child.is_file():
            entries.append((child.name, b"100644 %s\0" % child.name.encode(), file_meta(child)["oid"]))
    body = b"".join(head + bytes.fromhex(oid) for _, head, oid in sorted(entries, key=lambda e: e[0].encode()))
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def walk(folder: Path, recursive: bool = True):
    """Yield ``(relative path, path)`` of the folders and files under ``folder``, sorted."""
    for child in sorted(folder.iterdir()):
        if child.is_dir() or child.is_file():
            yield child.name, child
        if recursive and child.is_dir():
            for rel, path in walk(child):
                yield f"{child.name}/{rel}", path


def warm(root: Path) -> None:
    """Hash every file under ``root`` ahead of the first listing or download."""
    for _, path in walk(root):
        if path.is_file():
            try:
                file_meta(path)
            except OSError:
                pass


# Repositories and revisions
# --------------------------


def safe_parts(parts: list[str]) -> bool:
    """Whether URL path parts name something inside a folder (no empty, ``.`` or ``..`` part)."""
    return bool(parts) and all(p not in ("", ".", "..") and "/" not in p and "\0" not in p for p in parts)


def repo_dir(root: Path, org: str, name: str) -> Path | None:
    """The folder of repository ``org/name``, or None."""
    if not (NAME_RE.fullmatch(org) and NAME_RE.fullmatch(name)):
        return None
    path = root / org / name
    return path if path.is_dir() else None


def resolve(repo: Path, revision: str) -> str | None:
    """The commit sha a revision (sha or ref) names in ``repo``, or None."""
    if SHA_RE.fullmatch(revision):
        return revision if (repo / revision).is_dir() else None
    parts = revision.split("/")
    ref = repo / "refs" / Path(*parts) if safe_parts(parts) else None
    if ref is None or not ref.is_file():
        return None
    sha = ref.read_text().strip()
    return sha if SHA_RE.fullmatch(sha) and (repo / sha).is_dir() else None


def iso_mtime(path: Path) -> str:
    """A path's mtime in the hub's date format."""
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(path.stat().st_mtime))


# The package index
# -----------------


def normalize(name: str) -> str:
    """A project name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def index_projects(index: Path) -> dict[str, list[Path]]:
    """``{normalized project: [its files]}`` of the distribution files in ``index``."""
    projects: dict[str, list[Path]] = {}
    for path in sorted(index.iterdir()) if index.is_dir() else []:
        m = DIST_FILE_RE.fullmatch(path.name)
        if m and path.is_file():
            projects.setdefault(normalize(m.group(1)), []).append(path)
    return projects


def sha256_of(path: Path) -> str:
    """The sha256 of a file, memoized on (inode, size, mtime)."""
    st = path.stat()
    key = ("sha256", str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _hashes:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
        _hashes[key] = digest.hexdigest()
    return _hashes[key]


def simple_page(title: str, anchors: list[tuple[str, str]]) -> bytes:
    links = "".join(f'    <a href="{html.escape(href)}">{html.escape(text)}</a><br/>\n' for href, text in anchors)
    return (f'<!DOCTYPE html>\n<html>\n  <head>\n    <meta name="pypi:repository-version" content="1.0">\n'
            f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
            f"{links}  </body>\n</html>\n").encode()


# HTTP
# ----


class HubError(Exception):
    """A hub error response: status, ``X-Error-Code`` (may be None), message and extra headers."""

    def __init__(self, status: int, code: str | None, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(first, last)`` of a single ``bytes=`` range; None to serve it all; HubError 416 if unsatisfiable."""
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", (header or "").strip())
    if not m or m.group(1) == m.group(2) == "" or (m.group(1) and m.group(2) and int(m.group(2)) < int(m.group(1))):
        return None  # none, several or invalid: RFC 9110 says serve it all
    if m.group(1) == "":
        first, last = max(size - int(m.group(2)), 0), size - 1
    else:
        first = int(m.group(1))
        last = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
    if first >= size or first > last:
        raise HubError(416, None, f"Requested range not satisfiable: {header}", {"Content-Range": f"bytes */{size}"})
    return first, last


class Handler(BaseHTTPRequestHandler):
    """The hub's endpoints over ``server.root`` (see the module docstring)."""

    protocol_version = "HTTP/1.1"
    server_version = "sparkinfra-hub"
    timeout = 120

    def do_GET(self):
        self.dispatch(body=True)

    def do_HEAD(self):
        self.dispatch(body=False)

    def do_POST(self):  # git's smart protocol only
        self.dispatch(body=True)

    def dispatch(self, body: bool) -> None:
        self.sent, self.auth, self.status = 0, "-", "-"
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        query = parse_qs(url.query)
        try:
            if parts[:1] == ["git"] and self.server.git is not None:
                self.auth = "git"  # public repositories, as a build repository on GitHub
                self.git(parts[1:], query, body)
                return
            if self.command == "POST":
                raise HubError(405, None, "Method Not Allowed")
            if parts[:1] in (["simple"], ["packages"]) and self.server.index is not None:
                self.auth = "index"  # the package index is never gated
                self.package_index(parts, url, body)
                return
            self.check_auth()
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                self.api(parts[2:], query, url, body)
            elif len(parts) >= 5 and parts[2] == "resolve":
                self.resolve_file(parts[0], parts[1], parts[3], "/".join(parts[4:]).split("/"), body)
            else:
                raise HubError(404, None, "Not Found")
        except HubError as e:
            self.send_error_json(e, body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except OSError as e:  # a file that vanished or cannot be read
            self.close_connection = True
            if self.status == "-":
                self.send_error_json(HubError(500, None, f"{type(e).__name__}: {e.strerror}"), body)
        finally:
            log(f'{self.client_address[0]} "{self.command} {self.path}" {self.status} {self.sent} '
                f'range={self.headers.get("Range", "-")} auth={self.auth}')

    def check_auth(self) -> None:
        """Set ``self.auth``: ``none``, ``ok``, ``ignored`` (an open hub) or ``bad`` (then HubError 401)."""
        header = self.headers.get("Authorization")
        token = self.server.token
        if header is None:
            self.auth = "none"
        elif token is None:
            self.auth = "ignored"
        elif hmac.compare_digest(header.encode(), f"Bearer {token}".encode()):
            self.auth = "ok"
        else:
            self.auth = "bad"
            raise HubError(401, None, INVALID_CREDENTIALS)

    def repo(self, org: str, name: str, revision: str) -> tuple[Path, str]:
        """The repository folder and commit sha, or HubError 404."""
        repo = repo_dir(self.server.root, org, name)
        if repo is None:
            raise HubError(404, "RepoNotFound", "Repository not found")
        sha = resolve(repo, revision)
        if sha is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return repo, sha

    def api(self, parts: list[str], query: dict, url, body: bool) -> None:
        org, name, rest = parts[0], parts[1], parts[2:]
        if rest == [] or (len(rest) == 2 and rest[0] == "revision"):
            repo, sha = self.repo(org, name, rest[1] if rest else "main")
            # requests (huggingface_hub 0.x) sends blobs=True, httpx blobs=true: the hub takes both
            self.send_json(self.model_info(repo, org, name, sha, query.get("blobs", [""])[0].lower() == "true"), body)
        elif len(rest) >= 2 and rest[0] == "tree":
            repo, sha = self.repo(org, name, rest[1])
            self.tree(repo / sha, "/".join(rest[2:]).split("/") if rest[2:] else [], query, url, body)
        else:
            raise HubError(404, None, "Not Found")

    def model_info(self, repo: Path, org: str, name: str, sha: str, blobs: bool) -> dict:
        siblings = []
        for rel, path in walk(repo / sha):
            if path.is_file():
                sibling = {"rfilename": rel}
                if blobs:
                    meta = file_meta(path)
                    sibling.update(size=meta["size"], blobId=meta["oid"])
                    if meta["lfs"]:
                        sibling["lfs"] = {"sha256": meta["etag"], "size": meta["size"],
                                          "pointerSize": meta["lfs"]["pointerSize"]}
                siblings.append(sibling)
        modified = iso_mtime(repo / sha)
        return {"id": f"{org}/{name}", "modelId": f"{org}/{name}", "author": org, "sha": sha,
                "private": False, "gated": "auto" if self.server.token else False, "disabled": False,
                "lastModified": modified, "createdAt": modified, "tags": [], "downloads": 0, "likes": 0,
                "siblings": siblings}

    def tree(self, top: Path, sub: list[str], query: dict, url, body: bool) -> None:
        folder = top / Path(*sub) if sub else top
        if sub and not (safe_parts(sub) and folder.is_dir()):
            raise HubError(404, "EntryNotFound", f"{'/'.join(sub)} does not exist on \"{top.name}\"")
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        try:
            start = int(query.get("cursor", ["0"])[0])
        except ValueError:
            raise HubError(400, None, "Invalid cursor") from None
        prefix = "/".join(sub) + "/" if sub else ""
        entries = list(walk(folder, recursive))
        page = []
        for rel, path in entries[start:start + PAGE_SIZE]:
            if path.is_dir():
                page.append({"type": "directory", "oid": tree_oid(path), "size": 0, "path": prefix + rel})
            else:
                meta = file_meta(path)
                entry = {"type": "file", "oid": meta["oid"], "size": meta["size"], "path": prefix + rel}
                if meta["lfs"]:
                    entry["lfs"] = meta["lfs"]
                page.append(entry)
        headers = {}
        if start + PAGE_SIZE < len(entries):
            params = urlencode({**{k: v[0] for k, v in query.items()}, "cursor": start + PAGE_SIZE})
            nxt = f"http://{self.headers.get('Host')}{url.path}?{params}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        self.send_json(page, body, headers)

    def resolve_file(self, org: str, name: str, revision: str, parts: list[str], body: bool) -> None:
        repo, sha = self.repo(org, name, revision)
        if self.server.token is not None and self.auth != "ok":
            raise HubError(401, "GatedRepo", f"Access to model {org}/{name} is restricted. You must have access "
                                            "to it and be authenticated to access it. Please log in.")
        path = repo / sha / Path(*parts) if safe_parts(parts) else None
        if path is None or not path.is_file():
            raise HubError(404, "EntryNotFound", f"{'/'.join(parts)} does not exist on \"{revision}\"",
                           {"X-Repo-Commit": sha})
        meta = file_meta(path)
        size = meta["size"]
        span = parse_range(self.headers.get("Range"), size)
        first, last = span or (0, size - 1)
        headers = {"X-Repo-Commit": sha, "ETag": f'"{meta["etag"]}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream", "Content-Length": str(last - first + 1)}
        if meta["lfs"]:
            headers.update({"X-Linked-Etag": f'"{meta["etag"]}"', "X-Linked-Size": str(size)})
        if span:
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        self.send_response(206 if span else 200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if not body:
            return
        cut = self.server.drop_after
        limit = last - first + 1 if span or cut is None else min(cut, last - first + 1)
        with open(path, "rb") as f:
            f.seek(first)
            while self.sent < limit:
                chunk = f.read(min(CHUNK, limit - self.sent))
                if not chunk:
                    break
                self.wfile.write(chunk)
                self.sent += len(chunk)
        if self.sent < last - first + 1:
            self.close_connection = True  # cut short (drop_after, or the file shrank): the client sees it

    def package_index(self, parts: list[str], url, body: bool) -> None:
        """PEP 503 pages and the files they link (see the module docstring)."""
        index = self.server.index
        if parts[0] == "simple":
            if parts in (["simple"], ["simple", ""]) and not url.path.endswith("/"):
                return self.redirect("/simple/", body)
            if parts == ["simple", ""]:
                projects = sorted(index_projects(index))
                return self.send_html(simple_page("Simple index", [(f"{p}/", p) for p in projects]), body)
            if len(parts) in (2, 3) and parts[2:] in ([], [""]) and safe_parts(parts[1:2]):
                name = normalize(parts[1])
                files = index_projects(index).get(name)
                if files is None:
                    raise HubError(404, None, f"No such project: {parts[1]}")
                if name != parts[1] or len(parts) == 2:
                    return self.redirect(f"/simple/{name}/", body)
                anchors = [(f"../../packages/{f.name}#sha256={sha256_of(f)}", f.name) for f in files]
                return self.send_html(simple_page(f"Links for {name}", anchors), body)
            raise HubError(404, None, "Not Found")
        if len(parts) != 2 or not safe_parts(parts[1:]) or not (index / parts[1]).is_file():
            raise HubError(404, None, "Not Found")
        path = index / parts[1]
        size = path.stat().st_size
        if not self.send_file(path, {"Content-Type": "application/octet-stream", "ETag": f'"{sha256_of(path)}"'}, body):
            return
        self.wfile.flush()
        if self.sent == size and path.name.endswith(".whl") and self.server.downloads is not None:
            with _log_lock, open(self.server.downloads, "a") as counter:
                counter.write(f"{time.strftime('%H:%M:%S')} {self.client_address[0]} {path.name}\n")

    def git(self, parts: list[str], query: dict, body: bool) -> None:
        """A repository of ``server.git`` over git's smart or dumb HTTP protocol (see the module docstring)."""
        if not (len(parts) >= 2 and GIT_REPO_RE.fullmatch(parts[0]) and safe_parts(parts)):
            raise HubError(404, None, "Repository not found")
        repo = self.server.git / parts[0]
        if not (repo / "objects").is_dir():
            raise HubError(404, None, "Repository not found")
        rel = "/".join(parts[1:])
        service = query.get("service", [None])[0]
        if service == "git-receive-pack" or rel == "git-receive-pack":
            raise HubError(403, None, "Write access to the repository is not granted.")
        smart = self.server.git_smart and (service == "git-upload-pack" and rel == "info/refs"
                                           or rel == "git-upload-pack")
        if smart:
            if (self.command == "POST") != (rel == "git-upload-pack"):
                raise HubError(405, None, "Method Not Allowed")
            return self.git_backend(parts[0], rel, body)
        if self.command == "POST" or not GIT_DUMB_RE.fullmatch(rel):  # a query is ignored, as a file server does
            raise HubError(404, None, "Not Found")
        path = repo / rel
        if path.is_symlink() or not path.is_file():
            raise HubError(404, None, "Not Found")
        kind = ("application/x-git-loose-object" if re.fullmatch(r"objects/[0-9a-f]{2}/.*", rel) else
                "application/octet-stream" if rel.startswith("objects/pack/") else "text/plain; charset=utf-8")
        self.send_file(path, {"Content-Type": kind, "Cache-Control": "no-cache"}, body)

    def send_file(self, path: Path, headers: dict, body: bool) -> bool:
        """200 with ``headers`` and the file's length, then (``body``) the file; whether it was sent."""
        self.send_response(200)
        for key, value in {**headers, "Content-Length": str(path.stat().st_size)}.items():
            self.send_header(key, value)
        self.end_headers()
        if not body:
            return False
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                self.wfile.write(chunk)
                self.sent += len(chunk)
        return True

    def request_body(self) -> bytes:
        """The request's body: ``Content-Length`` bytes, or its chunks (git sends large ones chunked)."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                data += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
            return data
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def git_backend(self, repo: str, rel: str, body: bool) -> None:
        """Run ``git http-backend`` (a CGI program) for one smart-protocol request, upload-pack only."""
        data = self.request_body() if self.command == "POST" else b""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_PROJECT_ROOT": str(self.server.git),
            "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": f"/{repo}/{rel}",
            "REQUEST_METHOD": "POST" if self.command == "POST" else "GET",
            "QUERY_STRING": "service=git-upload-pack" if rel == "info/refs" else "",
            "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(data)),
            "REMOTE_ADDR": self.client_address[0], "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
            # as GitHub: any commit a branch reaches can be fetched by its id
            "GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_0": "uploadpack.allowReachableSHA1InWant",
            "GIT_CONFIG_VALUE_0": "true", "GIT_CONFIG_KEY_1": "safe.directory", "GIT_CONFIG_VALUE_1": "*",
        }
        for header, name in (("Git-Protocol", "GIT_PROTOCOL"), ("Content-Encoding", "HTTP_CONTENT_ENCODING")):
            if self.headers.get(header):
                env[name] = self.headers[header]
        proc = subprocess.run(["git", "http-backend"], input=data, env=env, capture_output=True, timeout=120)
        cut = re.search(rb"\r?\n\r?\n", proc.stdout)
        head, payload = (proc.stdout[:cut.start()], proc.stdout[cut.end():]) if cut else (b"", b"")
        if proc.returncode != 0 or not head:
            message = proc.stderr.decode(errors="replace").strip().splitlines()
            raise HubError(500, None, f"git http-backend: {message[-1] if message else proc.returncode}")
        status, headers = 200, {}
        for line in head.decode("latin-1").splitlines():
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.split()[0])
            elif key:
                headers[key.strip()] = value.strip()
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(payload))}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(payload)
            self.sent = len(payload)

    def redirect(self, location: str, body: bool) -> None:
        self.send_response(301)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def send_html(self, payload: bytes, body: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body:
            self.wfile.write(payload)
            self.sent = len(payload)

    def send_json(self, data, body: bool, headers: dict | None = None, status: int = 200) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        for key, value in {"Content-Type": "application/json; charset=utf-8",
                           "Content-Length": str(len(payload)), **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(payload)
            self.sent = len(payload)

    def send_error_json(self, e: HubError, body: bool) -> None:
        if self.command == "POST":
            self.close_connection = True  # its body may be unread
        message = e.message.encode("ascii", "backslashreplace").decode()  # headers are latin-1
        headers = {"X-Error-Message": message, **({"X-Error-Code": e.code} if e.code else {}), **e.headers}
        self.send_json({"error": e.message}, body, headers, e.status)

    def log_request(self, code="-", size="-"):
        self.status = getattr(code, "value", code)  # logged by dispatch once the body is sent

    def log_message(self, format, *args):  # requests http.server refuses (bad request line, method)
        log(f'{self.client_address[0]} "{getattr(self, "requestline", "")}" {format % args}')


def serve(root: Path, host: str, port: int, token: str | None = None, *,
          drop_after: int | None = None, index: Path | None = None,
          downloads: Path | None = None, git: Path | None = None, git_smart: bool = True) -> ThreadingHTTPServer:
    """
    Start serving ``root`` on ``host:port`` (0: any free port, see ``server_address``) in a daemon
    thread; the caller calls ``shutdown()`` and ``server_close()``. With ``token``, the repositories
    are gated on it. ``drop_after`` (a fault for tests) closes every download that asks for no
    ``Range`` after that many bytes, so only a client that resumes with ``Range`` completes.
    ``index``: a folder of wheels served as a package index (``downloads``: the file each whole
    ``.whl`` download appends a line to). ``git``: a folder of bare repositories ``<name>.git``
    served under ``/git/`` (``git_smart``: by ``git http-backend`` too, else the dumb protocol only).
    """
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    server.root, server.token, server.drop_after = Path(root), token, drop_after
    server.index = Path(index) if index is not None else None
    server.downloads = Path(downloads) if downloads is not None else None
    server.git, server.git_smart = (Path(git) if git is not None else None), git_smart
    threading.Thread(target=server.serve_forever, args=(0.1,), name="hub", daemon=True).start()
    threading.Thread(target=warm, args=(Path(root),), name="hub-warm", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkbed.hub", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="root/<org>/<name>/<sha>/... and refs/<ref>")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--token-file", type=Path, help="a file holding the token that gates every repository")
    parser.add_argument("--index", type=Path, help="a folder of wheels to serve as a PEP 503 index (/simple/)")
    parser.add_argument("--downloads", type=Path, help="a file each whole .whl download appends a line to")
    parser.add_argument("--git", type=Path, help="a folder of bare repositories <name>.git to serve under /git/")
    parser.add_argument("--git-dumb", action="store_true", help="git's dumb HTTP protocol only (no git http-backend)")
    args = parser.parse_args(argv)
    token = None
    if args.token_file:
        token = args.token_file.read_text().strip()
        if not token:
            parser.error(f"{args.token_file} is empty")
    for folder in (args.root, args.git):
        if folder is not None and not folder.is_dir():
            parser.error(f"{folder} is not a folder")
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # before the threads start: only sigwait sees them
    server = serve(args.root, args.host, args.port, token, index=args.index, downloads=args.downloads,
                   git=args.git, git_smart=not args.git_dumb)
    host, port = server.server_address[:2]
    log(f"hub: serving {args.root} on http://{host}:{port}{' (gated)' if token else ''}")
    signal.sigwait(stop)
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
