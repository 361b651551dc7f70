"""
Image recipes: how a lane's image is made, as data (``images/<name>/recipe.yaml`` next to the
``lanes/`` folder, with the files it builds from). The head builds a recipe once, tags it
``sparkinfra/<name>:<digest>`` (the digest of the recipe and every file in its folder), and the
stage streams it to the workers by image ID; an unchanged recipe builds nothing, a changed one
gets a new tag, so the lane's plan changes and the lane restarts on the new image.

Two kinds, as the seeds build theirs:

- ``dockerfile``: a Dockerfile in the recipe's folder, which is the build context (patches, wheels
  and files beside it); ``base``, ``vllm_ref``, ``vllm_prs``, ``wheels`` and ``build_args`` reach
  it as build arguments (the shape of eugr's ``build-and-copy.sh`` options).
- ``repository``: a build repository at a pinned commit, ``patches`` from the recipe's folder
  applied in order, then its own build ``script`` (seed 001: a3refaat's branch of eugr's
  spark-vllm-docker, two patches, ``./build-deploy.sh``), which makes the image ``produces``.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import re
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..node.paths import IMAGES_DIR
from .schema import Lane, LaneError, _rule, beside_lanes, display, key_text, line_of, locate, read_yaml, validation_error

RECIPE_FILE = "recipe.yaml"
# Each recipe's folder on the head: its files (the build context), and for a repository its checkout
# (``src``, kept with docker's build cache: the next build of a changed recipe reuses both).
NODE_DIR = IMAGES_DIR
TAG_PREFIX = "sparkinfra/"
FILE = r"^\w[\w./+-]*$"  # a file in the recipe's folder (no "..": never outside it)
ARG = r"^[A-Za-z_][A-Za-z0-9_]*$"


class Recipe(BaseModel):
    """
    One image recipe (``images/<name>/recipe.yaml``). Exactly one of ``dockerfile`` and
    ``repository``.
    """

    model_config = ConfigDict(extra="forbid")

    description: str = ""
    # A Dockerfile in this folder; the folder is the build context.
    dockerfile: str | None = Field(None, pattern=FILE, description="The Dockerfile, in the recipe's folder.")
    base: str | None = Field(
        None, min_length=1, description="BASE_IMAGE: the image the Dockerfile starts FROM (pin it by digest).",
    )
    vllm_ref: str | None = Field(
        None, pattern=r"^[\w./-]+$", description="VLLM_REF: vLLM's commit, or a branch or tag the lock pins.",
    )
    vllm_repository: str = Field(
        "https://github.com/vllm-project/vllm.git", pattern=r"^(https?://|file:///)\S+$",
        description="Where vllm_ref and vllm_prs are resolved (the lock pins each PR's head commit).",
    )
    vllm_prs: list[int] = Field(default_factory=list, description="VLLM_PRS: vLLM pull requests applied on top.")
    wheels: list[Annotated[str, Field(pattern=FILE)]] = Field(
        default_factory=list, description="WHEELS: wheel files in the folder to install.")
    build_args: dict[str, str] = Field(default_factory=dict, description="Further build arguments.")
    # Or a build repository at a pinned commit, patched, built by its own script.
    repository: str | None = Field(
        None, pattern=r"^(https?://|file:///)\S+$", description="The build repository's git URL.",
    )
    commit: str | None = Field(None, pattern=r"^[0-9a-f]{40}$", description="The commit to build (40 hex).")
    ref: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][\w./-]*$", description="Or a branch or tag: the site's lock pins its commit "
        "(resolved where the network is, by the first converge or python -m sparkinfra lock).",
    )
    patches: list[Annotated[str, Field(pattern=FILE)]] = Field(
        default_factory=list, description="Patch files in the folder, applied in order.")
    script: list[str] = Field(default_factory=list, description="The build command, run in the checkout.")
    produces: str | None = Field(None, min_length=1, description="The image (name:tag) the script makes.")
    # Filled from the site's lock (``pinned``), never written in a recipe: each PR's head commit.
    pr_commits: list[Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_kind(self) -> Recipe:
        if self.pr_commits:
            raise _rule("filled from the site's lock (each vllm_prs head commit); remove it", "pr_commits")
        if (self.dockerfile is None) == (self.repository is None):
            raise _rule("give either dockerfile (built here) or repository (built by its own script)")
        if self.dockerfile is not None:
            for key in ("commit", "ref", "produces", "patches", "script"):
                if getattr(self, key):
                    raise _rule("only for a repository recipe (a Dockerfile applies its own patches)", key)
        else:
            if (self.commit is None) == (self.ref is None):
                raise _rule("give either commit (40 hex) or ref (a branch or tag the lock pins)", "commit")
            missing = [k for k in ("script", "produces") if not getattr(self, k)]
            if missing:
                raise _rule(f"a repository recipe needs {', '.join(missing)}")
            for key in ("base", "vllm_ref", "vllm_prs", "wheels", "build_args"):  # vllm_repository: a default
                if getattr(self, key):
                    raise _rule("only for a dockerfile recipe (give them to the script)", key)
        for key, values in (("dockerfile", [self.dockerfile or ""]), ("wheels", self.wheels), ("patches", self.patches)):
            for i, relative in enumerate(values):
                if ".." in relative.split("/"):
                    raise _rule(f"{relative!r}: a recipe's files are in its folder (no ..)", key,
                                *([i] if key != "dockerfile" else []))
        for name in self.build_args:
            if not re.fullmatch(ARG, name):
                raise _rule(f"{name!r} is not a build argument name", "build_args")
        return self


class Image(NamedTuple):
    """The image a lane runs: its reference on the nodes, and the recipe that makes it (if any)."""

    ref: str
    recipe: Recipe | None = None
    name: str = ""  # the recipe's name
    folder: Path | None = None  # the recipe's folder on the controller


def images_dir(lane: Lane) -> Path:
    """Where ``lane``'s image recipes are: ``images/`` next to the ``lanes/`` folder it was read from."""
    return beside_lanes(lane, "images")


