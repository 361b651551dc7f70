"""
A lane's known good sets (stdlib only). The head promotes a lane that served and passed its canary:
every node keeps its rank's placed files as they were then (``paths.lane_set_paths``: unit, plan,
env files, the head's validated mark and check request, mods) under ``KNOWN_GOOD/<n>/files/``
(their paths mirrored), with ``meta.json``: what ran (lane, plan digest, image and its ID, mods),
when and why it was promoted, and the canary's numbers (the next change's baseline). The newest
``keep`` sets stay, so the one before the current is there to return to: a start that fails, a
canary that fails and an operator's rollback all go back to one (``roll_back``), every rank's
journal of what was left kept, and the plan left marked rejected (``paths.rejected_path``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import lane_history, lane_io, paths, platform_facts
from .plan import RunnerPlan

ROOT = paths.KNOWN_GOOD
META = "meta.json"


def entries(root: str | None = None) -> list[dict]:
    """Every known good set kept on this node, oldest first (a set without a readable meta is skipped)."""
    found = []
    for folder in Path(root or ROOT).glob("*"):
        if not folder.name.isdigit():
            continue  # a set being written (``.N.tmp``)
        try:
            meta = json.loads((folder / META).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("number") == int(folder.name):
            found.append(meta)
    return sorted(found, key=lambda m: m["number"])


def keep(p: RunnerPlan, number: int, why: str, count: int, sources: list[str] | None = None,
         root: str | None = None, canary: dict | None = None) -> dict:
    """
    Keep this node's rank of ``p`` as known good set ``number``: each of ``sources`` (the lane's
    placed files, ``paths.lane_set_paths``) that exists, copied under ``<number>/files/`` with its
    path, and ``meta.json`` (``canary``: the numbers it was promoted with); written beside, then
    renamed into place. Then only the newest ``count`` sets stay. The set's meta.
    """
    base = Path(root or ROOT)
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o700)  # the sets hold the lanes' env files (and the head's API key file)
    folder, temp = base / str(number), base / f".{number}.tmp"
    shutil.rmtree(temp, ignore_errors=True)
    (temp / "files").mkdir(parents=True)
    kept = []
    for source in sources if sources is not None else paths.lane_set_paths(p.lane):
        src = Path(source)
        if not src.exists():
            continue
        _copy(src, temp / "files" / source.lstrip("/"))
        kept.append(source)
    meta = {
        "number": number, "lane": p.lane, "digest": p.digest, "rank": p.rank, "image": p.image,
        "image_id": lane_io.image_id(p.image), "mods": [{"name": m.name, "sha256": m.sha256} for m in p.mods],
        "at": round(time.time(), 1), "why": why[:500], "files": kept, "canary": canary,
        "platform": platform_facts.read(),  # what ran beneath it: status and preflight say what changed since
    }
    (temp / META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(temp, folder)
    for old in [m["number"] for m in entries(str(base))][:-count]:
        shutil.rmtree(base / str(old), ignore_errors=True)
    return meta


def _copy(src: Path, dest: Path) -> None:
    """``src`` (a file, or a folder with its links as links) copied to ``dest``, a folder there replaced whole."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest, symlinks=True)
    else:
        shutil.copy2(src, dest)


def summary(meta: dict) -> dict:
    """What ``status`` shows of a set (and a converge reads: the canary is the next one's baseline)."""
    return {k: meta.get(k) for k in ("number", "lane", "digest", "image", "at", "why", "canary")}


def status(p: RunnerPlan, running: str | None) -> dict:
    """What the head's ``lane_ctl status`` says of the sets: each one's ``summary`` (``known``), the
    lane's ``rejected`` mark, and ``rollback_to``: the set a rollback by hand from the plan running
    (``running``, else ``p``'s) returns to by default (``rollback_target``)."""
    kept = entries()
    target = rollback_target(p.replace(digest=running or p.digest), kept=kept)
    return {"known": [summary(m) for m in kept], "rejected": rejected(p.lane),
            "rollback_to": target["number"] if target else None}


