"""
The site's lock: every reference the network decides (a model's branch, a build repository's
branch, an image tag, vLLM's ref and pull requests, the NCCL wheel), resolved once where the
network is and written to ``group_data/<cluster>.lock.yaml`` (the ``lock_file`` setting), meant
to be committed. A converge uses its pins and resolves only what it lacks, or an entry whose
reference changed in the site's data; ``--update`` moves pins on purpose:

    python -m sparkinfra lock INVENTORY [--update NAME|all] [--data key=value ...]

resolves on this machine (the controller) what the lock lacks, or what ``--update`` names, and
prints each pin it made and the lock's diff. ``run.start()`` does the same on each cluster's head
(which reaches the Hub through ``hf_endpoint`` and the token, and the registries) before any
operation is planned, so what is staged, the plans, ``status`` and the bench's meta all name the
locked commit.

Entries, by name:

============================  ======================================  =======================
``model``, ``drafter``        the Hub repository's branch or tag      its commit (40 hex)
``lane/<lane>/image``         a lane image given by tag               its digest (sha256:…)
``recipe/<name>``             a recipe's build repository ``ref``     its commit
``recipe/<name>/base``        a dockerfile recipe's ``base`` tag      its digest
``recipe/<name>/vllm``        a dockerfile recipe's ``vllm_ref``      its commit
``recipe/<name>/pr-<n>``      a pull request of ``vllm_prs``          its head commit
``nccl``                      ``nccl_wheel`` ``nccl_version``          the wheel's sha256
============================  ======================================  =======================
"""

from __future__ import annotations

import difflib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from pyinfra import logger
from pyinfra.api import QuoteString, StringCommand

from .. import node
from ..lanes.images import Recipe, images_dir, load_recipe, network_refs, tagged
from ..lanes.mods import mods_folder
from ..lanes.schema import Lane, LaneError, display, find_lane, read_yaml
from ..operations.files import private_folder
from ..settings import Cluster, Settings

