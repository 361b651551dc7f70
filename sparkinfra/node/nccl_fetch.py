"""
Over 400 lines: the index's two page forms, the platform's wheel, the download with its progress,
and the checks of the pin (the index's and the lock's sha256, the library's identity) are one fetch.

Runs ON the head (stdlib only, python3 >= 3.8; ``nccl_identity.py`` must be in the same folder):
fetch the pinned NCCL build once from a Python package index, as the wheel that carries it
(``nvidia-nccl-cu13`` holds ``nvidia/nccl/lib/libnccl.so.2``), and record which build it is.

    python3 nccl_fetch.py --index https://pypi.org/simple --project nvidia-nccl-cu13 --version 2.30.7 \\
        --machine aarch64 --dest /opt/nccl/lib/libnccl.so.2 --record /etc/sparkinfra/nccl-pin.json \\
        [--token-file F] [--wheel-sha256 HEX]

- The project page ``INDEX/NAME/`` (PEP 503 HTML, or PEP 691 JSON) names the wheels; the one of
  exactly that version for ``manylinux…_MACHINE`` (or ``linux_MACHINE``) is taken, the lowest
  manylinux glibc first (the most compatible).
- It is downloaded beside ``--dest``, checked against the index's sha256, and its
  ``nvidia/nccl/lib/libnccl.so.2`` is written to ``--dest`` (atomically, 0644); ``--record`` gets
  ``{"version", "sha256", "build_id", "source": {"index", "project", "file", "wheel_sha256"}}``
  (sha256 and build-id of the .so).
- Already there (the record's version, project and platform match, and ``--dest`` has the
  record's sha256): ``already fetched``, nothing asked of the network.
- ``--wheel-sha256``: the wheel the site's lock pins; the index offering another for that version
  and platform is refused (exit 4), and a recorded build of another wheel is fetched again.
- ``--token-file``: its token goes to the index's own host only (``user:password`` as Basic,
  else Bearer); it is never printed.

Every PROGRESS_EVERY seconds (env, default 5) while downloading, one line::

    nccl: nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_aarch64.whl: 91 of 206 MiB (44%), 18 MiB/s, ETA 6 s

then ``nccl: fetched FILE (N MiB) from INDEX: libnccl.so.2 VERSION sha256 XXXXXXXXXXXX build-id
YYYYYYYYYYYY``. Failures are one line on stderr: exit 2 when the index has no such wheel (naming
the versions and platforms it has), 3 on a network error (the URL and the error), 4 when the
wheel's sha256 is not the index's or it holds no libnccl.so.2, 1 for anything local.
"""

import argparse
import base64
import hashlib
import html.parser
import http.client
import json
import os
import re
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import nccl_identity
except ImportError:  # pragma: no cover -- what the caller uploads wrong
    nccl_identity = None

MIB = 1 << 20
MEMBER = "nvidia/nccl/lib/libnccl.so.2"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
TIMEOUT = 60  # seconds without a byte before a request fails
LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


class Refused(Exception):
    """One line for stderr, and the exit status."""

    def __init__(self, line, status):
        Exception.__init__(self, line)
        self.status = status


def normalize(name):
    """PEP 503's name: ``Nvidia_NCCL.cu13`` -> ``nvidia-nccl-cu13``."""
    return re.sub(r"[-_.]+", "-", name).lower()


# The index ---------------------------------------------------------------------------------------


class _Anchors(html.parser.HTMLParser):
    def __init__(self):
        html.parser.HTMLParser.__init__(self)
        self.links, self._href, self._text = [], None, []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href, self._text = dict(attrs).get("href"), []

    def handle_data(self, data):
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def page_files(body, content_type, page_url):
    """``[(filename, absolute url without fragment, sha256 or None)]`` of a project page."""
    files = []
    if content_type.split(";")[0].strip().lower() == JSON_TYPE:
        for entry in json.loads(body.decode("utf-8")).get("files", []):
            url = urllib.parse.urljoin(page_url, entry["url"])
            files.append((entry["filename"], urllib.parse.urldefrag(url)[0],
                          (entry.get("hashes") or {}).get("sha256") or _fragment_sha256(url)))
        return files
    parser = _Anchors()
    parser.feed(body.decode("utf-8", "replace"))
    for href, text in parser.links:
        url = urllib.parse.urljoin(page_url, href)
        name = text or urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        files.append((name, urllib.parse.urldefrag(url)[0], _fragment_sha256(url)))
    return files


