"""
What the three recipe formats share when they become a lane (``eugr``, ``sparkrun``, ``pulse``): the
recipe read from a file or a URL within limits, a ``vllm serve`` command line read into the lane's
settings, the env's references to a launching shell, mods by reference to their repository, and the
account of the import: what each recipe key became (lane key, image recipe, site setting), what
was refused and why. Nothing is dropped silently: a key is mapped, named as unused with its
reason, or refused (``LaneError`` naming the file and the key; ``--drop KEY`` turns a refusal of
that key into a line of the account).
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..settings import HostSettings
from .images import Recipe
from .mods import expand
from .serve_args import command_settings
from .schema import (
    MAX_BYTES,
    PLACEHOLDER_RE,
    PLACEHOLDERS,
    RESERVED,
    Lane,
    LaneError,
    display,
    key_text,
    line_of,
    locate,
    read_yaml,
    validation_error,
)

# The flags sparkinfra renders itself (``RESERVED``) an import turns into the lane's own keys.
_MAPPED = ("model", "tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization", "host", "port",
           "distributed_executor_backend", "speculative_config", "served_model_name")
_PER_RANK = ("data_parallel_rank",)  # not rendered, but never the same on every rank
TOKEN_KEYS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
DEFAULT_TOKEN_ENV = HostSettings.model_fields["hf_token_env"].default
DEFAULT_API_PORT = HostSettings.model_fields["api_port"].default


@dataclass
class Imported:
    """One lane of an imported recipe, with what it needs beside it and the account of the import."""

    lane: Lane
    image: dict[str, Any] | None = None  # images/<lane>/recipe.yaml, when the recipe builds its image
    site: dict[str, str] = field(default_factory=dict)  # site settings (--data key=value)
    notes: list[str] = field(default_factory=list)  # "recipe key -> where", in the recipe's order


@dataclass
class Source:
    """The recipe being imported: its name in messages, its lines, where its repository is, the keys
    the user lets go (``drop``), and the account so far."""

    name: str  # the file or URL, as messages name it
    lines: dict[tuple, int]
    stem: str  # the lane's name
    repository: str | None = None  # the recipe's repository (git URL), when known
    commit: str | None = None  # ... at this commit (a --repo checkout)
    ref: str | None = None  # ... or at this branch or tag (a URL's), which the site's lock pins
    checkout: Path | None = None  # a local checkout (--repo): its mods/ are expanded here
    drop: frozenset[str] = frozenset()
    notes: list[str] = field(default_factory=list)
    site: dict[str, str] = field(default_factory=dict)

    def where(self, key: str) -> str:
        path = tuple(int(p) if p.isdigit() else p for p in key.split(".")) if key else ()
        return locate(self.name, key, line_of(self.lines, path))

    def refuse(self, key: str, message: str):
        raise LaneError(f"{self.where(key)}: {message}")

    def refuse_or_drop(self, key: str, message: str) -> None:
        """Refuse ``key`` unless the user dropped it (``--drop KEY``): then the account says so."""
        if key in self.drop or key.split(".")[0] in self.drop:
            self.note(key, f"DROPPED (--drop): {message}")
            return
        self.refuse(key, f"{message} (--drop {key.split('.')[0]} imports the rest without it)")

    def note(self, key: str, where: str) -> None:
        self.notes.append(f"{key} -> {where}")

    def setting(self, key: str, value: str, recipe_key: str) -> None:
        self.site[key] = value
        self.note(recipe_key, f"site setting {key} (--data {key}={value})")


# Reading a recipe
# ----------------


def _fetch(url: str, folder: Path) -> Path:
    """The recipe at ``url`` (http, https, file) as a file in ``folder``; at most ``MAX_BYTES`` + 1 read."""
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 (the user's URL)
            body = answer.read(MAX_BYTES + 1)
    except (OSError, ValueError) as exc:
        raise LaneError(f"{url}: cannot fetch ({getattr(exc, 'reason', exc)})") from None
    path = folder / "recipe.yaml"
    path.write_bytes(body)
    return path


def github_location(url: str) -> tuple[str, str, str] | None:
    """(raw URL, repository, ref) of a recipe on GitHub (raw.githubusercontent.com/O/R/REF/PATH or
    github.com/O/R/blob/REF/PATH); None for another URL. The ref is the path's first part after
    the repository: a branch with a '/' in its name is not told apart here."""
    parts = urllib.parse.urlsplit(url)
    path = [p for p in parts.path.split("/") if p]
    if parts.netloc == "raw.githubusercontent.com" and len(path) >= 4:
        owner, repo, ref = path[:3]
        return url, f"https://github.com/{owner}/{repo}", ref
    if parts.netloc == "github.com" and len(path) >= 5 and path[2] in ("blob", "raw"):
        owner, repo, _, ref = path[:4]
        raw = f"https://raw.githubusercontent.com/{owner}/{repo}/{ref}/{'/'.join(path[4:])}"
        return raw, f"https://github.com/{owner}/{repo}", ref
    return None


def _git(checkout: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def repository_of(checkout: Path) -> tuple[str, str]:
    """(git URL, commit) of a local checkout: its ``origin`` as an https URL where it is GitHub's
    ssh form, else ``file://`` of the checkout; HEAD's commit."""
    commit = _git(checkout, "rev-parse", "HEAD")
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise LaneError(f"{checkout}: not a git checkout with a commit (--repo takes a clone of the recipe's repository)")
    url = _git(checkout, "remote", "get-url", "origin")
    ssh = re.fullmatch(r"git@([\w.-]+):(.+?)(\.git)?", url)
    if ssh:
        url = f"https://{ssh.group(1)}/{ssh.group(2)}"
    if not re.match(r"(https?://|file:///)\S+$", url):
        url = f"file://{checkout.resolve()}"
    return url, commit


