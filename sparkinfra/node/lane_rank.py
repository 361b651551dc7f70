"""
A rank's container before and as it runs (stdlib only): the lane's NCCL env file, the libnccl
copies the pin is mounted over, the container check, the compile caches, the page cache, and its
``docker run`` (``docker.rank_run``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from . import docker
from . import lane_io
from .plan import RunnerPlan


def nccl_copies(p: RunnerPlan) -> list[str]:
    """
    Every ``libnccl.so*`` file in this rank's container but the pin itself: the image's own copies
    (pip's nvidia-nccl, the system's) and any in the lane's mounts, listed by ``container_check.py
    --find-nccl`` in a throwaway container of the rank's options. Found once per image ID and
    mounts, kept in the marks: a changed image is searched again. Raises RuntimeError when the
    search fails.
    """
    pin = p.nccl_pin or ""
    if not pin:
        return []
    mounts = [o for i, o in enumerate(p.docker_options) if i and p.docker_options[i - 1] == "-v"]
    key = hashlib.sha256(json.dumps([lane_io.image_id(p.image), mounts, pin]).encode()).hexdigest()[:16]
    kept = lane_io.mark(p, "nccl-copies")
    if kept.exists():
        found = json.loads(kept.read_text())
        if found.get("key") == key:
            return found["paths"]
    write_nccl_env(p)  # the options name it
    done = check_script(p, "find", p.docker_options, "--find-nccl")
    if done.returncode != 0:
        raise RuntimeError(f"listing the libnccl copies of {p.image} failed: {done.stderr.strip()[-300:]}")
    paths = [line for line in done.stdout.splitlines() if line.startswith("/") and line != pin]
    Path(p.marks_dir).mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps({"key": key, "image": p.image, "paths": paths}))
    return paths


def check_script(p: RunnerPlan, purpose: str, options: list[str], *args: str) -> subprocess.CompletedProcess:
    """The node programs' ``container_check ARGS`` in a throwaway container ``<container>-<purpose>``
    of ``options`` and the rank's image (a leftover of that name is removed first)."""
    lane_io.sh("docker", "rm", "-f", f"{p.container}-{purpose}")
    return lane_io.sh(*docker.check_run(p, purpose, options, *args), timeout=300)


def rank_options(p: RunnerPlan) -> list[str]:
    """The rank's ``docker run`` options: the plan's, then the pin mounted read-only over every
    other ``libnccl.so*`` its container holds (``LD_PRELOAD`` reaches only what loads by name).
    The lane's NCCL env file, which the options name, is written first (``write_nccl_env``)."""
    write_nccl_env(p)
    return docker.rank_options(p, nccl_copies(p))


def nccl_env_text(node_text: str, changes: dict, lane: str = "", node: str = "") -> str:
    """
    The node's NCCL env file (``node_text``) with a lane's ``changes``: a variable with a value set
    (on its own line, else appended), one with None removed (every line of it), every other line
    as it is. Lines read as docker's ``--env-file`` reads them (leading blanks skipped; blank and
    ``#`` lines hold no variable).
    """
    out = [f"# Written by lane_ctl.py before each start of lane {lane}: {node or 'the node file'} with the lane's "
           f"nccl_env ({nccl_changes_text(changes)})"]
    done = set()
    for line in node_text.splitlines():
        text = line.lstrip()
        name = text.split("=", 1)[0]
        if not text or text.startswith("#") or name not in changes:
            out.append(line)
        elif changes[name] is not None and name not in done:
            out.append(f"{name}={changes[name]}")
            done.add(name)
    out += [f"{name}={value}" for name, value in changes.items() if value is not None and name not in done]
    return "\n".join(out) + "\n"


def nccl_changes_text(changes: dict) -> str:
    """A lane's NCCL changes in words: ``set A=1, B=2; removed C``."""
    sets = [f"{name}={value}" for name, value in changes.items() if value is not None]
    removed = [name for name, value in changes.items() if value is None]
    said = (["set " + ", ".join(sets)] if sets else []) + (["removed " + ", ".join(removed)] if removed else [])
    return "; ".join(said)


def write_nccl_env(p: RunnerPlan) -> str:
    """
    The NCCL env file of the plan's ``nccl_env`` (a lane that changes the node's): the node's file
    with the lane's changes, written root-only from its first byte (replaced whole: a ``docker run``
    reading it at the same time reads the old or the new); '' without changes (the options name the
    node's file). Raises RuntimeError when the node's file cannot be read (prepare writes it).
    """
    spec = p.nccl_env
    if not spec:
        return ""
    try:
        node_text = Path(spec.node).read_text()
    except OSError as exc:
        raise RuntimeError(f"the node's NCCL environment {spec.node} cannot be read ({exc.strerror}): "
                           "deploys/prepare.py writes it") from None
    target = Path(spec.file)
    part = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        lane_io.write_private(part, nccl_env_text(node_text, spec.changes, p.lane, spec.node))
        os.replace(part, target)
    except OSError as exc:
        raise RuntimeError(f"the lane's NCCL environment {target} cannot be written ({exc.strerror})") from None
    finally:
        part.unlink(missing_ok=True)
    return str(target)