def _fragment_sha256(url):
    found = re.search(r"(?:^|&)sha256=([0-9a-fA-F]{64})(?:&|$)", urllib.parse.urlsplit(url).fragment)
    return found.group(1).lower() if found else None


def wheel_tags(filename):
    """``(project, version, [platform tags])`` of a wheel's file name; None for another file."""
    if not filename.endswith(".whl"):
        return None
    parts = filename[:-4].split("-")
    if len(parts) not in (5, 6):
        return None
    return normalize(parts[0]), parts[1], parts[-1].split(".")


def glibc(tag, machine):
    """The glibc a platform tag asks for, as ``(2, 18)``; ``(99, 0)`` for ``linux_MACHINE`` (built
    here, the least portable); None for a tag of another machine or system."""
    if tag == "linux_" + machine:
        return (99, 0)
    found = re.match(r"manylinux_(\d+)_(\d+)_(.+)$", tag)
    if found and found.group(3) == machine:
        return int(found.group(1)), int(found.group(2))
    legacy, _, arch = tag.partition("_")
    if legacy in LEGACY and arch == machine:
        return LEGACY[legacy]
    return None


def _version_key(version):
    return [int(x) if x.isdigit() else -1 for x in re.split(r"[.+-]", version)], version


def choose(files, project, version, machine, where="the index"):
    """The ``(filename, url, sha256)`` to take; Refused (2) naming what the page (``where``) has."""
    project, fits, versions, platforms = normalize(project), [], set(), set()
    for name, url, digest in files:
        tags = wheel_tags(name)
        if not tags or tags[0] != project:
            continue
        versions.add(tags[1])
        if tags[1] != version:
            continue
        platforms.update(tags[2])
        needs = [g for g in (glibc(tag, machine) for tag in tags[2]) if g is not None]
        if needs:
            fits.append((min(needs), name, url, digest))
    if fits:
        _, name, url, digest = min(fits)
        return name, url, digest
    seen = ", ".join(sorted(versions, key=_version_key)) or "none"
    has = (" ({} is there for {})".format(version, ", ".join(sorted(platforms)))) if platforms else ""
    raise Refused(f"nccl: no {project} {version} wheel for {machine} at {where}{has}; versions there: {seen}", 2)


# The network -------------------------------------------------------------------------------------


def _auth(url, index, token):
    """The Authorization header for ``url``: only on the index's own scheme and host."""
    if not token:
        return {}
    a, b = urllib.parse.urlsplit(url), urllib.parse.urlsplit(index)
    if (a.scheme, a.netloc) != (b.scheme, b.netloc):
        return {}
    if ":" in token:
        return {"Authorization": "Basic " + base64.b64encode(token.encode()).decode()}
    return {"Authorization": "Bearer " + token}


def _open(url, headers):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT)
    except urllib.error.HTTPError as exc:
        raise Refused(f"nccl: GET {url} failed: HTTP {exc.code} {exc.reason}", 3)
    except urllib.error.URLError as exc:
        raise Refused(f"nccl: GET {url} failed: {exc.reason}", 3)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise Refused(f"nccl: GET {url} failed: {type(exc).__name__}: {exc}", 3)