COMMIT = re.compile(r"[0-9a-f]{40}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
SHA256 = re.compile(r"[0-9a-f]{64}")
SUFFIX = ".lock.yaml"
ENTRY_KEYS = ("source", "ref", "pin", "resolved")
# What each entry's name says it pins: (name pattern, kind, the pin's form, the form in words)
NAMES = (
    (r"model|drafter", "hub", COMMIT, "a commit (40 hex)"),
    (r"nccl", "wheel", SHA256, "a sha256 (64 hex)"),
    (r"lane/[A-Za-z0-9][\w.-]*/image", "image", DIGEST, "an image digest (sha256: and 64 hex)"),
    (r"recipe/[a-z0-9][a-z0-9._-]*", "git", COMMIT, "a commit (40 hex)"),
    (r"recipe/[a-z0-9][a-z0-9._-]*/base", "image", DIGEST, "an image digest (sha256: and 64 hex)"),
    (r"recipe/[a-z0-9][a-z0-9._-]*/(vllm|pr-[0-9]+)", "git", COMMIT, "a commit (40 hex)"),
)


class LockError(Exception):
    """A lock file that cannot be used, or a reference that cannot be resolved (names file and entry)."""


@dataclass(frozen=True)
class Reference:
    """One reference the network decides: what the lock's entry ``name`` pins."""

    name: str
    kind: str  # hub, git, image, wheel (``node/pin_resolve.py``)
    source: str  # the repository id, git URL, image name, or package index
    ref: str  # the branch, tag, ref or version
    extra: tuple[tuple[str, str], ...] = ()  # what the resolver needs besides (endpoint, project)

    def request(self) -> dict:
        return {"name": self.name, "kind": self.kind, "source": self.source, "ref": self.ref, **dict(self.extra)}

    def __str__(self) -> str:
        sep = "==" if self.kind == "wheel" else ":" if self.kind == "image" else "@"
        source = dict(self.extra).get("project", self.source) if self.kind == "wheel" else self.source
        return f"{source}{sep}{self.ref}"


@dataclass(frozen=True)
class Entry:
    source: str
    ref: str
    pin: str
    resolved: str

    def pins(self, reference: Reference) -> bool:
        """Whether this entry pins ``reference`` as the site names it now."""
        return (self.source, self.ref) == (reference.source, reference.ref)


def kind_of(name: str) -> tuple[str, re.Pattern, str] | None:
    for pattern, kind, form, words in NAMES:
        if re.fullmatch(pattern, name):
            return kind, form, words
    return None


# The references of a cluster
# ---------------------------


def recipe_references(name: str, recipe: Recipe, site_image: str = "") -> list[Reference]:
    """What recipe ``name`` leaves to the network (``images.network_refs``), as references."""
    return [Reference(*ref) for ref in network_refs(name, recipe, site_image)]


def references(cluster: Cluster, lane: Lane | None = None) -> list[Reference]:
    """Every reference of ``cluster`` (and its ``lane``) that only the network can decide."""
    config = cluster.config
    found = []
    for name, repo, revision in (("model", config.model, config.model_revision),
                                 ("drafter", config.drafter, config.drafter_revision)):
        if repo and not COMMIT.fullmatch(revision):
            found.append(Reference(name, "hub", repo, revision, (("endpoint", config.hf_endpoint),)))
    if lane is not None and isinstance(lane.image, str) and (tag := tagged(lane.image)):
        found.append(Reference(f"lane/{lane.name}/image", "image", *tag))
    elif lane is not None and lane.image is not None and not isinstance(lane.image, str):
        name = lane.image.recipe
        found += recipe_references(name, load_recipe(images_dir(lane) / name), config.image)
    if config.nccl_wheel and not config.nccl_library_upload:
        found.append(Reference("nccl", "wheel", config.nccl_index, config.nccl_version,
                               (("project", config.nccl_wheel),)))
    return found


# The file
# --------


def lock_path(cluster: Cluster, inventory_file: str | None, cwd: str | Path) -> Path:
    """The lock file of ``cluster``: its ``lock_file`` setting (from the project root), else
    ``<cluster>.lock.yaml`` in the inventory's ``group_data/`` (the one beside the inventory file if
    it has one, else the project's)."""
    base = Path(cwd)
    if cluster.config.lock_file:
        return base / cluster.config.lock_file
    folder = base / "group_data"
    if inventory_file:
        beside = (base / inventory_file).resolve().parent / "group_data"
        if beside.is_dir() and beside != folder.resolve():
            folder = beside
    return folder / f"{cluster.name}{SUFFIX}"


def cluster_lane(cluster: Cluster, cwd: str | Path | None = None) -> Lane | None:
    return find_lane(cluster.config.lane, project=cwd) if cluster.config.lane else None


def site_lock(cluster: Cluster, lane: Lane | None, inventory_file: str | None,
              cwd: str | Path) -> tuple[Path, list[Reference], dict[str, Entry]]:
    """``cluster``'s lock file, the references of its site's data and ``lane``, and the lock's entries."""
    path = lock_path(cluster, inventory_file, cwd)
    return path, references(cluster, lane), read(path)


def pinned(settings: Settings, inventory_file: str | None, cwd: str | Path) -> Settings:
    """``settings`` as each cluster's lock pins them (``apply``), each cluster knowing its lock
    file. Resolves nothing. Raises ``LockError`` for a lock that cannot be used."""
    clusters = {}
    for name, cluster in settings.clusters.items():
        path, refs, entries = site_lock(cluster, cluster_lane(cluster, cwd), inventory_file, cwd)
        clusters[name] = apply(cluster, pins(refs, entries), path)
    return Settings(clusters=clusters)


def read(path: Path) -> dict[str, Entry]:
    """The entries of lock file ``path`` (none if it does not exist). Raises ``LockError`` naming the
    file, the entry and its line: an unknown entry, a missing or extra key, a pin of the wrong form."""
    if not path.exists():
        return {}
    source = display(path)
    try:
        data, lines = read_yaml(path, source, holds="a lock holds one mapping of entries (model: {source, ref, pin, resolved})")
    except LaneError as exc:
        raise LockError(str(exc)) from None
    if not isinstance(data, dict):
        raise LockError(f"{source}: a lock holds one mapping of entries (model: {{source, ref, pin, resolved}})")
    entries = {}
    for name, value in data.items():
        where = f"{source}:{lines.get((name,), '?')}: entry {name!r}"
        known = kind_of(str(name))
        if known is None:
            raise LockError(f"{where}: not an entry a lock holds (model, drafter, nccl, lane/LANE/image, "
                            "recipe/NAME, recipe/NAME/base, recipe/NAME/vllm, recipe/NAME/pr-N)")
        if not isinstance(value, dict) or sorted(value) != sorted(ENTRY_KEYS):
            have = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise LockError(f"{where}: needs exactly {', '.join(ENTRY_KEYS)} (has {have})")
        if not all(isinstance(value[k], str) and value[k] for k in ENTRY_KEYS):
            raise LockError(f"{where}: {', '.join(ENTRY_KEYS)} are non-empty strings")
        _, form, words = known
        if not form.fullmatch(value["pin"]):
            raise LockError(f"{where}: pin {value['pin']!r} is not {words}; a pin is written by sparkinfra.lock, "
                            "never by hand (python -m sparkinfra lock INVENTORY --update " + str(name) + ")")
        entries[str(name)] = Entry(**{k: value[k] for k in ENTRY_KEYS})
    return entries


def render(cluster_name: str, entries: dict[str, Entry]) -> str:
    """The lock file's text: sorted, one entry per block, diffable."""
    head = (
        f"# The lock of cluster {cluster_name}: what the network decided for each reference of the site's data,\n"
        "# resolved once (sparkinfra.lock). Commit it. Converges use these pins and resolve only what is missing\n"
        "# or whose reference changed; `python -m sparkinfra lock INVENTORY --update NAME` moves a pin on purpose.\n"
    )
    body = {name: {k: getattr(entries[name], k) for k in ENTRY_KEYS} for name in sorted(entries)}
    return head + (yaml.safe_dump(body, sort_keys=False, width=200) if body else "{}\n")


def write(path: Path, cluster_name: str, entries: dict[str, Entry]) -> str:
    """Write the lock (atomically); the unified diff from what was there."""
    old = path.read_text() if path.exists() else ""
    new = render(cluster_name, entries)
    if new != old:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(new)
        os.replace(tmp, path)
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(path), str(path)))


