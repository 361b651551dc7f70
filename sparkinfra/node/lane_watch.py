"""
The running lane (stdlib only): the head's watch of its workers and API, a worker's watch of rank
0's rendezvous, the lane's stops, a start's phases read from vLLM's lines, the warm-up.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from . import lane_history, lane_io
from .plan import RunnerPlan


def stop_other_lanes(p: RunnerPlan, why: str = "") -> None:
    """Stop every other lane's units, here and on the workers; each one stopped here is left ``why``
    (default: "lane <this> starts") as its stop's reason, which its ``post`` records."""
    others = lane_io.other_lane_units(p)
    if others:
        lane_io.say(f"stopping other lanes here: {' '.join(others)}")
        for unit in others:
            other = lane_io.lane_of_unit(p, unit)
            if other:
                lane_history.note_stop(p.replace(lane=other), why or f"lane {p.lane} starts")
        lane_io.sh("systemctl", "stop", *others, timeout=300)
    for worker in p.workers:
        listed = lane_io.on_worker(worker.ip, "systemctl", "list-units", "--plain", "--no-legend",
                           "--state=active,activating", p.lane_units).stdout
        stale = [line.split()[0] for line in listed.splitlines() if line.strip()
                 and line.split()[0] != p.unit]
        if stale:
            lane_io.say(f"stopping other lanes on {worker.ip}: {' '.join(stale)}")
            lane_io.on_worker(worker.ip, "systemctl", "stop", *stale, timeout=300)


def stop_workers(p: RunnerPlan, path: str) -> None:
    """Stop every worker's unit of the lane, all at once; says which stopped (one already down is
    not "stopped") and which could not be reached (it stops itself: ``watch_rendezvous``)."""
    results = lane_io.on_workers(p.workers, *lane_io.here("stop", path), timeout=300)
    for worker, result in zip(p.workers, results):
        where = f"rank {worker.rank} on {worker.ip}"
        if not lane_io.reached(result):
            lane_io.say(f"{where} not reached to stop it ({lane_io.ssh_error(result)}): it stops itself once rank 0's "
                f"rendezvous is gone for {p.head_lost_timeout}s")
        elif result.returncode != 0:
            lane_io.say(f"{where} did not stop: {(result.stdout + result.stderr).strip()[-300:]}")
        elif result.stdout.strip() == "stopped":
            lane_io.say(f"stopped {where}")


def exit_status(code: int) -> int:
    return 128 - code if code < 0 else code  # killed by a signal: as a shell reports it


def stop_container(p: RunnerPlan, child: subprocess.Popen) -> None:
    lane_io.sh("docker", "stop", "-t", str(p.stop_seconds), p.container, timeout=p.stop_seconds + 60)
    child.wait()


def tcp_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(3)
        return s.connect_ex((host, port)) == 0


def watch_rendezvous(p: RunnerPlan, child: subprocess.Popen) -> int:
    """
    A worker rank's container ``child`` until it ends; stopped by this rank itself once rank 0's
    rendezvous (the port every rank joined through) stopped answering for ``head_lost_timeout``
    seconds, or never answered within ``start_timeout``: a worker the head could not stop (its
    fabric or SSH down) does not outlive its lane. The unit's exit status.
    """
    spec = p.rendezvous
    if not spec:
        return exit_status(child.wait())
    where = f"rank 0's rendezvous {spec.host}:{spec.port}"
    started, seen, lost = time.monotonic(), None, None
    while True:
        try:
            return exit_status(child.wait(timeout=p.watch_interval))
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if tcp_open(spec.host, spec.port):
            if lost is not None:
                lane_io.say(f"{where} answers again after {now - lost:.0f}s")
            seen, lost = now, None
            continue
        if seen is None:
            if now - started >= p.start_timeout:
                reason = f"{where} did not answer within {p.start_timeout}s"
                break
            continue
        if lost is None:
            lost = now
            lane_io.say(f"{where} stopped answering: this rank stops itself if it is gone for {p.head_lost_timeout}s")
        if now - lost >= p.head_lost_timeout:
            reason = f"{where} has been gone for {now - lost:.0f}s"
            break
    lane_io.say(f"{reason}: stopping this rank (no worker outlives its lane; rank 0 starts it again)")
    stop_container(p, child)
    return 1


