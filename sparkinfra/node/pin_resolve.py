"""
Runs where the network is (a cluster's head, or the controller: stdlib only, python3 >= 3.8;
``nccl_fetch.py`` beside it for wheels): resolve references the network decides to what they
point at now, for the site's lock (``sparkinfra.lock``).

    python3 pin_resolve.py REQUEST.json [--token-file F]

REQUEST.json is a list of ``{"name", "kind", "source", "ref", ...}``:

- ``hub``: a model repository's branch or tag -> its commit (``GET ENDPOINT/api/models/SOURCE/revision/REF``,
  the Hub's model info; ``endpoint``: a mirror, default https://huggingface.co; the token file's
  token as ``Authorization: Bearer``, never printed);
- ``git``: a git repository's branch, tag or ref (``refs/pull/N/head``) -> its commit (``git ls-remote``;
  a tag's commit, not the tag object);
- ``image``: an image reference with a tag -> its manifest digest ``sha256:...``
  (``docker buildx imagetools inspect``; without buildx, ``docker pull`` then the image's repo digest);
- ``wheel``: a package index (``source``: the index URL, ``project``) -> the sha256 of the wheel of
  version ``ref`` for ``machine`` (this one's if empty), as ``nccl_fetch.py`` chooses it.

One JSON line per reference on stdout, in order: ``{"name", "pin", "detail"}``, or ``{"name", "error"}``.
Exit 0 when every reference resolved, 3 otherwise.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

COMMIT = re.compile(r"[0-9a-f]{40}")
TIMEOUT = 60
HUB = "https://huggingface.co"


class Unresolved(Exception):
    """A reference that cannot be resolved here (its message says why)."""


def hub(ref, token):
    endpoint = (ref.get("endpoint") or HUB).rstrip("/")
    url = "{}/api/models/{}/revision/{}".format(endpoint, ref["source"], urllib.parse.quote(ref["ref"], safe=""))
    headers = {"Authorization": "Bearer " + token} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT) as response:
            info = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        code = exc.headers.get("X-Error-Code") or ""
        message = exc.headers.get("X-Error-Message") or exc.reason
        raise Unresolved(f"GET {url}: HTTP {exc.code} {code} {message}".replace("  ", " "))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise Unresolved(f"GET {url}: {getattr(exc, 'reason', exc)}")
    sha = info.get("sha") if isinstance(info, dict) else None
    if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
        raise Unresolved(f"GET {url}: the answer names no commit (sha)")
    return sha, f"{endpoint}"


def _run(argv):
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="/bin/false")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT * 3, env=env)
    except FileNotFoundError:
        raise Unresolved(f"{argv[0]} is not installed here")
    except subprocess.TimeoutExpired:
        raise Unresolved(f"{' '.join(argv[:3])}: no answer in {TIMEOUT * 3} s")
    return done


def ls_remote(output, wanted):
    """The commit ``wanted`` names in ``git ls-remote`` ``output``: a branch, a tag (peeled), or a full ref."""
    refs = {}
    for line in output.splitlines():
        sha, _, name = line.partition("\t")
        if COMMIT.fullmatch(sha):
            refs[name.strip()] = sha
    for name in (f"refs/heads/{wanted}", f"refs/tags/{wanted}^{{}}", f"refs/tags/{wanted}", wanted):
        if name in refs:
            return refs[name]
    return None


def git(ref, token):
    if COMMIT.fullmatch(ref["ref"]):
        return ref["ref"], "a commit"
    done = _run(["git", "ls-remote", ref["source"], ref["ref"], ref["ref"] + "^{}"])  # a tag's commit too
    if done.returncode != 0:
        raise Unresolved(f"git ls-remote {ref['source']}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    sha = ls_remote(done.stdout, ref["ref"])
    if sha is None:
        raise Unresolved(f"{ref['source']} has no branch, tag or ref {ref['ref']!r}")
    return sha, "git ls-remote"


def image(ref, token):
    name = ref["source"] + ":" + ref["ref"]
    done = _run(["docker", "buildx", "imagetools", "inspect", name, "--format", "{{json .Manifest}}"])
    if done.returncode == 0:
        try:
            digest = json.loads(done.stdout).get("digest", "")
        except ValueError:
            digest = ""
        if re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            return digest, "registry manifest"
    pulled = _run(["docker", "pull", "-q", name])
    if pulled.returncode != 0:
        raise Unresolved(f"docker pull {name}: {(pulled.stderr.strip().splitlines() or ['failed'])[-1]}")
    inspect = _run(["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", name])
    try:
        digests = json.loads(inspect.stdout) if inspect.returncode == 0 else []
    except ValueError:
        digests = []
    for repo_digest in digests or []:
        repo, _, digest = repo_digest.partition("@")
        if repo == ref["source"] and re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            return digest, "docker pull"
    raise Unresolved(f"{name} was pulled but docker names no digest of {ref['source']} for it")


def wheel(ref, token):
    try:
        import nccl_fetch
    except ImportError:
        raise Unresolved("nccl_fetch.py is not beside pin_resolve.py")
    machine = ref.get("machine") or os.uname().machine
    try:
        files, page = nccl_fetch.project_page(ref["source"], ref["project"], None)
        name, _, digest = nccl_fetch.choose(files, ref["project"], ref["ref"], machine, page)
    except nccl_fetch.Refused as exc:
        raise Unresolved(str(exc).replace("nccl: ", "", 1))
    if not digest:
        raise Unresolved(f"{page} gives no sha256 for {name}: nothing to lock it by")
    return digest.lower(), f"{name} for {machine}"


KINDS = {"hub": hub, "git": git, "image": image, "wheel": wheel}


def resolve(ref, token):
    """``{"name", "pin", "detail"}`` or ``{"name", "error"}`` for one reference."""
    kind = KINDS.get(ref.get("kind"))
    if kind is None:
        return {"name": ref.get("name"), "error": f"unknown kind {ref.get('kind')!r}"}
    try:
        pin, detail = kind(ref, token)
    except Unresolved as exc:
        return {"name": ref["name"], "error": str(exc)}
    return {"name": ref["name"], "pin": pin, "detail": detail}


def main(argv):
    parser = argparse.ArgumentParser(prog="pin_resolve.py", description="resolve references for a lock")
    parser.add_argument("request")
    parser.add_argument("--token-file")
    args = parser.parse_args(argv)
    with open(args.request) as f:
        refs = json.load(f)
    token = ""
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    failed = False
    for ref in refs:
        result = resolve(ref, token)
        failed = failed or "error" in result
        print(json.dumps(result, sort_keys=True), flush=True)
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