def missing(refs: list[Reference], entries: dict[str, Entry], update: set[str] = frozenset()) -> list[Reference]:
    """The references the lock does not pin as the site names them now (or that ``update`` names)."""
    return [r for r in refs if r.name in update or "all" in update or r.name not in entries
            or not entries[r.name].pins(r)]


def pins(refs: list[Reference], entries: dict[str, Entry]) -> dict[str, str]:
    """name -> pin of every reference the lock pins as the site names it."""
    return {r.name: entries[r.name].pin for r in refs if r.name in entries and entries[r.name].pins(r)}


def apply(cluster: Cluster, found: dict[str, str], path: Path | None = None) -> Cluster:
    """``cluster`` with the pins ``found`` (of its lock file ``path``): the model's and drafter's
    revisions are their locked commits, and ``cluster.pins`` holds every pin (recipes, images,
    NCCL) for the plans."""
    config = cluster.config
    update = {key: found[name] for name, key in (("model", "model_revision"), ("drafter", "drafter_revision"))
              if name in found}
    return cluster.model_copy(update={"config": config.model_copy(update=update), "pins": tuple(sorted(found.items())),
                                      **({"lock_file": str(path)} if path else {})})


# Resolving
# ---------


def parse_results(lines: list[str], refs: list[Reference], where: str) -> tuple[dict[str, Entry], list[str]]:
    """Entries made from ``pin_resolve.py``'s output lines, and what failed (each naming its reference)."""
    by_name = {r.name: r for r in refs}
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    made, failed = {}, []
    for line in lines:
        try:
            result = json.loads(line)
        except ValueError:
            continue
        ref = by_name.get(result.get("name"))
        if ref is None:
            continue
        if "pin" in result:
            known = kind_of(ref.name)
            if known and known[1].fullmatch(str(result["pin"])):
                made[ref.name] = Entry(ref.source, ref.ref, result["pin"], f"{when} on {where} ({result.get('detail')})")
                continue
            result["error"] = f"the answer {result['pin']!r} is not {known[2] if known else 'a pin'}"
        failed.append(f"{ref.name} ({ref}): {result.get('error')}")
    failed += [f"{r.name} ({r}): no answer" for r in refs if r.name not in made and not any(
        f.startswith(f"{r.name} (") for f in failed)]
    return made, failed


def request_json(refs: list[Reference]) -> str:
    return json.dumps([r.request() for r in refs], sort_keys=True)


def resolve_here(refs: list[Reference], token: str = "") -> tuple[dict[str, Entry], list[str]]:
    """Resolve ``refs`` on this machine (``node/pin_resolve.py``, run by this Python)."""
    with tempfile.TemporaryDirectory(prefix="sparkinfra-pins-") as folder:
        request = Path(folder) / "request.json"
        request.write_text(request_json(refs))
        argv = [sys.executable, str(node.DIR / "pin_resolve.py"), str(request)]
        if token:
            token_file = Path(folder) / "token"
            token_file.touch(mode=0o600)
            token_file.write_text(token)
            argv += ["--token-file", str(token_file)]
        done = subprocess.run(argv, capture_output=True, text=True)
    return parse_results(done.stdout.splitlines(), refs, os.uname().nodename)