def promote(p: RunnerPlan, path: str, why: str, count: int, canary: dict | None = None) -> int:
    """
    The head: the lane as it runs now (``p``, the plan at ``path`` on every node) becomes the next
    known good set, kept by every worker first, then here (with ``canary``, its numbers); the
    promotion goes to the history, and the lane's rejected mark goes. A lane already the newest
    set is left as it is. The exit status.
    """
    started = lane_io.mark(p, "started")
    running = json.loads(started.read_text()).get("digest") if started.exists() else None
    serving, detail = lane_io.completion(p, timeout=60) if running == p.digest else (False, "")
    if not serving:
        print(f"lane {p.lane}: not promoted: it does not serve plan {p.digest} "
              f"({'it runs ' + str(running) if running != p.digest else detail})", file=sys.stderr, flush=True)
        return 1
    known = entries()
    if known and known[-1]["lane"] == p.lane and known[-1]["digest"] == p.digest:
        print(f"lane {p.lane}: plan {p.digest} is known good #{known[-1]['number']} already", flush=True)
        return 0
    number = known[-1]["number"] + 1 if known else 1
    # A set is known good once every node holds it: the workers first, at once.
    outs = lane_io.on_workers(p.workers, *lane_io.here("keep", path, str(number), str(count), why), timeout=120)
    failed = [(w, out) for w, out in zip(p.workers, outs) if out.returncode != 0]
    for worker, out in failed:
        lane_io.say(f"rank {worker.rank} on {worker.ip} did not keep known good #{number}: "
                    f"{lane_io.worker_failure(out)}")
    if failed:
        return 1
    meta = keep(p, number, why, count, canary=canary)
    lane_history.record(p, "promote", why, number=number, **({"canary": canary} if canary else {}))
    Path(paths.rejected_path(p.lane)).unlink(missing_ok=True)
    print(f"lane {p.lane}: plan {p.digest} (image {meta['image']}) is known good #{number} on every node: {why}",
          flush=True)
    return 0


FAILED_KEPT = 5  # the newest failed starts' logs kept


def restore(number: int, root: str | None = None) -> dict:
    """Put known good set ``number``'s files back where they were on this node (folders replaced
    whole), then have systemd read the units again. The set's meta."""
    folder = Path(root or ROOT) / str(number)
    meta = json.loads((folder / META).read_text())
    for dest in meta["files"]:
        _copy(folder / "files" / dest.lstrip("/"), Path(dest))
    lane_io.sh("systemctl", "daemon-reload")
    return meta


def keep_failed_logs(p: RunnerPlan, root: str | None = None) -> Path:
    """Every rank's journal of the lane's last start (the head's unit and each worker's), in a new
    root-only folder; the newest ``FAILED_KEPT`` such folders stay."""
    base = Path(root or paths.FAILED_STARTS)
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o700)
    folder = base / f"{p.lane}-{time.strftime('%Y%m%dT%H%M%S')}"
    folder.mkdir(exist_ok=True)
    journal = ("journalctl", "-u", p.unit, "-n", "400", "--no-pager", "-o", "short-precise")
    (folder / "rank0.log").write_text(lane_io.sh(*journal).stdout)
    for worker, out in zip(p.workers, lane_io.on_workers(p.workers, *journal)):
        (folder / f"rank{worker.rank}.log").write_text(out.stdout or lane_io.ssh_error(out))
    for old in sorted(d for d in base.iterdir() if d.is_dir() and d.name.startswith(f"{p.lane}-"))[:-FAILED_KEPT]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def rollback_target(p: RunnerPlan, number: int | None = None, kept: list[dict] | None = None) -> dict | None:
    """Set ``number`` (None: the newest set that is neither ``p`` itself, its lane and plan, nor a
    plan a rollback turned away): what a rollback from ``p`` returns to. ``kept``: ``entries()``,
    when read already."""
    kept = entries() if kept is None else kept
    if number is not None:
        return next((m for m in kept if m["number"] == number), None)
    turned = {(lane, (rejected(lane) or {}).get("digest")) for lane in {m["lane"] for m in kept}}
    return next((m for m in reversed(kept) if (m["lane"], m["digest"]) != (p.lane, p.digest)
                 and (m["lane"], m["digest"]) not in turned), None)