def worker_states(p: RunnerPlan) -> tuple[list[dict], dict[str, str]]:
    """Every worker's unit, asked at once: (the workers reached whose unit is not active,
    {ip: why} of the workers not reached)."""
    results = lane_io.on_workers(p.workers, "systemctl", "is-active", p.unit, timeout=20)
    down = [w for w, r in zip(p.workers, results) if lane_io.reached(r) and r.stdout.strip() != "active"]
    lost = {w.ip: lane_io.ssh_error(r) for w, r in zip(p.workers, results) if not lane_io.reached(r)}
    return down, lost


def watch_head(p: RunnerPlan, path: str, child: subprocess.Popen) -> int:
    """
    Rank 0's container ``child`` until it ends, is stopped, a worker's unit is not running, or the
    API stops completing; then the container and every worker stopped. A worker the head cannot
    reach is not taken for a dead one: while the API completes (asked every watch while any worker
    is lost) the lane serves on, for at most ``unreachable_grace`` seconds. The unit's exit status.
    """
    stopping = []

    def _stop(signum, frame):
        stopping.append(signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    started, ready, failed, last_live = time.monotonic(), False, 0, 0.0
    lost_since: dict[str, float] = {}
    ranks = {w.ip: w.rank for w in p.workers}
    reason = ""
    while not stopping:
        try:
            code = child.wait(timeout=p.watch_interval)
            if stopping:
                break
            reason = f"rank 0 container exited with status {code}"
            lane_io.say(reason)
            lane_history.note_stop(p, reason)  # post stops the workers
            return code or 1  # exit 0 after a dead worker still means "not serving"
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if now - started < p.watch_grace:
            continue
        down, lost = worker_states(p)
        if down and lane_io.mark(p, "stop-reason").exists():
            # A stopper (a teardown, another lane, a converge's restart) left its reason here before
            # stopping the lane's units on every node at once: a worker that stopped first is its
            # doing, not a failure; the stop records the stopper's reason.
            stopper = lane_io.mark(p, "stop-reason").read_text().strip()
            lane_io.say(f"rank {', '.join(str(w.rank) for w in down)} stopped: {stopper}")
            stopping.append("asked")
            break
        if down:
            reason = "rank " + ", ".join(f"{w.rank} on {w.ip}" for w in down) + " is not running"
            break
        for ip, why in lost.items():
            if ip not in lost_since:
                lost_since[ip] = now
                lane_io.say(f"rank {ranks[ip]} on {ip} not reached ({why}): the lane serves on while its API completes, "
                    f"for at most {p.unreachable_grace}s")
        for ip in [ip for ip in lost_since if ip not in lost]:
            lane_io.say(f"rank {ranks[ip]} on {ip} reached again after {now - lost_since.pop(ip):.0f}s")
        overdue = [ip for ip, since in lost_since.items() if now - since >= p.unreachable_grace]
        if overdue:
            reason = ", ".join(f"rank {ranks[ip]} on {ip}" for ip in overdue) + (
                f" not reached for {p.unreachable_grace}s ({lost[overdue[0]]})")
            break
        if not ready:
            ready = lane_io.request(p, "/health", timeout=5)[0] == 200
            if ready:
                lane_io.mark(p, "failures").unlink(missing_ok=True)  # serving: the next failure backs off from zero
                lane_history.record(p, "ready", "its API answers /health", seconds=lane_history.seconds_since_start(p, started))
                warm(p)  # after any (re)start, also one nobody asked for: JIT costs stay out of use
            continue
        # At once again after a failed completion: a wedged engine is told within the interval,
        # two timeouts and a watch (``serving.wedge_bound``), not two intervals.
        if lost_since or failed or now - last_live >= p.liveness_interval:
            ok, detail = lane_io.completion(p, timeout=p.liveness_timeout)
            last_live = time.monotonic()
            failed = 0 if ok else failed + 1
            if failed >= 2:
                reason = f"the API stopped completing ({detail})"
                if lost_since:
                    reason += " while " + ", ".join(f"rank {ranks[ip]} on {ip}" for ip in lost_since) + " is not reached"
                break
    if reason:
        lane_io.say(f"{reason}: restarting the lane on every node")
        lane_history.note_stop(p, reason)
    # The workers stop while rank 0 does (each engine's shutdown takes seconds); post finds them stopped.
    workers = threading.Thread(target=stop_workers, args=(p, path))
    workers.start()
    stop_container(p, child)
    workers.join()
    return 0 if stopping and not reason else 1


# A start's phases, named from vLLM's own lines (the patterns of ``sparkinfra/vllm_log.py``; each one
# matches a line of the real logs in tests/unit/fixtures/vllm_logs/, which the unit tests check).
# In the order a start goes through them: a later phase's line moves the phase on, never back.
PHASES = (
    ("starting the engine", (r"Initializing an? (?:V\d )?LLM engine",)),
    ("loading weights", (r"Starting to load model", r"Loading safetensors checkpoint shards")),
    ("compiling (torch.compile), profiling memory", (r"Loading weights took", r"Model loading took")),
    ("KV cache sized: warming up (graph capture on a GPU)", (r"Available KV cache memory", r"KV cache size: [\d,]+ tokens",
                                            r"GiB for KV cache on node")),
    ("starting the API server", (r"Graph capturing finished",
                                 r"init engine \(profile, create kv cache, warmup model\) took",
                                 r"Starting vLLM (?:API )?server")),
    ("first completion", (r"Application startup complete",)),
)


PHASE_PATTERNS = [(name, re.compile("|".join(alternatives))) for name, alternatives in PHASES]


SHARDS = re.compile(r"Loading safetensors checkpoint shards:\s+\d+% Completed \| (\d+/\d+)")


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


NOTE_EVERY = 15  # seconds between two lines of the same phase


class Journal:
    """The journal of a unit's current start (its invocation), read a little at a time: each ``new()``
    returns only the lines logged since the last one (journalctl's cursor)."""

    def __init__(self, unit: str) -> None:
        self.unit, self.invocation, self.cursor = unit, "", ""

    def new(self) -> list[str]:
        invocation = lane_io.sh("systemctl", "show", "-p", "InvocationID", "--value", self.unit).stdout.strip()
        if not invocation:
            return []
        if invocation != self.invocation:  # another start: read it from its beginning
            self.invocation, self.cursor = invocation, ""
        args = ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat", "-q", "--no-pager",
                "--show-cursor", *([f"--after-cursor={self.cursor}"] if self.cursor else [])]
        lines = []
        for line in lane_io.sh(*args, timeout=30).stdout.splitlines():
            if line.startswith("-- cursor: "):
                self.cursor = line[len("-- cursor: "):].strip()
            else:
                lines.append(line)
        return lines


