"""
Run one rank of a lane on a node (stdlib only; placed with the node programs, run by the lane's
unit as ``python3 /usr/local/lib/sparkinfra/node lane_ctl VERB PLAN ...``): the verbs, each from the
module of its concern (``lane_io``, ``lane_history``, ``lane_rank``, ``lane_watch``, ``lane_trial``).

    lane_ctl pre PLAN          head, ExecStartPre: back off after failures in a row (5 s doubling
                                  to 120 s), record the start and its reason in the history, stop
                                  other lanes here and on the workers, check every rank's container
                                  at once (``check``; any failure: no start), then restart this
                                  lane's workers (all ranks start fresh, workers first)
    lane_ctl check PLAN        this rank's container checked before vLLM runs in it: the plan's
                                  container_check.py in a throwaway container of the rank's own options
                                  (the NCCL pin as libraries load it, RDMA devices, the GID row)
    lane_ctl copies PLAN       the libnccl.so* files of this rank's container that the pin is mounted
                                  over (found once per image ID and mounts, then kept in the marks)
    lane_ctl nccl-env PLAN     the NCCL env file of a lane that changes the node's (the plan's
                                  nccl_env: the node's file, the lane's variables set and removed)
                                  written root-only, its path printed; every docker run of the rank
                                  writes it first (docker's --env-file cannot unset a variable)
    lane_ctl run PLAN          ExecStart: the rank's container; on the head also the lane's watch:
                                  a worker unit that is not active, or an API that stops answering a
                                  one-token completion, stops the head (its unit restarts the lane);
                                  a worker it cannot reach does not, while the API completes (for
                                  unreachable_grace). On a worker, the rank stops itself once rank
                                  0's rendezvous port is gone for head_lost_timeout.
                                  Every rank drops the page cache while the weights load, until the
                                  head's /health answers (the plan's drop_caches; none under instanttensor)
    lane_ctl post PLAN         head, ExecStopPost: stop the workers (a dead head takes the lane down);
                                  a failed run counted with its reason (the ``failures`` mark), a
                                  stop asked for clears the count; the stop recorded in the history
    lane_ctl restart PLAN WHY  head: restart the lane's unit for a converge, WHY kept as the reason
                                  of the stop and of the start; systemctl's exit status
    lane_ctl rollout PLAN TIMEOUT WHY
                                  head: a converge's start (``restart``, then ``wait-ready``); one that
                                  fails or is not ready in TIMEOUT seconds is rolled back (``rollback``); exit 1
    lane_ctl rollback PLAN TIMEOUT WHY [N]
                                  head: the lane left for known good set N (default: the newest of
                                  another plan not rejected), WHY (its canary failed, an operator asked):
                                  every rank's journal kept in /var/lib/sparkinfra/failed-starts/, the set
                                  restored on every node, started and waited for; the plan left marked
                                  rejected; 0: the set serves
    lane_ctl restore PLAN N    this node: known good set N's files put back (the head runs it on workers)
    lane_ctl history PLAN [N]  head: the last N (20) starts, readies, stops, promotions and rollbacks, one JSON line each
    lane_ctl promote PLAN KEEP WHY [CANARY]
                                  head: the lane as it runs becomes the next known good set on every
                                  node (workers first; ``lane_known``), the newest KEEP sets kept;
                                  WHY and the canary's numbers (JSON) go to the set and the history,
                                  the lane's rejected mark goes; a lane already the newest set is
                                  left as it is
    lane_ctl keep PLAN N KEEP WHY
                                  this node's rank kept as known good set N (the head runs it on workers)
    lane_ctl known PLAN        JSON: the known good sets kept on this node, oldest first
    lane_ctl stop PLAN         worker: stop this rank's unit; prints ``stopped`` or what it was
    lane_ctl clean PLAN        ExecStartPre, every rank: remove what a killed start left in /dev/shm
                                  (psm_*, sem.mp-*) that no live process holds, drop the page cache
    lane_ctl status PLAN       JSON: units, container, started digest, workers, API, the head's last
                                  5 events and its known good sets; {} when the lane is not placed
                                  (--local: this node only, no workers, no API request)
    lane_ctl wait-ready PLAN [TIMEOUT]
                                  head: port open -> /health 200 -> a completion returns tokens; says
                                  the start's phase, read from vLLM's lines in the unit's journal
                                  (a line when it changes, else one every 15 s)
    lane_ctl warmup PLAN       one throwaway request per workload shape, then mark the lane warm
    lane_ctl trial PLAN KNOB VALUE TIMEOUT
                                  head: one start of the lane with KNOB (an env variable, or a --flag
                                  of the command) set to VALUE on every rank, in trial containers, the
                                  lane's units stopped; until rank 0 serves, a rank exits, or TIMEOUT
                                  seconds; prints every rank's log, then removes the trial containers
    lane_ctl trial-rank PLAN KNOB VALUE
                                  this rank's trial container, detached (the head runs it on workers)

PLAN is the rank's plan, ``/etc/sparkinfra/lanes/LANE.json`` (written by the deploy, the same path on
every node): it names everything this runner touches (``plan.RunnerPlan``, from ``sparkinfra.serving.RankPlan.runner_plan``):
the lane's unit and the pattern of every lane's units, its env file, the folder of its runtime marks
(``/run/sparkinfra/lanes/``: lost at reboot, as the lane is), the head's restart history (kept over
reboots).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import lane_history, lane_io, lane_known, lane_rank, lane_trial, lane_watch
from .plan import RunnerPlan


def cmd_nccl_env(path: str) -> int:
    try:
        written = lane_rank.write_nccl_env(lane_io.plan(path))
    except RuntimeError as exc:
        lane_io.say(str(exc))
        return 1
    if written:
        print(written, flush=True)
    return 0


def cmd_copies(path: str) -> int:
    print("\n".join(lane_rank.nccl_copies(lane_io.plan(path))), flush=True)
    return 0


def cmd_check(path: str) -> int:
    ok, lines = lane_rank.container_check(lane_io.plan(path))
    print("\n".join(lines), flush=True)
    return 0 if ok else 1


def check_every_rank(path: str, p: RunnerPlan) -> str:
    """``check`` on every rank at once (the head here, the workers over SSH); says each line. The
    ranks that failed ('' when every rank passed: the lane may start)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        head = pool.submit(lane_rank.container_check, p)
        workers = lane_io.on_workers(p.workers, *lane_io.here("check", path), timeout=300)
        ok, lines = head.result()
    results = [(0, "this node", ok, lines)]
    for worker, done in zip(p.workers, workers):
        said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        if not lane_io.reached(done):
            said = [f"not reached: {lane_io.ssh_error(done)}"]
        results.append((worker.rank, worker.ip, done.returncode == 0, said or [f"exit {done.returncode}"]))
    for rank, where, _, lines in results:
        for line in lines:
            lane_io.say(f"rank {rank} on {where}: {line}")
    return ", ".join(f"rank {rank} on {where}" for rank, where, ok, _ in results if not ok)