def read_source(location: str, repo: str | None = None, drop: tuple[str, ...] = ()) -> tuple[dict, Source]:
    """The recipe at ``location`` (a file, or an http(s)/file URL) and its ``Source``: a GitHub URL
    names its repository and ref (the lock pins the ref; no commit is made up), ``repo`` (a local
    checkout) its repository and commit."""
    url = re.match(r"(https?|file)://", location) is not None
    with tempfile.TemporaryDirectory(prefix="sparkinfra-recipe-") as tmp:
        github = github_location(location) if url else None
        path = _fetch(github[0] if github else location, Path(tmp)) if url else Path(location)
        name = location if url else display(path)
        data, lines = read_yaml(path, name, holds="a recipe holds one mapping (model, command, defaults...)")
    stem = Path(urllib.parse.urlsplit(location).path if url else location).name
    stem = re.sub(r"\.ya?ml$", "", stem) or "imported"
    source = Source(name=name, lines=lines, stem=stem, drop=frozenset(drop))
    if github:
        source.repository, source.ref = github[1], github[2]
        if re.fullmatch(r"[0-9a-f]{40}", source.ref):
            source.commit, source.ref = source.ref, None
    if repo:
        source.checkout = Path(repo)
        source.repository, source.commit = repository_of(source.checkout)
        source.ref = None
    return data, source


# The environment
# ---------------

# eugr's launcher expands a recipe's env in its shell; what those variables are there, here. The
# token is not a lane's: the head's download reads it from the controller (hf_token_env), and
# serving containers run offline (HF_HUB_OFFLINE=1).
ENV_REFERENCES = {
    "HF_TOKEN": "", "HUGGING_FACE_HUB_TOKEN": "",
    "VLLM_HOST_IP": "{fabric_ip}", "LOCAL_IP": "{fabric_ip}", "NODE_IP": "{fabric_ip}",
    "HEAD_IP": "{head_ip}", "HEAD_NODE_IP": "{head_ip}", "MASTER_ADDR": "{head_ip}",
}
_REFERENCE_RE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def env_reference(text: str) -> str | None:
    """``text`` (an eugr env value with ``$VAR``/``${VAR}``) as a lane's value: each known variable
    mapped (``ENV_REFERENCES``), "" for a value that is only the token (dropped); None when a
    variable is not known."""
    names = [a or b for a, b in _REFERENCE_RE.findall(text)]
    if not names or any(n not in ENV_REFERENCES for n in names) or "$" in _REFERENCE_RE.sub("", text):
        return None
    if all(ENV_REFERENCES[n] == "" for n in names):
        return "" if _REFERENCE_RE.sub("", text).strip() == "" else None
    if any(ENV_REFERENCES[n] == "" for n in names):
        return None
    return _REFERENCE_RE.sub(lambda m: ENV_REFERENCES[m.group(1) or m.group(2)], text)


