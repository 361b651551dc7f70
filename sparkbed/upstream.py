"""
What the network decides, as a real site's network would, and what moves it: the hub's model
repository, whose ``main`` an upstream author moves (``hub_move_main`` makes a new revision and
points ``main`` at it, ``hub_reset_main`` puts it back), and the bed's build repository
``sparkbed-build.git`` on the hub's git server (``BUILD_REPO_URL``), in the shape of eugr's
spark-vllm-docker as seed 001 uses it, whose ``main`` ``build_repo_commit`` moves.

The build repository (``make_build_repo``) holds ``build.sh``, ``README.md`` and ``mods/`` from
``sparkbed/build-repo/``, and ``lane/``: the bed's lane image recipe (``images/sparkbed-lane``'s
Dockerfile and rootfs/, copied, so they live in one place). ``build.sh``, run as root on a bed head,
imports the head's image rootfs and builds ``lane/`` on it, tagged ``BUILD_REPO_PRODUCES``.
``mods/``: three eugr-v1 mods (``BUILD_REPO_MODS``; ``sparkbed-greeting-flag`` gives ``vllm serve``
the flag ``--sparkbed-greeting TEXT``) and a mod group (``BUILD_REPO_MOD_GROUP``, its
``mod-group.yaml`` naming them in order). Its first commit has a fixed author and date: the same
files give the same commit id on every bring-up.

``fresh_upstream`` (``up``) puts both as the network has them at first: ``main`` of the tiny model
on ``SIM_REVISION`` (revisions an earlier run made removed), the build repository at its first
commit. These run where the bed's files are (the root namespace or the controller's), never on a node.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .cache import SIM_MODEL, SIM_REVISION, build_tiny_model
from .controller import BUILD_REPO_NAME, GIT_ROOT, HUB_ROOT, LOCKS

BUILD_REPO = GIT_ROOT / BUILD_REPO_NAME
BUILD_REPO_BRANCH = "main"
BUILD_REPO_FILES = Path(__file__).parent / "build-repo"  # build.sh, README.md, mods/
LANE_RECIPE = Path(__file__).resolve().parents[1] / "images" / "sparkbed-lane"  # copied to lane/
BUILD_REPO_PRODUCES = "sparkbed/build-lane:latest"
BUILD_REPO_MODS = ("sparkbed-greeting-flag", "sparkbed-motd", "sparkbed-stamp")
BUILD_REPO_MOD_GROUP = "sparkbed-group"  # mods: [sparkbed-stamp, sparkbed-greeting-flag, sparkbed-motd]
GREETING_FLAG = "--sparkbed-greeting"  # sparkbed-greeting-flag's; a server started with it logs "sparkbed greeting: TEXT"
_IDENTITY = {"GIT_AUTHOR_NAME": "sparkbed", "GIT_AUTHOR_EMAIL": "sparkbed@bed.invalid",
             "GIT_COMMITTER_NAME": "sparkbed", "GIT_COMMITTER_EMAIL": "sparkbed@bed.invalid"}
_FIRST_DATE = "2025-01-01T00:00:00+0000"
_ORIGINAL = ".sparkbed-original"  # in a hub repository's folder: main's revision before the first move
_SHA = re.compile(r"[0-9a-f]{40}")


# The hub's model repository (read here, not through hub.py: ``python -m sparkbed.hub`` would find
# that module imported by the package already)
# ------------------------------------------------------------------------------------------------


def _hub_repo(repo: str) -> Path:
    path = HUB_ROOT / repo
    if not (re.fullmatch(r"[\w.-]+/[\w.-]+", repo) and ".." not in repo and path.is_dir()):
        raise ValueError(f"no repository {repo} on the hub ({HUB_ROOT})")
    return path


def _main(path: Path) -> str:
    """The revision ``main`` names in a hub repository's folder."""
    ref = path / "refs" / "main"
    sha = ref.read_text().strip() if ref.is_file() else ""
    if not (_SHA.fullmatch(sha) and (path / sha).is_dir()):
        raise ValueError(f"{path} has no main on the hub")
    return sha


def _point_main(path: Path, sha: str) -> None:
    (path / "refs").mkdir(exist_ok=True)
    tmp = path / "refs" / ".main.tmp"
    tmp.write_text(sha + "\n")
    tmp.replace(path / "refs" / "main")


def hub_move_main(repo: str = SIM_MODEL) -> str:
    """
    Push a new revision of ``repo`` on the hub, as its author would: ``main``'s files with
    ``README.md`` one line longer (the others linked, not copied), a new 40-hex commit id, and
    ``main`` pointing at it. Each call makes another revision. Returns its id.
    """
    path = _hub_repo(repo)
    current = _main(path)
    if not (path / _ORIGINAL).exists():
        (path / _ORIGINAL).write_text(current + "\n")
    count = sum(1 for child in path.iterdir() if _SHA.fullmatch(child.name))
    readme = path / current / "README.md"
    text = (readme.read_text() if readme.is_file() else "") + f"Revision {count + 1} of {repo}, after {current}.\n"
    sha = hashlib.sha1(f"{repo}\n{current}\n{text}".encode()).hexdigest()
    tmp = path / f".{sha}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for source in sorted((path / current).rglob("*")):
        rel = source.relative_to(path / current)
        if source.is_dir():
            (tmp / rel).mkdir(exist_ok=True)
        elif rel != Path("README.md"):
            (tmp / rel).symlink_to(source.resolve())
    (tmp / "README.md").write_text(text)
    tmp.rename(path / sha)
    _point_main(path, sha)
    return sha