def cmd_pre(path: str) -> int:
    p = lane_io.plan(path)
    # A stopper's note for a stop that never came (the unit was waiting to restart): not this start's.
    lane_io.mark(p, "stop-reason").unlink(missing_ok=True)
    why = lane_history.start_reason(p)
    lane_history.back_off(p)
    lane_io.say(f"starting the lane: {why}")
    lane_history.record(p, "start", why)
    lane_watch.stop_other_lanes(p)
    failed = check_every_rank(path, p)
    if failed:
        lane_history.note_stop(p, f"a rank's container check failed ({failed})")
        lane_io.say("a rank's container check failed: the lane does not start (the lines above say why)")
        return 1
    # All ranks start fresh together, the workers first: a lane never recovers rank by rank.
    lane_io.say("(re)starting " + ", ".join(f"rank {w.rank} on {w.ip}" for w in p.workers))
    failed = [(w, r) for w, r in zip(p.workers, lane_io.on_workers(p.workers, "systemctl", "restart", p.unit,
                                                              timeout=300)) if r.returncode != 0]
    for worker, result in failed:
        why = result.stderr.strip() if lane_io.reached(result) else f"not reached: {lane_io.ssh_error(result)}"
        lane_io.say(f"rank {worker.rank} on {worker.ip} did not start: {why}")
    if failed:
        lane_history.note_stop(p, "rank " + ", ".join(str(w.rank) for w, _ in failed) + " did not start")
    return 1 if failed else 0