def phase_of(lines: list[str], phase: int, detail: str = "") -> tuple[int, str]:
    """(index in ``PHASES``, detail) after ``lines``, from (``phase``, ``detail``); -1: no vLLM line yet.
    The detail is the weights' shard count while they load."""
    for line in lines:
        for part in ANSI.sub("", line).split("\r"):  # a progress bar's updates, one line
            for index, (_, pattern) in enumerate(PHASE_PATTERNS):
                if index > phase and pattern.search(part):
                    phase, detail = index, ""
            shards = SHARDS.search(part)
            if shards and phase <= 1:
                phase, detail = 1, f"{shards[1]} shards"
    return phase, detail


def warm(p: RunnerPlan) -> bool:
    """One throwaway request per workload shape; marks the lane warm for the plan it started with."""
    for shape in p.warmup:
        extra = {k: shape[k] for k in ("chat_template_kwargs", "response_format") if shape.get(k)}
        body_messages = shape.get("messages") or [{"role": "user", "content": shape.get("prompt", "ping")}]
        began = time.monotonic()
        ok, detail = lane_io.completion(p, max_tokens=shape.get("max_tokens", 16), timeout=900,
                                messages=body_messages, **extra)
        print(f"warm-up {shape['name']}: {detail} in {time.monotonic() - began:.1f}s", flush=True)
        if not ok:
            return False
    started = json.loads(lane_io.mark(p, "started").read_text())
    lane_io.write_private(lane_io.mark(p, "warm"), json.dumps(started))
    return True


