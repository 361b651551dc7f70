"""
Trials for GMU bracketing (stdlib only): one start of the lane with a knob set on every rank, in
trial containers, the lane's units stopped.
"""

from __future__ import annotations

import time
from pathlib import Path

from . import docker
from . import lane_history, lane_io, lane_rank, lane_watch
from .plan import RunnerPlan


# vLLM's own words when the engine gives up (it takes a while to exit after them)
FAILED_START = ("EngineCore failed to start", "Engine core initialization failed")


def trial_name(p: RunnerPlan) -> str:
    return f"{p.container}-trial"


def trial_plan(p: RunnerPlan, knob: str, value: str) -> RunnerPlan:
    """
    This rank's plan with ``knob`` set to ``value``: a ``--flag`` of the command (replaced, or
    appended), or an environment variable (in a root-only copy of the lane's env file).
    """
    q = p.replace(container=trial_name(p), command=list(p.command), docker_options=list(p.docker_options))
    if knob.startswith("--"):
        cmd = q.command
        for i, arg in enumerate(cmd):
            if arg == knob and i + 1 < len(cmd):
                cmd[i + 1] = value
                break
            if arg.startswith(knob + "="):
                cmd[i] = f"{knob}={value}"
                break
        else:
            cmd += [knob, value]
        return q
    source = p.env_file
    lines = [line for line in Path(source).read_text().splitlines() if not line.startswith(f"{knob}=")]
    Path(p.marks_dir).mkdir(parents=True, exist_ok=True)
    env_file = lane_io.mark(p, "trial.env")
    env_file.touch(mode=0o600)
    env_file.write_text("\n".join([*lines, f"{knob}={value}"]) + "\n")
    opts = q.docker_options
    opts[opts.index(source)] = str(env_file)
    return q


def cmd_trial_rank(path: str, knob: str, value: str) -> int:
    """This rank's trial container, detached: the rank's options and its compile caches (a trial
    compiles what the lane's next start then finds warm, and finds what earlier starts compiled)."""
    q = trial_plan(lane_io.plan(path), knob, value)
    lane_io.sh("docker", "rm", "-f", q.container)
    try:
        image = lane_rank.image_key(q)
        lane_rank.prepare_compile_cache(q, image)
        options = [*lane_rank.rank_options(q), *docker.cache_mounts(q, image)]
    except RuntimeError as exc:
        lane_io.say(str(exc))
        return 1
    started = lane_io.sh(*docker.run(q.container, options, q.image, q.command, detach=True))
    if started.returncode != 0:
        lane_io.say(f"trial container did not start: {started.stderr.strip()}")
    return started.returncode


def running(container: str, ip: str | None = None) -> bool:
    args = ("docker", "inspect", "-f", "{{.State.Running}}", container)
    out = lane_io.on_worker(ip, *args) if ip else lane_io.sh(*args)
    return out.stdout.strip() == "true"


def cmd_trial(path: str, knob: str, value: str, timeout: float) -> int:
    """One start with the knob at ``value``; prints each rank's log under a ``=== rank N`` line."""
    p = lane_io.plan(path)
    name = trial_name(p)
    if lane_io.unit_state(p.unit) in ("active", "activating", "reloading"):
        lane_history.note_stop(p, f"a trial of {knob}={value} stops it")
    lane_io.sh("systemctl", "stop", p.unit, timeout=300)  # its ExecStopPost stops the workers
    lane_watch.stop_other_lanes(p, f"a trial of lane {p.lane} starts")
    for worker in p.workers:
        lane_io.on_worker(worker.ip, "systemctl", "stop", p.unit, timeout=300)
    began, verdict = time.monotonic(), "timeout"
    try:
        for worker in p.workers:
            out = lane_io.on_worker(worker.ip, *lane_io.here("trial-rank", path), knob, value,
                            timeout=120)
            if out.returncode != 0:
                lane_io.say(f"rank {worker.rank} on {worker.ip}: {out.stderr.strip()}")
                return 1
        if cmd_trial_rank(path, knob, value) != 0:
            return 1
        while time.monotonic() - began < timeout:
            time.sleep(2)
            logs = lane_io.sh("docker", "logs", name)
            text = logs.stdout + logs.stderr
            if "Application startup complete" in text:
                verdict = "serving"
                break
            if any(words in text for words in FAILED_START):
                verdict = "rank 0 failed to start"
                time.sleep(3)  # the others log why they stop too
                break
            exited = ["rank 0"] if not running(name) else []
            exited += [f"rank {w.rank}" for w in p.workers if not running(name, w.ip)]
            if exited:
                verdict = f"{', '.join(exited)} exited"
                time.sleep(3)  # the others log why they stop too
                break
        print(f"=== trial {knob}={value}: {verdict} after {time.monotonic() - began:.0f}s", flush=True)
        ranks = [(0, None)] + [(w.rank, w.ip) for w in p.workers]
        for rank, ip in ranks:
            logs = lane_io.on_worker(ip, "docker", "logs", name) if ip else lane_io.sh("docker", "logs", name)
            print(f"=== rank {rank}" + (f" ({ip})" if ip else " (head)"), flush=True)
            print(logs.stdout + logs.stderr, flush=True)
        return 0
    finally:
        lane_io.sh("docker", "rm", "-f", name, timeout=120)
        for worker in p.workers:
            lane_io.on_worker(worker.ip, "docker", "rm", "-f", name, timeout=120)
            lane_io.on_worker(worker.ip, "rm", "-f", str(lane_io.mark(p, "trial.env")))
        lane_io.mark(p, "trial.env").unlink(missing_ok=True)