def project_page(index, project, token):
    """The project page's files, and its URL."""
    url = "{}/{}/".format(index.rstrip("/"), normalize(project))
    headers = dict(_auth(url, index, token), Accept=f"{JSON_TYPE}, text/html;q=0.5")
    response = _open(url, headers)
    try:
        with response:
            body = response.read()
            content_type = response.headers.get("Content-Type", "text/html")
            final = response.geturl()
    except (OSError, http.client.HTTPException) as exc:
        raise Refused(f"nccl: GET {url} failed: {type(exc).__name__}: {exc}", 3)
    try:
        return page_files(body, content_type, final), url
    except (ValueError, KeyError, TypeError) as exc:
        raise Refused(f"nccl: {url} is not a package index page: {exc}", 3)


def progress_line(label, done, total, rate):
    """``label: 91 of 206 MiB (44%), 18 MiB/s, ETA 6 s`` (no total: ``label: 91 MiB, 18 MiB/s``)."""
    if total:
        line = f"{label}: {done // MIB} of {total // MIB} MiB ({done * 100 // total}%)"
    else:
        line = f"{label}: {done // MIB} MiB"
    line += f", {int(rate) // MIB} MiB/s"
    if total and rate > 0:
        line += f", ETA {int(max(total - done, 0) / rate)} s"
    return line


def download(url, out, label, headers, every):
    """``url``'s bytes into the open file ``out``: (bytes, sha256), a line every ``every`` s."""
    response = _open(url, headers)
    digest, done, start = hashlib.sha256(), 0, time.monotonic()
    last = start
    try:
        with response:
            total = int(response.headers.get("Content-Length") or 0) or None
            for chunk in iter(lambda: response.read(MIB), b""):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                now = time.monotonic()
                if now - last >= every:
                    last = now
                    print(progress_line(label, done, total, done / max(now - start, 1e-3)), flush=True)
    except (OSError, http.client.HTTPException) as exc:
        if isinstance(exc, OSError) and getattr(exc, "filename", None):
            raise  # the local file, not the network
        raise Refused(f"nccl: GET {url} failed after {done} bytes: {type(exc).__name__}: {exc}", 3)
    if total and done != total:
        raise Refused(f"nccl: GET {url} failed: {done} of {total} bytes", 3)
    return done, digest.hexdigest()


# Files -------------------------------------------------------------------------------------------


def _makedirs(folder):
    if folder and not os.path.isdir(folder):
        os.makedirs(folder, mode=0o755, exist_ok=True)