# A traceback's last line in a rank's log (a mod's or vLLM's own words), after vLLM's process prefix
# ("(EngineCore pid=51) "); not a log line that quotes an error (a WARNING naming a ValueError).
ERROR_LINE = re.compile(r"^(\(\w+ pid=\d+\) )?[A-Za-z_][\w.]*(Error|Exception): \S")


def first_error(lines: list[str]) -> str | None:
    """The first error line of ``lines`` that is not vLLM's pointer to an earlier one: a failed
    start's cause (a mod that raises, a CUDA error), which its last lines may no longer show."""
    return next((line.strip() for line in lines if ERROR_LINE.search(line) and "root cause above" not in line), None)


def wait_ready(p: RunnerPlan, timeout: float) -> int:
    """
    Wait until the head's lane completes a request: its port, then /health, then a completion.
    Says the start's phase read from vLLM's lines in the unit's journal (``PHASES``): a line when
    the phase changes, else one every ``NOTE_EVERY`` seconds. Fails (with the start's first error
    line and the unit's last lines) when the unit fails or restarts, or after ``timeout`` seconds.
    """
    lane, unit = p.lane, p.unit
    started, baseline = time.monotonic(), None
    stage, said, last_note = "port", "", 0.0
    journal, phase, detail, errors = Journal(unit), -1, "", []
    while True:
        elapsed = time.monotonic() - started
        state = lane_io.unit_state(unit)
        if state == "active" and baseline is None:
            baseline = lane_io.restarts(unit)  # counted from the start we wait for
        if state in ("failed", "inactive") or (baseline is not None and lane_io.restarts(unit) > baseline):
            what = f"unit {state}" if state in ("failed", "inactive") else "rank 0 exited and the unit restarted it"
            log = lane_io.sh("journalctl", "-u", unit, "-n", "400", "--no-pager", "-o", "cat").stdout.splitlines()
            cause = first_error(errors + log)
            print(f"lane {lane}: {what} after {elapsed:.0f}s" + (f"; its first error: {cause}" if cause else "")
                  + "; its last lines:\n" + "\n".join(log[-30:]), file=sys.stderr)
            return 1
        lines = journal.new()
        errors += [line for line in lines if ERROR_LINE.search(line)][:20 - len(errors)]
        phase, detail = phase_of(lines, phase, detail)
        if stage == "port" and lane_io.port_open(p):
            stage = "health"
        if stage == "health" and lane_io.request(p, "/health", timeout=5)[0] == 200:
            stage, phase, detail = "completion", len(PHASES) - 1, ""
        if stage == "completion":
            ok, answer = lane_io.completion(p, max_tokens=8, timeout=120)
            if ok:
                print(f"lane {lane}: ready in {elapsed:.0f}s ({answer})", flush=True)
                return 0
        name = PHASES[phase][0] if phase >= 0 else (
            "before the start: container checks, the workers" if state == "activating" else "starting vLLM")
        if elapsed > timeout:
            print(f"lane {lane}: not ready after {timeout:.0f}s (waiting for {stage}; its phase: {name})",
                  file=sys.stderr)
            return 1
        if name != said or elapsed - last_note >= NOTE_EVERY:
            print(f"lane {lane}: {name}" + (f" ({detail})" if detail else "") + f", {elapsed:.0f}s elapsed",
                  flush=True)
            said, last_note = name, elapsed
        time.sleep(2)