def lane_env(source: Source, env: dict, prefix: str, shell: str) -> tuple[dict[str, str], dict[str, str]]:
    """(env, nccl_env) of a recipe's env mapping. The token (a token variable's ``$VAR``, or any
    value that is only ``$HF_TOKEN``) becomes the site's ``hf_token_env``; ``shell`` names who
    expands the other ``$VAR`` ("node": eugr's launching shell, whose variables ``ENV_REFERENCES``
    maps; "controller": sparkrun's, which no lane can see): any other is refused by name.
    ``NCCL_*`` variables go to the lane's ``nccl_env`` (over the cluster's NCCL file, not beside it).
    The lane's own placeholders (``{rank}``, ``{fabric_ip}``, ``{head_ip}``: what ``lanes export``
    writes) are kept."""
    out: dict[str, str] = {}
    nccl: dict[str, str] = {}
    for key, value in (env or {}).items():
        key = str(key)
        where = f"{prefix}.{key}"
        text = "" if value is None else (json.dumps(value) if isinstance(value, bool) else str(value))
        for name in PLACEHOLDER_RE.findall(_REFERENCE_RE.sub("", text)):
            if name not in PLACEHOLDERS:
                source.refuse(where, f"{text!r}: unknown placeholder {{{name}}}")
        whole = re.fullmatch(r"\$(?:\{(\w+)\}|(\w+))", text.strip())
        variable = whole and (whole.group(1) or whole.group(2))
        if variable and (key in TOKEN_KEYS or variable in TOKEN_KEYS):
            source.note(where, f"the site's hf_token_env ({variable}: the head's download reads it on the "
                        "controller; serving runs offline, no token in a lane)")
            if variable != DEFAULT_TOKEN_ENV:
                source.setting("hf_token_env", variable, where)
            continue
        if key in TOKEN_KEYS and text:
            source.refuse(where, "a token's value in a recipe: give its variable ($HF_TOKEN), the site reads "
                          "it from the controller's environment (hf_token_env)")
        if "$" in text:
            mapped = env_reference(text) if shell == "node" else None
            if not mapped:
                known = f" (known: {', '.join(sorted(ENV_REFERENCES))})" if shell == "node" else ""
                source.refuse(where, f"{text!r} expands the {'launching shell' if shell == 'node' else 'controller'}"
                              f"'s variable; a lane's values are literal{known}: write its value")
            text = mapped
        if key.startswith("NCCL_"):
            nccl[key] = text
            source.note(where, f"lane nccl_env.{key} (over the cluster's NCCL environment)")
        else:
            out[key] = text
            source.note(where, f"lane env.{key}")
    return out, nccl


# Mods and images by reference
# ----------------------------


def lane_mods(source: Source, mods: list, key: str) -> tuple[list[str], str]:
    """(the lane's ``mods``, ``mods_from``) of a recipe's mods (``mods/NAME``): with a local checkout
    its groups expanded from its ``mods/`` (the image recipe builds that commit); with a repository
    (a URL) by name from it at the ref the lock pins (groups expand at the converge); else by name
    from the project's ``mods/``."""
    names = []
    for i, mod in enumerate(mods or []):
        name = str(mod).removeprefix("mods/").rstrip("/")
        if "/" in name or not name or name in (".", ".."):
            source.refuse(key, f"mod {mod!r} (item {i}): a mod is a folder of mods/ (mods/NAME)")
        names.append(name)
    if not names:
        return [], "project"
    if source.checkout is not None:
        expanded = [m.name for m in expand(source.checkout / "mods", names, source.where(key))]
        source.note(key, f"lane mods {expanded} (groups expanded from {display(source.checkout)}/mods at "
                    f"{source.commit[:12]}), mods_from: image")
        return expanded, "image"
    if source.repository:
        source.note(key, f"lane mods {names} by reference to {source.repository} at {source.ref or source.commit} "
                    "(mods_from: image; groups expand at the converge, from the commit the lock pins)")
        return names, "image"
    source.note(key, f"lane mods {names} by name from the project's mods/ (copy their folders there; "
                "--repo CHECKOUT takes them from the recipe's repository at its commit)")
    return names, "project"