def hub_reset_main(repo: str = SIM_MODEL) -> str:
    """Point ``repo``'s ``main`` back at its revision before the first ``hub_move_main`` (the moved
    revisions stay, as pushed commits do); the revision's id."""
    path = _hub_repo(repo)
    original = path / _ORIGINAL
    sha = original.read_text().strip() if original.exists() else _main(path)
    _point_main(path, sha)
    return sha


def _fresh_hub_model() -> None:
    """The tiny model as the hub first has it: SIM_REVISION alone, ``main`` on it."""
    path = HUB_ROOT / SIM_MODEL
    path.mkdir(parents=True, exist_ok=True)
    for child in path.iterdir():  # what moves left: their revisions, the original's record
        if child.name == SIM_REVISION or child.name == "refs":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    revision = path / SIM_REVISION
    if not revision.exists():
        revision.unlink(missing_ok=True)  # a link to a model made again elsewhere
        revision.symlink_to(build_tiny_model())
    _point_main(path, SIM_REVISION)


# The build repository
# --------------------


def _git(repo: Path, *args: str, data: str | None = None, env: dict | None = None) -> str:
    """``git --git-dir=repo ARGS``, out of any user's or system's git config; its output, stripped."""
    proc = subprocess.run(
        ["git", f"--git-dir={repo}", *args], input=data, capture_output=True, text=True,
        env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, **_IDENTITY, **(env or {})},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {repo}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def build_repo_files() -> dict[str, Path]:
    """The build repository's first commit: ``{path in the repository: file here}``."""
    files = {}
    for top, prefix, paths in (
        (BUILD_REPO_FILES, "", BUILD_REPO_FILES.rglob("*")),
        (LANE_RECIPE, "lane/", [LANE_RECIPE / "Dockerfile", *(LANE_RECIPE / "rootfs").rglob("*")]),
    ):
        for path in paths:
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files[prefix + path.relative_to(top).as_posix()] = path
    return dict(sorted(files.items()))


def _commit(repo: Path, entries: list[tuple[str, str, str]], message: str, parent: str | None,
            env: dict | None = None) -> str:
    """A commit of ``parent``'s tree with ``entries`` (mode, blob, path) added or replaced, on the
    branch; the repository's server info brought up to date (the dumb protocol's files)."""
    with tempfile.TemporaryDirectory() as scratch:
        index = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        if parent:
            _git(repo, "read-tree", parent, env=index)
        _git(repo, "update-index", "--add", "--index-info",
             data="".join(f"{mode} {blob}\t{path}\n" for mode, blob, path in entries), env=index)
        tree = _git(repo, "write-tree", env=index)
    commit = _git(repo, "commit-tree", tree, *(["-p", parent] if parent else []), "-m", message, env=env)
    _git(repo, "update-ref", f"refs/heads/{BUILD_REPO_BRANCH}", commit, *([parent] if parent else []))
    _git(repo, "update-server-info")
    return commit


def make_build_repo(dest: Path | None = None) -> str:
    """(Re)create the bed's build repository, bare, at ``dest`` (``BUILD_REPO``) with one commit on
    ``main`` (fixed author and date); its id."""
    dest = BUILD_REPO if dest is None else dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "--bare", "-b", BUILD_REPO_BRANCH, str(dest)], check=True,
                   env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull})
    files = build_repo_files()
    blobs = _git(dest, "hash-object", "-w", "--no-filters", "--stdin-paths",
                 data="".join(f"{path}\n" for path in files.values())).split()
    entries = [("100755" if source.stat().st_mode & 0o111 else "100644", blob, path)
               for (path, source), blob in zip(files.items(), blobs)]
    return _commit(dest, entries, "The bed's build repository: build.sh, lane/, mods/", None,
                   {"GIT_AUTHOR_DATE": _FIRST_DATE, "GIT_COMMITTER_DATE": _FIRST_DATE})


def build_repo_head(repo: Path | None = None) -> str:
    """The commit the build repository's ``main`` is on."""
    return _git(BUILD_REPO if repo is None else repo, "rev-parse", f"refs/heads/{BUILD_REPO_BRANCH}")


def build_repo_commit(message: str, path: str, content: str, repo: Path | None = None) -> str:
    """Push a commit on the build repository's ``main``, as its maintainer would: ``path`` (in the
    repository) set to ``content`` (its mode kept; a new file 644). Returns its id."""
    repo = BUILD_REPO if repo is None else repo
    head = build_repo_head(repo)
    listed = _git(repo, "ls-tree", head, "--", path)
    mode = listed.split()[0] if listed else "100644"
    blob = _git(repo, "hash-object", "-w", "--stdin", data=content)
    return _commit(repo, [(mode, blob, path)], message, head)


def fresh_upstream() -> str:
    """The hub's repositories as the network has them at bring-up: the tiny model's ``main`` on
    SIM_REVISION, the build repository at its first commit (its id)."""
    if shutil.which("git") is None:
        raise SystemExit("the bed's build repository and the hub's git server need git here: apt-get install git")
    _fresh_hub_model()
    shutil.rmtree(LOCKS, ignore_errors=True)  # pins of an earlier bring-up's upstream
    return make_build_repo()