def start_failure(p: RunnerPlan) -> str:
    """Why lane ``p``'s last start failed, from the history (its last failed stop)."""
    why = next((e["why"] for e in reversed(lane_history.events(p, 20)) if e.get("event") == "stop"
                and e.get("failed")), "it did not get ready")
    return f"did not start ({why})"


def reject(p: RunnerPlan, why: str, number: int | None) -> None:
    """Mark plan ``p`` turned away by a rollback (``paths.rejected_path``): a converge that would
    start it again refuses until the settings change or ``retry_rejected`` is given."""
    mark = {"digest": p.digest, "why": why[:500], "at": round(time.time(), 1), "number": number}
    lane_io.write_private(Path(paths.rejected_path(p.lane)), json.dumps(mark, sort_keys=True))


def rejected(lane: str) -> dict | None:
    """The lane's rejected mark (None: none)."""
    try:
        return json.loads(Path(paths.rejected_path(lane)).read_text())
    except (OSError, ValueError):
        return None


def roll_back(p: RunnerPlan, path: str, start: Callable[[str, str], bool], failed: str,
              number: int | None = None) -> bool:
    """
    Lane ``p`` (its plan at ``path``) is left: ``failed`` says why ("did not start (...)", "failed
    its canary: ...", "was rolled back by hand"). Every rank's journal of it kept, the lane stopped
    (and, when the set is another lane, disabled) on every node, known good set ``number`` (None:
    the newest of another plan) restored on every node (workers first) and started with
    ``start(plan, why)`` (True: it serves); plan ``p`` marked rejected. Says what failed, what serves
    now, how long after the rollback began it answered, and where the logs are. Whether the set serves.
    """
    began = time.monotonic()
    logs = keep_failed_logs(p)
    target = rollback_target(p, number)
    if target is None:
        which = f"no known good set #{number}" if number is not None else "no known good set to return to"
        print(f"lane {p.lane}: plan {p.digest} {failed}; {which}; every rank's journal: {logs}",
              file=sys.stderr, flush=True)
        return False
    number, lane = target["number"], target["lane"]
    lane_history.note_stop(p, f"it {failed}: rolled back to known good #{number}")
    lane_io.sh("systemctl", "stop", p.unit, timeout=300)  # its post stops the workers
    lane_io.sh("systemctl", "reset-failed", p.unit)
    lane_io.on_workers(p.workers, "systemctl", "reset-failed", p.unit)
    if lane != p.lane:  # the left lane stays placed (the settings name it) but starts at no boot
        lane_io.sh("systemctl", "disable", p.unit)
    outs = lane_io.on_workers(p.workers, *lane_io.here("restore", path, str(number)), timeout=120)
    lost = [f"rank {w.rank} on {w.ip}: {lane_io.worker_failure(o, 200)}" for w, o in zip(p.workers, outs)
            if o.returncode != 0]
    if lost:
        print(f"lane {p.lane}: plan {p.digest} {failed}; known good #{number} could not be put back: "
              f"{'; '.join(lost)}; every rank's journal: {logs}", file=sys.stderr, flush=True)
        return False
    restore(number)
    reject(p, f"it {failed}", number)
    back = paths.plan_path(lane)
    q = lane_io.plan(back)
    lane_io.sh("systemctl", "enable", q.unit)
    lane_io.mark(q, "failures").unlink(missing_ok=True)  # a deliberate start: no back-off of the failed one's
    why = f"a rollback to known good #{number}: lane {p.lane}'s plan {p.digest} {failed}"
    lane_history.record(q, "rollback", why, number=number, left=p.digest, logs=str(logs))
    served = start(back, why)
    print(f"lane {p.lane}: plan {p.digest} {failed}: rolled back to known good #{number}, "
          f"lane {lane} plan {q.digest}, which " + (f"serves again ({time.monotonic() - began:.0f}s)" if served
                                                    else "did not get ready either")
          + f"; every rank's journal of what was left: {logs}", file=sys.stderr, flush=True)
    return served