def load_recipe(folder: Path) -> Recipe:
    """Read and validate ``folder/recipe.yaml``; every file it names must be in ``folder``.

    Raises ``LaneError`` naming the file, the key and the line."""
    path = folder / RECIPE_FILE
    source = display(path)
    if not path.is_file():
        raise LaneError(f"{source}: no such recipe (an image recipe is a folder images/<name>/ with {RECIPE_FILE})")
    data, lines = read_yaml(path, source, holds="an image recipe holds one mapping (dockerfile or repository...)")
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        where, message = validation_error(exc, data, Recipe)
        raise LaneError(f"{locate(source, key_text(where), line_of(lines, where))}: {message}") from None
    named = [(("dockerfile",), recipe.dockerfile)] if recipe.dockerfile else []
    named += [(("wheels", i), w) for i, w in enumerate(recipe.wheels)]
    named += [(("patches", i), p) for i, p in enumerate(recipe.patches)]
    for where, relative in named:
        if not (folder / relative).is_file():
            raise LaneError(
                f"{locate(source, key_text(where), line_of(lines, where))}: no file {relative} in {display(folder)}"
            )
    return recipe


def recipe_files(folder: Path) -> list[tuple[str, Path]]:
    """(path in the recipe's folder, file on the controller) of every file of a recipe: what the
    deploy places on the head and what the digest covers."""
    return [
        (p.relative_to(folder).as_posix(), p) for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    ]