def resolve_on(host, refs: list[Reference], token: str = "") -> tuple[dict[str, Entry], list[str]]:
    """Resolve ``refs`` on pyinfra ``host`` (a connected head) over its connection: the resolver and
    its request in a folder only the SSH user can enter, the token in a file there, removed after."""
    with private_folder(host) as folder:
        if not folder:
            return {}, [f"{r.name} ({r}): cannot make a private folder on {host.name}" for r in refs]
        for name in ("pin_resolve.py", "nccl_fetch.py"):
            host.put_file(str(node.DIR / name), f"{folder}/{name}", _sudo=False)  # at a run's start: nothing placed yet
        host.put_file(io.StringIO(request_json(refs)), f"{folder}/request.json", _sudo=False)
        argv = ["python3", f"{folder}/pin_resolve.py", f"{folder}/request.json"]
        if token:
            host.put_file(io.StringIO(token), f"{folder}/token", _sudo=False)
            argv += ["--token-file", f"{folder}/token"]
        _, output = host.run_shell_command(StringCommand(*(QuoteString(a) for a in argv)), _sudo=True)
    return parse_results(output.stdout_lines, refs, host.name)


def settle(state, settings: Settings, inventory_file: str | None, cwd: str | Path, dry: bool = False) -> Settings:
    """
    The run's settings as the locks pin them, after resolving on each cluster's head what a lock
    lacks (or pins for another reference than the site's data names now) and writing it there,
    each pin made printed. A dry run resolves but writes nothing. Raises ``LockError`` naming each
    reference the head could not resolve and how to lock it from a machine that can.
    """
    clusters = {}
    for name, cluster in settings.clusters.items():
        lane = cluster_lane(cluster, cwd)
        path, refs, entries = site_lock(cluster, lane, inventory_file, cwd)
        wanted = missing(refs, entries)
        head = state.inventory.get_host(cluster.head.name)
        if wanted and head.connected:  # an unreachable head: pyinfra reports it; the lock is used as it is
            token = os.environ.get(cluster.config.hf_token_env, "")
            made, failed = resolve_on(head, wanted, token)
            failed = token_hints(failed, cluster.config.hf_token_env, token)
            if failed:
                raise LockError(
                    f"{cluster.name}: not locked, and {head.name} could not resolve: " + "; ".join(failed)
                    + f". {how_to_lock(inventory_file, path)}; nothing was changed"
                )
            for entry_name, entry in made.items():
                was = entries.get(entry_name)
                moved = f" (the lock had {was.source} {was.ref} -> {was.pin})" if was else ""
                logger.info(f"--> lock: {cluster.name}: pinned {describe(entry_name, entry)}{moved}"
                            + (" (dry run: not written)" if dry else ""))
            entries = {**entries, **made}
            if not dry:
                write(path, cluster.name, entries)
        cluster = apply(cluster, pins(refs, entries), path)
        if lane is not None and lane.mods_from == "image":
            mods_folder(lane, dict(cluster.pins), fetch=True)  # the controller's copy of the build repository
        clusters[name] = cluster
    return Settings(clusters=clusters)


def reference_lines(refs: list[Reference], entries: dict[str, Entry], path: Path, inventory_file: str | None) -> list[str]:
    """What ``lanes show`` says of each reference: its locked pin, or that the first converge resolves
    it where the network is (no pin is ever made up here)."""
    if not refs:
        return [f"lock {display(path)}: nothing is left to the network (every reference is a commit or a digest)"]
    out = [f"lock {display(path)}:"]
    for ref in refs:
        entry = entries.get(ref.name)
        if entry is not None and entry.pins(ref):
            out.append(f"  {ref.name} {ref}: {entry.pin} (resolved {entry.resolved})")
        else:
            was = f" (the lock pins {entry.source} {entry.ref})" if entry is not None else ""
            out.append(f"  {ref.name} {ref}: not locked{was}; the first converge resolves it on the head "
                       f"(or: python -m sparkinfra lock {inventory_file or 'INVENTORY'})")
    return out


def token_hints(failed: list[str], token_env: str, token: str) -> list[str]:
    """Each failure the Hub answered 401 or 403 (a gated or private model) with which token went, and
    from which variable (``hf_token_env``): the cause is the controller's shell, not the network."""
    hint = (f"sent the token from {token_env}: the Hub refuses it, or the model is gated and that account has "
            "not accepted its terms"
            if token else f"sent no token: {token_env} (hf_token_env) is unset or empty in this shell; export it")
    return [f"{problem} ({hint})" if "/api/models/" in problem and re.search(r": HTTP 40[13]\b", problem) else problem
            for problem in failed]


def how_to_lock(inventory_file: str | None, path: Path) -> str:
    return (f"lock it from any machine that reaches it: python -m sparkinfra lock {inventory_file or 'INVENTORY'} "
            f"(then commit {display(path)})")


def describe(name: str, entry: Entry) -> str:
    return f"{name}: {entry.source} {entry.ref} -> {entry.pin}"