def cmd_stop(path: str) -> int:
    """A worker's unit stopped (the head's ``post`` runs it there): prints ``stopped``, or what the unit was."""
    p = lane_io.plan(path)
    state = lane_io.unit_state(p.unit)
    if state not in ("active", "activating", "reloading", "deactivating"):
        print(f"was {state}", flush=True)
        return 0
    done = lane_io.sh("systemctl", "stop", p.unit, timeout=300)
    print("stopped" if done.returncode == 0 else done.stderr.strip(), flush=True)
    return done.returncode


def cmd_post(path: str) -> int:
    p = lane_io.plan(path)
    lane_watch.stop_workers(p, path)
    why, failed = lane_history.count_stop(p, os.environ.get("SERVICE_RESULT", ""), os.environ.get("EXIT_STATUS", ""))
    if not why:
        shutting_down = lane_io.sh("systemctl", "is-system-running").stdout.strip() == "stopping"
        why = "the node shuts down" if shutting_down else "stopped on purpose"
    lane_history.record(p, "stop", why, failed=failed)
    return 0


def cmd_restart(path: str, why: str) -> int:
    """
    A converge's restart of the lane (on the head): ``why`` kept as the reason of the start
    ("a converge: WHY", the ``start-reason`` mark ``pre`` takes) and, when the unit runs, of its
    stop ("a converge restarts it: WHY"); then ``systemctl restart``. Its exit status.
    """
    p = lane_io.plan(path)
    if p.rank != 0:
        lane_io.say("restart runs on the lane's head (rank 0), which restarts every rank")
        return 2
    Path(p.marks_dir).mkdir(parents=True, exist_ok=True)
    lane_io.mark(p, "start-reason").write_text(f"a converge: {why}")
    if lane_io.unit_state(p.unit) in ("active", "activating", "reloading"):
        lane_history.note_stop(p, f"a converge restarts it: {why}")
    done = lane_io.sh("systemctl", "restart", p.unit, timeout=None)
    if done.returncode != 0:
        lane_io.mark(p, "start-reason").unlink(missing_ok=True)  # no start took it: not the next one's reason
        print(done.stderr.strip() or f"systemctl restart {p.unit}: exit {done.returncode}", file=sys.stderr)
    return done.returncode


def start_waited(timeout: float):
    """A start of a plan on the head, for ``lane_known.roll_back``: ``restart`` with the reason, then
    ``wait-ready`` within ``timeout`` seconds; whether it serves."""
    return lambda plan, why: cmd_restart(plan, why) == 0 and cmd_wait_ready(plan, timeout) == 0


def cmd_rollout(path: str, timeout: float, why: str) -> int:
    """
    A converge's start of the lane's plan on the head (``start_waited``). A start that fails or does not
    get ready within ``timeout`` is rolled back (``lane_known.roll_back``). 0: the new plan serves;
    1: it does not (whether the rollback served or not: the converge did not bring what it asked for).
    """
    if start_waited(timeout)(path, why):
        return 0
    p = lane_io.plan(path)
    lane_known.roll_back(p, path, start_waited(timeout), lane_known.start_failure(p))
    return 1


