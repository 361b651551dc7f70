"""
A lane's restarts (stdlib only): failures in a row counted and backed off, and the head's restart
history, every start, ready and stop with its reason.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from . import lane_io
from .plan import RunnerPlan


BACKOFF_FIRST = 5  # seconds before the start after a first failure (systemd's RestartSec adds its own 5)


BACKOFF_MAX = 120  # ... doubling with each failure in a row, up to this


def note_stop(p: RunnerPlan, why: str) -> None:
    """Keep why the lane is about to stop (``post`` counts it when the stop was a failure)."""
    Path(p.marks_dir).mkdir(parents=True, exist_ok=True)
    lane_io.mark(p, "stop-reason").write_text(why)


def count_stop(p: RunnerPlan, result: str, status: str) -> tuple[str, bool]:
    """After the lane stopped: a failure (``result`` is systemd's ``SERVICE_RESULT``) counted in the
    ``failures`` mark with its reason; a stop that was asked for clears the count. (The stop's
    reason, whether it failed): the ``stop-reason`` mark (consumed), else systemd's words for a
    failure, else '' (a stop asked for that left no reason)."""
    reason_mark = lane_io.mark(p, "stop-reason")
    why = reason_mark.read_text().strip() if reason_mark.exists() else ""
    reason_mark.unlink(missing_ok=True)
    if result in ("", "success"):
        lane_io.mark(p, "failures").unlink(missing_ok=True)
        return why, False
    count = failures(p).get("count", 0) + 1
    why = why or f"rank 0 ended ({result}, status {status or '?'})"
    Path(p.marks_dir).mkdir(parents=True, exist_ok=True)
    lane_io.mark(p, "failures").write_text(json.dumps({"count": count, "reason": why, "at": time.time()}))
    lane_io.say(f"the lane failed ({count} in a row): {why}")
    return why, True


def failures(p: RunnerPlan) -> dict:
    """The ``failures`` mark: ``{count, reason, at}`` of the lane's failed starts and runs in a row."""
    found = lane_io.mark(p, "failures")
    try:
        return json.loads(found.read_text()) if found.exists() else {}
    except ValueError:
        return {}


def backoff(count: int) -> int:
    """Seconds between the ``count``-th failure in a row and the next start: 0, 5, 10, 20, ... 120."""
    return 0 if count <= 0 else min(BACKOFF_FIRST * 2 ** (count - 1), BACKOFF_MAX)


def back_off(p: RunnerPlan) -> None:
    """Before a start after failures in a row: wait out their back-off (counted from the last one)."""
    last = failures(p)
    wait = backoff(last.get("count", 0)) - (time.time() - last.get("at", 0))
    if wait > 0:
        lane_io.say(f"backing off {wait:.0f}s before the next start: {last['count']} failure(s) in a row, "
            f"the last: {last.get('reason', '?')}")
        time.sleep(wait)


HISTORY_MAX = 200  # events kept: the oldest go


BOOT_ID = "/proc/sys/kernel/random/boot_id"  # this boot's id: a start after a reboot is told by it


UPTIME = "/proc/uptime"


BOOT_WINDOW = 300  # seconds after boot within which a first start (no history yet) is the boot's


def boot_id() -> str:
    try:
        return Path(BOOT_ID).read_text().strip()
    except OSError:
        return ""


def uptime() -> float:
    try:
        return float(Path(UPTIME).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("inf")


def events(p: RunnerPlan, last: int = HISTORY_MAX) -> list[dict]:
    """The last ``last`` events of the head's history (none on a worker, or before its first start)."""
    path = p.history
    if not path or last <= 0:
        return []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line no writer of ours left: skipped, not fatal
        if isinstance(event, dict):
            found.append(event)
    return found[-last:]


JOURNALED = ("promote", "rollback")  # events also said in the unit's journal (``sparkinfra logs``)


def record(p: RunnerPlan, event: str, why: str, **extra) -> dict | None:
    """
    Append one event to the head's history (``{"at", "event", "why", "boot", "digest", ...extra}``,
    one JSON line), keeping the last ``HISTORY_MAX``: written whole to a root-only file beside it,
    then renamed over it (a crash never leaves half a history). Workers keep none. Never fails the
    unit: a history that cannot be written is said, and the lane goes on.
    """
    path = p.history
    if not path:
        return None
    entry = {"at": round(time.time(), 1), "event": event, "why": why[:500], "boot": boot_id(),
             "digest": p.digest, **extra}
    if event in JOURNALED:  # systemd says the starts and stops itself
        lane_io.to_journal(p.unit, f"{event} (known good #{extra.get('number')}): {why}")
    kept = [*events(p, HISTORY_MAX - 1), entry]
    target = Path(path)
    temp = target.with_name(target.name + ".new")
    try:
        lane_io.write_private(temp, "".join(json.dumps(e, sort_keys=True) + "\n" for e in kept))
        os.replace(temp, target)
    except OSError as exc:
        lane_io.say(f"the lane's history was not written ({exc})")
        return None
    return entry


def start_reason(p: RunnerPlan) -> str:
    """
    Why the head's unit is starting, the first that holds of:

    - the ``start-reason`` mark a converge left (``restart``): "a converge: WHY" (consumed);
    - the last event recorded, in this boot, is a failed stop: systemd's ``Restart=always`` starts
      it again, "after a failure: <that stop's reason>";
    - the last event was recorded in another boot; or, with no history at all, the node has been up
      less than ``BOOT_WINDOW`` seconds (the unit is enabled at boot, and a converge's first start
      always leaves its mark): "boot (the node restarted)";
    - else nothing of ours started it: "started by hand (systemctl)".
    """
    found = lane_io.mark(p, "start-reason")
    if found.exists():
        why = found.read_text().strip()
        found.unlink(missing_ok=True)
        if why:
            return why
    history = events(p, 1)
    last = history[-1] if history else None
    boot = boot_id()
    if last and last.get("boot") == boot and last.get("event") == "stop" and last.get("failed"):
        return f"after a failure: {last.get('why') or '?'}"
    if (last and last.get("boot") != boot) or (last is None and uptime() < BOOT_WINDOW):
        return "boot (the node restarted)"
    return "started by hand (systemctl)"


def seconds_since_start(p: RunnerPlan, fallback: float) -> int:
    """Seconds since the last start recorded in this boot (else since the monotonic ``fallback``)."""
    start = next((e for e in reversed(events(p, 20)) if e.get("event") == "start"), None)
    if start and start.get("boot") == boot_id() and isinstance(start.get("at"), (int, float)):
        return round(time.time() - start["at"])
    return round(time.monotonic() - fallback)