def image_recipe(source: Source, data: dict, key: str) -> dict:
    """``data`` (an image recipe's keys) checked as ``images/<lane>/recipe.yaml``, at the source's
    commit or ref."""
    at = {"commit": source.commit} if source.commit else {"ref": source.ref or "main"}
    data = {k: v for key, value in data.items() for k, v in ((key, value), *(at.items() if key == "repository" else ()))}
    try:
        Recipe.model_validate(data)
    except ValidationError as exc:
        path, message = validation_error(exc, data, Recipe)
        source.refuse(key, f"{message} (image recipe key {key_text(path) or '-'})")
    return data


# The lane
# --------


def command_lane(source: Source, args: list[str], key: str, lane: dict[str, Any]) -> Lane:
    """The lane of ``vllm serve`` arguments ``args`` (from the recipe's ``key``) and the lane keys the
    format gave (``lane``: name, description, image, env, mods, model from the recipe's own key...):
    the flags sparkinfra renders become the lane's keys, the rest its ``serve`` settings."""
    def refuse(message: str):
        source.refuse(key, message)

    model, settings = command_settings(args, refuse)
    named = lane.pop("model", None)
    model = model or settings.pop("model", None) or named
    if not model:
        refuse("no model (vllm serve MODEL)")
    if named and named != model:
        source.refuse("model", f"{named!r} differs from the command's model {model!r}")
    for flag in settings:
        if flag in _PER_RANK or flag in RESERVED and flag not in _MAPPED:
            where = f"from {RESERVED[flag]}" if flag in RESERVED else "per rank"
            refuse(f"--{flag.replace('_', '-')} is set by sparkinfra {where}; remove it")
    tp = settings.pop("tensor_parallel_size", 1)
    pp = settings.pop("pipeline_parallel_size", 1)
    if not isinstance(tp, int) or not isinstance(pp, int):
        refuse("tensor/pipeline parallel sizes must be numbers")
    gmu = settings.pop("gpu_memory_utilization", None)
    if gmu is None:
        refuse("no --gpu-memory-utilization: a lane pins it")
    host = settings.pop("host", "0.0.0.0")
    if host != "0.0.0.0":
        refuse(f"--host {host}: rank 0 serves on 0.0.0.0")
    port = settings.pop("port", None)
    given = settings.get("distributed_executor_backend")
    backend = lane.pop("launch", None) or given or "mp"
    if backend not in ("mp", "ray"):
        refuse(f"--distributed-executor-backend {backend}: lanes launch with mp or ray")
    if given is not None and given != backend:
        refuse(f"--distributed-executor-backend {given} contradicts the recipe's launch ({backend})")
    if backend == "ray":
        settings.pop("distributed_executor_backend", None)  # sparkinfra renders it on the head
    speculative = settings.pop("speculative_config", None)
    drafter = None
    if speculative is not None:
        if not isinstance(speculative, dict):
            refuse("--speculative-config is not a JSON object")
        drafter = speculative.pop("model", None)
    said = f"lane model {model}, nodes {tp * pp} (tensor_parallel {tp} x pipeline_parallel {pp}), launch {backend}, "
    source.note(key, said + f"gpu_memory_utilization {gmu}" + (f", drafter {drafter}" if drafter else ""))
    source.setting("model", model, key)
    if drafter:
        source.setting("drafter", drafter, key)
    served = settings.pop("served_model_name", None)
    if served:
        source.note(key, f"lane served_model_name {served}")
    if settings:
        source.note(key, "lane serve: " + ", ".join(sorted(settings)))
    data = {
        "name": source.stem,
        "model": model,
        "drafter": drafter,
        "nodes": tp * pp,
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
        "launch": backend,
        "served_model_name": served,
        "gpu_memory_utilization": gmu,
        "api_port": port if port != DEFAULT_API_PORT else None,
        "serve": settings,
        "speculative": speculative,
        **lane,
    }
    data = {k: v for k, v in data.items() if v not in (None, [], {}) or k == "serve"}
    try:
        return Lane.model_validate(data)
    except ValidationError as exc:
        lane_path, message = validation_error(exc, data)
        head = str(lane_path[0]) if lane_path else ""
        recipe_key = {"image": "container", "mods": "mods", "env": "env", "nccl_env": "env"}.get(head, key)
        source.refuse(recipe_key, f"{message} (lane key {key_text(lane_path) or '-'})")