def _fsync_dir(folder):
    try:
        fd = os.open(folder or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(path, source):
    """``source`` (bytes, or a readable binary file) to ``path``: a temp file beside it, fsync,
    mode 0644, rename; the parent folders made 0755."""
    folder = os.path.dirname(os.path.abspath(path))
    _makedirs(folder)
    fd, temp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(source, bytes):
                f.write(source)
            else:
                for chunk in iter(lambda: source.read(MIB), b""):
                    f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        _remove(temp)
        raise
    _fsync_dir(folder)


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def library_member(wheel):
    """The wheel's member that is ``nvidia/nccl/lib/libnccl.so.2`` (or its only ``libnccl.so.2``)."""
    names = [n for n in wheel.namelist() if not n.endswith("/")]
    exact = [n for n in names if n == MEMBER or n.endswith("/" + MEMBER)]
    if exact:
        return exact[0]
    named = [n for n in names if n.rsplit("/", 1)[-1] == "libnccl.so.2"]
    return named[0] if len(named) == 1 else None


def already_fetched(args):
    """Whether ``--dest`` is the recorded build of this version, project and machine."""
    try:
        with open(args.record) as f:
            record = json.load(f)
        source = record.get("source") or {}
        tags = wheel_tags(source.get("file") or "")
        return (record.get("version") == args.version and normalize(source.get("project") or "") == normalize(
            args.project) and bool(tags) and tags[1] == args.version
            and any(glibc(tag, args.machine) for tag in tags[2])
            and nccl_identity.sha256(args.dest) == record.get("sha256"))
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def _pinned_wheel(args):
    """Whether the recorded wheel is the one ``--wheel-sha256`` pins (any, without it)."""
    if not args.wheel_sha256:
        return True
    try:
        with open(args.record) as f:
            return (json.load(f).get("source") or {}).get("wheel_sha256") == args.wheel_sha256
    except (OSError, ValueError, AttributeError):
        return False


def fetch(args, token, every):
    files, page = project_page(args.index, args.project, token)
    name, url, expected = choose(files, args.project, args.version, args.machine, page)
    if args.wheel_sha256 and (expected or "").lower() != args.wheel_sha256:
        raise Refused(f"nccl: {page} now offers {name} with sha256 {expected or 'unknown'}, the site's lock pins "
                      f"{args.wheel_sha256}: refused (python -m sparkinfra lock INVENTORY --update nccl moves the pin)", 4)
    folder = os.path.dirname(os.path.abspath(args.dest))
    _makedirs(folder)
    fd, wheel_path = tempfile.mkstemp(dir=folder, prefix=".nccl-wheel-", suffix=".whl")
    try:
        with os.fdopen(fd, "wb") as out:
            size, digest = download(url, out, "nccl: " + name, _auth(url, args.index, token), every)
            out.flush()
        if expected and digest != expected:
            raise Refused(f"nccl: {name} from {args.index} has sha256 {digest}, the index says {expected}: refused", 4)
        try:
            with zipfile.ZipFile(wheel_path) as wheel:
                member = library_member(wheel)
                if member is None:
                    raise Refused(f"nccl: {name} holds no {MEMBER}", 4)
                with wheel.open(member) as source:
                    write_atomically(args.dest, source)
        except zipfile.BadZipFile as exc:
            raise Refused(f"nccl: {name} is not a wheel: {exc}", 4)
    finally:
        _remove(wheel_path)
    found = nccl_identity.identity(args.dest)
    if found.get("error"):
        raise Refused("nccl: {}: {}".format(args.dest, found["error"]), 1)
    record = {"version": args.version, "sha256": found["sha256"], "build_id": found["build_id"],
              "source": {"index": args.index, "project": args.project, "file": name, "wheel_sha256": digest}}
    write_atomically(args.record, (json.dumps(record, indent=1) + "\n").encode())
    checked = "" if expected else " (the index gave no sha256 to check the wheel against)"
    sha, bid = nccl_identity.short(found["sha256"]), nccl_identity.short(found["build_id"])
    print(f"nccl: fetched {name} ({size // MIB} MiB) from {args.index}: libnccl.so.2 {args.version} "
          f"sha256 {sha} build-id {bid}{checked}", flush=True)


def main(argv):
    parser = argparse.ArgumentParser(prog="nccl_fetch.py", description="fetch the pinned NCCL build from a package index")
    parser.add_argument("--index", required=True, help="a simple index, e.g. https://pypi.org/simple")
    parser.add_argument("--project", default="nvidia-nccl-cu13")
    parser.add_argument("--version", required=True)
    parser.add_argument("--machine", default=os.uname().machine)
    parser.add_argument("--dest", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--token-file")
    parser.add_argument("--wheel-sha256", default="", help="the wheel the site's lock pins (64 hex): no other is taken")
    args = parser.parse_args(argv)
    if nccl_identity is None:
        print(f"nccl: nccl_identity.py is not beside nccl_fetch.py in {os.path.dirname(os.path.abspath(__file__))}",
              file=sys.stderr, flush=True)
        return 1
    if already_fetched(args) and _pinned_wheel(args):
        print(f"nccl: already fetched: {args.dest} is libnccl.so.2 {args.version} of {args.record}", flush=True)
        return 0
    try:
        token = None
        if args.token_file:
            with open(args.token_file) as f:
                token = f.read().strip() or None
        fetch(args, token, float(os.environ.get("PROGRESS_EVERY") or 5))
    except Refused as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return exc.status
    except OSError as exc:
        print("nccl: {}: {}".format(exc.filename or "", exc.strerror or exc), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