def cmd_rollback(path: str, timeout: float, why: str, number: int | None) -> int:
    """The head: the lane of ``path`` left for known good set ``number`` (None: the newest of another
    plan), ``why`` it is left (its canary failed, an operator asked); 0: the set serves."""
    p = lane_io.plan(path)
    if p.rank != 0:
        lane_io.say("rollback runs on the lane's head (rank 0), which puts the set back on every node")
        return 2
    return 0 if lane_known.roll_back(p, path, start_waited(timeout), why, number) else 1


def cmd_history(path: str, count: int = 20) -> int:
    """The head's last ``count`` events, one JSON object a line (nothing on a worker)."""
    if Path(path).exists():
        for event in lane_history.events(lane_io.plan(path), count):
            print(json.dumps(event, sort_keys=True), flush=True)
    return 0


def cmd_clean(path: str) -> int:
    """Before a start (the lane's container is gone): the stale shared memory of a killed start
    (PSM segments, multiprocessing semaphores) no live process holds, then the page cache."""
    lane_io.plan(path)
    stale = lane_rank.stale_shm()
    size = sum(f.stat().st_size for f in stale if f.is_file())
    for segment in stale:
        segment.unlink(missing_ok=True)
    if stale:
        lane_io.say(f"removed {len(stale)} stale {lane_rank.SHM} object(s) of a killed start "
                    f"(psm_*, sem.mp-*: {size / 2**20:.0f} MiB)")
    lane_rank.drop_page_cache()
    return 0


def cmd_run(path: str) -> int:
    p = lane_io.plan(path)
    try:
        image = lane_rank.image_key(p)
        lane_rank.prepare_compile_cache(p, image)
        argv = lane_rank.docker_run(p, image)
    except RuntimeError as exc:
        lane_io.say(str(exc))
        return 1
    if p.nccl_env:
        lane_io.say(f"NCCL environment: {p.nccl_env.node} with the lane's nccl_env "
            f"({lane_rank.nccl_changes_text(p.nccl_env.changes)}), in {p.nccl_env.file}")
    Path(p.marks_dir).mkdir(parents=True, exist_ok=True)
    started = {"digest": p.digest, "at": time.time(), "api_key": lane_io.key_stamp(p)}
    lane_io.write_private(lane_io.mark(p, "started"), json.dumps(started))
    lane_io.mark(p, "warm").unlink(missing_ok=True)
    child = subprocess.Popen(argv)
    ended = threading.Event()
    dropper = threading.Thread(target=lane_rank.drop_caches_while_loading, args=(p, ended), daemon=True)
    dropper.start()
    try:
        if p.rank > 0:  # a worker rank: the container is the unit (its ExecStop stops it)
            return lane_watch.watch_rendezvous(p, child)
        return lane_watch.watch_head(p, path, child)
    finally:
        ended.set()  # the dropper's last line says why it stopped
        dropper.join(timeout=5)


def cmd_status(path: str, probe: bool = True) -> int:
    """Print the lane's state here ({} when its plan is not placed); ``probe``: on the head, also
    ask the workers and the API."""
    if not Path(path).exists():
        print("{}")
        return 0
    p = lane_io.plan(path)
    status = {"lane": p.lane, "unit": lane_io.unit_state(p.unit), "planned": p.digest, "started": None,
              "warm": None, "container": None, "workers": {}, "api": None, "others": lane_io.other_lane_units(p)}
    inspect = lane_io.sh("docker", "inspect", "-f", "{{.State.Running}} {{.Image}}", p.container)
    status["container"] = inspect.stdout.strip() or None
    marks = {name: lane_io.mark(p, name) for name in ("started", "warm")}
    marks = {name: json.loads(found.read_text()) for name, found in marks.items() if found.exists()}
    status["started"] = marks.get("started", {}).get("digest")
    status["warm"] = marks.get("warm", {}).get("digest")
    status["age"] = round(time.time() - marks["started"]["at"]) if "started" in marks else None
    stamp = marks.get("started", {}).get("api_key")
    status["api_key"] = None if not stamp else "current" if lane_io.key_stamp(p, stamp["key"]) == stamp else "changed"
    if p.rank == 0:
        status["history"] = lane_history.events(p, 5)
        status.update(lane_known.status(p, status["started"]))
    if p.rank == 0 and probe:
        status["workers"] = {w.ip: lane_io.unit_state_remote(w.ip, p) for w in p.workers}
        status["failures"] = lane_history.failures(p) or None
        if status["unit"] == "active" and lane_io.port_open(p):
            ok, detail = lane_io.completion(p, timeout=30)
            status["api"] = "ok" if ok else detail
        else:
            status["api"] = "down"
    print(json.dumps(status, sort_keys=True))
    return 0