def container_check(p: RunnerPlan) -> tuple[bool, list[str]]:
    """This rank's ``container_check.py`` run in a container of its own options and image: its verdict
    and lines (``container check: PASS|FAIL …``); a Docker daemon that does not answer, said as such."""
    if not lane_io.docker_answers():
        return False, ["container check: FAIL docker: the Docker daemon does not answer on this node "
                       "(systemctl status docker)"]
    try:
        options = rank_options(p)
    except RuntimeError as exc:
        return False, [f"container check: FAIL nccl: {exc}"]
    done = check_script(p, "check", options, *p.container_check.args)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return done.returncode == 0, lines or [f"container check: FAIL docker: exit {done.returncode}"]


DROP_CACHES = "/proc/sys/vm/drop_caches"


SHM = "/dev/shm"
PROC = "/proc"
# What a killed vLLM leaves in /dev/shm: PSM's segments (the CPU build's shared-memory broadcast) and
# Python multiprocessing's named semaphores (``sem.mp-*``), which only their creator unlinks.
STALE_SHM = ("psm_*", "sem.mp-*")


def shm_in_use(proc: str | None = None) -> set[str]:
    """The names in ``SHM`` some live process has mapped or open (``/proc/PID/maps`` and ``fd``):
    a running tenant's, never stale."""
    used = set()
    prefix = SHM.rstrip("/") + "/"
    for pid in Path(proc or PROC).glob("[0-9]*"):
        try:
            for line in (pid / "maps").read_text().splitlines():
                at = line.find(prefix)
                if at >= 0:
                    used.add(line[at + len(prefix):].split()[0])
            for fd in (pid / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(prefix):
                    used.add(target[len(prefix):].split()[0])
        except OSError:  # a process that ended meanwhile, or one we may not read
            continue
    return used


def stale_shm(proc: str | None = None) -> list[Path]:
    """The PSM segments and multiprocessing semaphores in ``SHM`` no live process holds."""
    used = shm_in_use(proc)
    return sorted(f for pattern in STALE_SHM for f in Path(SHM).glob(pattern) if f.name not in used)


def drop_page_cache() -> None:
    os.sync()
    Path(DROP_CACHES).write_text("3\n")


def drop_caches_while_loading(p: RunnerPlan, done: threading.Event) -> None:
    """Drop the page cache every ``every`` seconds until the head's API answers ``until`` (the
    weights are in), the rank's container ends (``done``) or ``at_most`` seconds pass."""
    spec = p.drop_caches
    if not spec:
        return
    lane_io.say(f"page-cache dropper: every {spec.every}s while the weights load, until {spec.until} answers")
    started, drops, why = time.monotonic(), 0, ""
    while not why:
        if done.wait(spec.every):
            why = "the rank's container ended"
        elif lane_io.api_healthy(spec.until):
            why = "the lane is ready"
        elif time.monotonic() - started > spec.at_most:
            why = f"{spec.at_most}s passed"
        else:
            try:
                drop_page_cache()
                drops += 1
            except OSError as exc:
                why = f"cannot drop the page cache: {exc}"
    lane_io.say(f"page-cache dropper: stopped after {time.monotonic() - started:.0f}s and {drops} drops: {why}")


def image_key(p: RunnerPlan) -> str:
    """The short image ID the rank's compile caches are kept under."""
    return docker.cache_key(lane_io.image_id(p.image))


def prepare_compile_cache(p: RunnerPlan, image: str) -> None:
    """Before a start: the folders of the lane's other images removed (a new image starts cold),
    this image's made; says whether the start is warm and with what."""
    spec = p.compile_cache
    if not spec:
        return
    root = Path(spec.root)
    for old in sorted(root.glob("*")) if root.exists() else []:
        if old.name != image and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
            lane_io.say(f"compile caches of image {old.name} removed: a new image starts cold")
    sizes = {}
    for kind in spec.mounts:
        folder = root / image / kind
        folder.mkdir(parents=True, exist_ok=True)
        sizes[kind] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    held = ", ".join(f"{kind} {size / 2**20:.1f} MiB" if size >= 2**20 else f"{kind} {size // 1024} KiB"
                     for kind, size in sizes.items() if size)
    lane_io.say(f"compile caches of image {image}: " + (f"warm ({held})" if held else "cold (nothing compiled yet)"))


def docker_run(p: RunnerPlan, image: str) -> list[str]:
    """The rank's container (``docker.rank_run``): the plan's options, the pin over each copy, the
    compile caches of ``image``. The lane's NCCL env file, which the options name, is written first."""
    write_nccl_env(p)
    return docker.rank_run(p, nccl_copies(p), image)
