"""
A lane's mods, as eugr's spark-vllm-docker publishes them: a mod is a folder with ``run.sh`` and
its files; a mod group is a folder with ``mod-group.yaml`` (``mods: [name, ...]``) naming other
mods of the same ``mods/`` folder, expanded in order. They come from the project's ``mods/``
(next to the lane's ``lanes/`` folder), or with ``mods_from: image`` from the ``mods/`` folder of
the lane's image recipe's build repository at its locked commit, which the controller fetches
once into its cache (``~/.cache/sparkinfra/repos``; a commit's files never change).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .images import images_dir, load_recipe
from .schema import Lane, LaneError, display, key_text, lane_source, line_of, locate, mods_dir, read_yaml, validation_error

GROUP_FILE = "mod-group.yaml"
RUN_FILE = "run.sh"
MAX_DEPTH = 8  # groups inside groups


class ModsNotFetched(LaneError):
    """The lane's mods are in a build repository not fetched here yet (or not locked yet)."""


class Mod(NamedTuple):
    name: str
    folder: Path  # on the controller


class ModGroup(BaseModel):
    """A ``mod-group.yaml`` (eugr's ``run-recipe.py`` format): the mods it applies, in order, each
    named as a folder of the same ``mods/`` or by its path from the repository's root (``mods/NAME``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    description: str = ""
    mods: list[str] = Field(min_length=1, description="Mods (or groups) of the same mods/ folder, in order.")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparkinfra" / "repos"


def checkout(url: str, commit: str, fetch: bool = True, patches: list[Path] = ()) -> Path:
    """The files of ``url`` at ``commit`` with ``patches`` applied in order (the recipe's, as the
    head's build applies them: a mod they change is the patched one), in the controller's cache,
    fetched once (``fetch``); raises ``ModsNotFetched`` when they are not there and may not be
    fetched, ``LaneError`` when the fetch or a patch fails."""
    patched = hashlib.sha256(b"".join(p.read_bytes() + b"\0" for p in patches)).hexdigest()[:12] if patches else ""
    folder = cache_dir() / hashlib.sha256(url.encode()).hexdigest()[:16] / (f"{commit}-{patched}" if patched else commit)
    if (folder / ".sparkinfra-complete").is_file():
        return folder
    if not fetch:
        raise ModsNotFetched(f"{url} at {commit[:12]} is not fetched on this controller yet (a converge fetches it)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".fetch-") as tmp:
        bare = Path(tmp) / "repo.git"
        git = ["git", "-C", str(bare)]
        env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
        by_commit = git + ["fetch", "-q", "--depth", "1", url, commit]
        every_branch = git + ["fetch", "-q", url, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]
        try:
            subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True, capture_output=True, env=env)
            if subprocess.run(by_commit, capture_output=True, env=env).returncode != 0:
                # A server that does not serve a commit by id (git's dumb HTTP): every branch and tag.
                done = subprocess.run(every_branch, capture_output=True, text=True, env=env)
                if done.returncode != 0:
                    raise LaneError(f"cannot fetch {url}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
            files = Path(tmp) / "files"
            files.mkdir()
            archive = subprocess.run(git + ["archive", "--format=tar", commit], capture_output=True, env=env)
            if archive.returncode != 0:
                raise LaneError(f"{url} has no commit {commit} (was it force-pushed away? update the lock)")
            subprocess.run(["tar", "-x", "-C", str(files)], input=archive.stdout, check=True, capture_output=True)
            for patch in patches:
                applied = subprocess.run(["git", "apply", str(patch)], cwd=files, capture_output=True, text=True, env=env)
                if applied.returncode != 0:
                    raise LaneError(f"patch {display(patch)} does not apply to {url} at {commit[:12]}: "
                                    f"{(applied.stderr.strip().splitlines() or ['failed'])[-1]}")
        except FileNotFoundError:
            raise LaneError(f"git is not installed on this controller: the mods of {url} need it") from None
        (files / ".sparkinfra-complete").write_text(f"{url} {commit}\n")
        if folder.exists():
            shutil.rmtree(folder)
        files.rename(folder)
    return folder


def mods_folder(lane: Lane, pins: Mapping[str, str] | None = None, fetch: bool = False) -> Path:
    """Where ``lane``'s mods are on the controller: the project's ``mods/``, or its image recipe's
    build repository's ``mods/`` at the commit the recipe or the lock pins."""
    if lane.mods_from == "project":
        return mods_dir(lane)
    where = lane_source(lane)
    if lane.image is None or isinstance(lane.image, str):
        raise LaneError(f"{where}: mods_from: image needs an image recipe ({{recipe: NAME}}) with a build repository")
    name = lane.image.recipe
    recipe = load_recipe(images_dir(lane) / name)
    if not recipe.repository:
        raise LaneError(f"{where}: mods_from: image, but image recipe {name!r} is a Dockerfile, not a build repository")
    commit = recipe.commit or (pins or {}).get(f"recipe/{name}")
    if not commit:
        raise ModsNotFetched(f"{where}: the mods are in {recipe.repository} at {recipe.ref}, which the site's lock "
                             f"does not pin yet (the first converge or python -m sparkinfra lock does)")
    folder = images_dir(lane) / name
    return checkout(recipe.repository, commit, fetch, [folder / p for p in recipe.patches]) / "mods"


def expand(folder: Path, names: list[str], where: str, depth: int = 0, trail: tuple[str, ...] = ()) -> list[Mod]:
    """``names`` of ``folder`` as the mods they apply, groups expanded in order."""
    found: list[Mod] = []
    for name in names:
        mod = folder / name
        if "/" in name or name in (".", ".."):
            raise LaneError(f"{where}: mod {name!r}{f' (in group {trail[-1]})' if trail else ''}: a mod is a folder of "
                            f"mods/ (a group names it as NAME or mods/NAME)")
        if name in trail:
            raise LaneError(f"{where}: mod group {' -> '.join(trail + (name,))} names itself")
        if (mod / GROUP_FILE).is_file():
            if depth >= MAX_DEPTH:
                raise LaneError(f"{where}: mod groups nested deeper than {MAX_DEPTH} at {name}")
            members = [m.removeprefix("mods/").rstrip("/") for m in read_group(mod / GROUP_FILE).mods]
            found += expand(folder, members, where, depth + 1, trail + (name,))
        elif (mod / RUN_FILE).is_file():
            found.append(Mod(name, mod))
        else:
            inside = f" (in group {trail[-1]})" if trail else ""
            raise LaneError(f"{where}: mod {name!r}{inside}: no {display(mod)}/{RUN_FILE} or {GROUP_FILE} (a mod is a "
                            f"folder with {RUN_FILE} and its files; a group, a folder with {GROUP_FILE})")
    return found


def read_group(path: Path) -> ModGroup:
    source = display(path)
    data, lines = read_yaml(path, source, holds="a mod group holds one mapping (mods: [name, ...])")
    try:
        return ModGroup.model_validate(data)
    except ValidationError as exc:
        where, message = validation_error(exc, data, ModGroup)
        raise LaneError(f"{locate(source, key_text(where), line_of(lines, where))}: {message}") from None


def lane_mods(lane: Lane, pins: Mapping[str, str] | None = None, fetch: bool = False) -> list[Mod]:
    """The mods ``lane`` applies, in order, each group expanded; one mod named twice is refused
    (its second run would stack on the first, as eugr's launcher warns)."""
    if not lane.mods:
        return []
    where = lane_source(lane)
    mods = expand(mods_folder(lane, pins, fetch), list(lane.mods), where)
    seen = set()
    for mod in mods:
        if mod.name in seen:
            raise LaneError(f"{where}: mod {mod.name!r} is applied twice (groups expanded: "
                            f"{', '.join(m.name for m in mods)})")
        seen.add(mod.name)
    return mods


def mod_files(mod: Mod) -> list[tuple[str, Path]]:
    """(path in the mod's folder, file on the controller) of every file of ``mod``: what the deploy
    places on each node and what ``mod_digest`` hashes."""
    return [(p.relative_to(mod.folder).as_posix(), p) for p in sorted(mod.folder.rglob("*")) if p.is_file()]


def mod_digest(mod: Mod) -> str:
    """sha256 (16 hex) of a mod's files' paths and contents: a changed mod moves the lane's digest."""
    digest = hashlib.sha256()
    for relative, path in mod_files(mod):
        digest.update(f"{relative}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