def cmd_wait_ready(path: str, timeout: float) -> int:
    return lane_watch.wait_ready(lane_io.plan(path), timeout)


def cmd_warmup(path: str) -> int:
    return 0 if lane_watch.warm(lane_io.plan(path)) else 1


NOT_PLACED = 3  # the exit status of a verb whose plan is not on this node


def main(argv: list[str]) -> int:
    """Run the verb ``argv[0]`` on the plan ``argv[1]``; a plan that is not on this node is said as
    such (exit ``NOT_PLACED``), never as a traceback."""
    try:
        return dispatch(argv)
    except FileNotFoundError as exc:
        if len(argv) < 2 or exc.filename != argv[1]:
            raise
        print(f"lane_ctl {argv[0]}: no plan {argv[1]} on this node (the lane is not placed here: a converge "
              "places it)", file=sys.stderr)
        return NOT_PLACED


def dispatch(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    command, path = argv[0], argv[1]
    if command == "pre":
        return cmd_pre(path)
    if command == "run":
        return cmd_run(path)
    if command == "post":
        return cmd_post(path)
    if command == "stop":
        return cmd_stop(path)
    if command == "clean":
        return cmd_clean(path)
    if command == "check":
        return cmd_check(path)
    if command == "copies":
        return cmd_copies(path)
    if command == "nccl-env":
        return cmd_nccl_env(path)
    if command == "restart" and len(argv) == 3:
        return cmd_restart(path, argv[2])
    if command == "history" and (len(argv) == 2 or (len(argv) == 3 and argv[2].isdigit())):
        return cmd_history(path, int(argv[2]) if len(argv) == 3 else 20)
    if command == "promote" and len(argv) in (4, 5) and argv[2].isdigit():
        canary = json.loads(argv[4]) if len(argv) == 5 else None
        return lane_known.promote(lane_io.plan(path), path, argv[3], int(argv[2]), canary)
    if command == "rollback" and len(argv) in (4, 5) and (len(argv) == 4 or argv[4].isdigit()):
        return cmd_rollback(path, float(argv[2]), argv[3], int(argv[4]) if len(argv) == 5 else None)
    if command == "keep" and len(argv) == 5 and argv[2].isdigit() and argv[3].isdigit():
        lane_known.keep(lane_io.plan(path), int(argv[2]), argv[4], int(argv[3]))
        return 0
    if command == "rollout" and len(argv) == 4:
        return cmd_rollout(path, float(argv[2]), argv[3])
    if command == "restore" and len(argv) == 3 and argv[2].isdigit():
        lane_known.restore(int(argv[2]))
        return 0
    if command == "known":
        print(json.dumps(lane_known.entries()))
        return 0
    if command == "status":
        return cmd_status(path, probe="--local" not in argv[2:])
    if command == "wait-ready":
        return cmd_wait_ready(path, float(argv[2]) if len(argv) > 2 else 1800)
    if command == "warmup":
        return cmd_warmup(path)
    if command == "trial" and len(argv) == 5:
        return lane_trial.cmd_trial(path, argv[2], argv[3], float(argv[4]))
    if command == "trial-rank" and len(argv) == 4:
        return lane_trial.cmd_trial_rank(path, argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