def recipe_digest(folder: Path, recipe: Recipe) -> str:
    """sha256 (16 hex) of the recipe's settings and every file in its folder (paths, contents, the
    executable bit): equal digests, equal images."""
    digest = hashlib.sha256(json.dumps(recipe.model_dump(), sort_keys=True).encode())
    for relative, path in recipe_files(folder):
        mode = "x" if path.stat().st_mode & 0o100 else "-"
        digest.update(f"{relative}\0{mode}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def tagged(image: str) -> tuple[str, str] | None:
    """(name, tag) of an image reference pulled by tag (``latest`` when it names none); None for one
    pinned by digest."""
    if "@" in image:
        return None
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        return image, "latest"
    return name, tag


def by_digest(image: str, digest: str) -> str:
    """``image`` (a tag) as the reference of ``digest`` (``name@sha256:...``)."""
    return f"{(tagged(image) or (image,))[0]}@{digest}"


def network_refs(name: str, recipe: Recipe, site_image: str = "") -> list[tuple[str, str, str, str]]:
    """(lock entry, kind, source, ref) of what recipe ``name`` leaves to the network: its build
    repository's ref, its base's tag (not the site's own ``image``, which the site makes), vLLM's
    branch or tag, and each pull request's head (``sparkinfra.lock`` resolves them, ``pinned``
    applies their pins)."""
    found = []
    if recipe.repository and recipe.ref:
        found.append((f"recipe/{name}", "git", recipe.repository, recipe.ref))
    if recipe.base and recipe.base != site_image and (tag := tagged(recipe.base)):
        found.append((f"recipe/{name}/base", "image", *tag))
    if recipe.vllm_ref and not re.fullmatch(r"[0-9a-f]{40}", recipe.vllm_ref):
        found.append((f"recipe/{name}/vllm", "git", recipe.vllm_repository, recipe.vllm_ref))
    for pr in recipe.vllm_prs:
        found.append((f"recipe/{name}/pr-{pr}", "git", recipe.vllm_repository, f"refs/pull/{pr}/head"))
    return found


def lane_image(lane: Lane, default: str, pins: Mapping[str, str] | None = None) -> Image:
    """The image ``lane`` runs: its recipe's tag (``sparkinfra/<name>:<digest>``, the digest taken
    with the lock's ``pins`` in the recipe), its reference (by the locked digest when given by
    tag), else ``default`` (the cluster's ``image``)."""
    pins = pins or {}
    if isinstance(lane.image, str):
        digest = pins.get(f"lane/{lane.name}/image")
        return Image(by_digest(lane.image, digest) if digest and tagged(lane.image) else lane.image)
    if lane.image is None:
        return Image(default)
    folder = images_dir(lane) / lane.image.recipe
    files = tuple((relative, st.st_size, st.st_mtime_ns, st.st_mode) for relative, p in recipe_files(folder)
                  for st in [p.stat()])
    prefix = f"recipe/{lane.image.recipe}"
    mine = tuple(sorted((k, v) for k, v in pins.items() if k == prefix or k.startswith(prefix + "/")))
    return _recipe_image(lane.image.recipe, folder, files, mine)


@functools.lru_cache(maxsize=16)
def _recipe_image(name: str, folder: Path, files: tuple, pins: tuple) -> Image:
    # Every rank's plan on every host asks for the lane's image: the recipe is read and its files
    # (wheels of hundreds of MB) hashed once per run, again only when a file's stat changes.
    recipe = pinned(load_recipe(folder), name, dict(pins))
    return Image(f"{TAG_PREFIX}{name}:{recipe_digest(folder, recipe)}", recipe, name, folder)


def pinned(recipe: Recipe, name: str, pins: Mapping[str, str]) -> Recipe:
    """``recipe`` as the lock pins its ``network_refs``: its build repository's commit, its base's
    digest, vLLM's commit, and each pull request's head commit (``pr_commits``, once all are
    pinned). Unlocked references stay as they are."""
    update: dict = {}
    if recipe.ref and (commit := pins.get(f"recipe/{name}")):
        update["commit"] = commit
    if recipe.base and tagged(recipe.base) and (digest := pins.get(f"recipe/{name}/base")):
        update["base"] = by_digest(recipe.base, digest)
    if recipe.vllm_ref and (commit := pins.get(f"recipe/{name}/vllm")):
        update["vllm_ref"] = commit
    heads = [pins.get(f"recipe/{name}/pr-{pr}") for pr in recipe.vllm_prs]
    if recipe.vllm_prs and all(heads):
        update["pr_commits"] = heads
    return recipe.model_copy(update=update) if update else recipe


def build_args(recipe: Recipe) -> list[str]:
    """``NAME=value`` of every build argument a dockerfile recipe gives its Dockerfile."""
    named = {
        "BASE_IMAGE": recipe.base,
        "VLLM_REF": recipe.vllm_ref,
        "VLLM_PRS": " ".join(str(pr) for pr in recipe.vllm_prs) or None,
        "VLLM_PR_COMMITS": " ".join(recipe.pr_commits) or None,
        "VLLM_REPOSITORY": recipe.vllm_repository if recipe.vllm_ref or recipe.vllm_prs else None,
        "WHEELS": " ".join(recipe.wheels) or None,
    }
    return [f"{k}={v}" for k, v in {**{k: v for k, v in named.items() if v}, **recipe.build_args}.items()]


def build_command_args(image: Image) -> list[str]:
    """What ``scripts/image_build.sh`` takes after its tarball for ``image``'s recipe: the kind,
    then a Dockerfile and its build arguments, or a repository, commit, the image its script makes,
    the patches (counted) and the script."""
    recipe = image.recipe
    if recipe is None:
        raise ValueError(f"{image.ref} has no recipe")
    if recipe.dockerfile:
        if recipe.vllm_prs and not recipe.pr_commits:
            raise ValueError(f"recipe {image.name}: vllm_prs {recipe.vllm_prs} are not locked (sparkinfra.lock)")
        return ["dockerfile", recipe.dockerfile, *build_args(recipe)]
    if not recipe.commit:
        raise ValueError(f"recipe {image.name}: ref {recipe.ref} is not locked to a commit (sparkinfra.lock)")
    return [
        "repository", str(recipe.repository), str(recipe.commit), str(recipe.produces),
        str(len(recipe.patches)), *recipe.patches, *recipe.script,
    ]


def recipe_tarball(folder: Path) -> bytes:
    """The recipe's files as one tar (sorted, owner root, mtime 0: equal files, equal bytes), what
    the head unpacks as the build's context."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for relative, path in recipe_files(folder):
            info = tarfile.TarInfo(relative)
            data = path.read_bytes()
            info.size, info.mode = len(data), 0o755 if path.stat().st_mode & 0o100 else 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()
