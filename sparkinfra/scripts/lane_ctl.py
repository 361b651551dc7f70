#!/usr/bin/python3
"""
Run one rank of a lane on a node (stdlib only; placed by ``deploys/lane.py``, run by the lane's unit).

Over 400 lines: it is uploaded as one file and runs with the node's own python3 (stdlib only), so
its parts (start order, watch, liveness, trials, status) cannot be modules of their own.

    lane_ctl.py pre PLAN          head, ExecStartPre: back off after failures in a row (5 s doubling
                                  to 120 s), record the start and its reason in the history, stop
                                  other lanes here and on the workers, check every rank's container
                                  at once (``check``; any failure: no start), then restart this
                                  lane's workers (all ranks start fresh, workers first)
    lane_ctl.py check PLAN        this rank's container checked before vLLM runs in it: the plan's
                                  container_check.py in a throwaway container of the rank's own options
                                  (the NCCL pin as libraries load it, RDMA devices, the GID row)
    lane_ctl.py copies PLAN       the libnccl.so* files of this rank's container that the pin is mounted
                                  over (found once per image ID and mounts, then kept in the marks)
    lane_ctl.py nccl-env PLAN     the NCCL env file of a lane that changes the node's (the plan's
                                  nccl_env: the node's file, the lane's variables set and removed)
                                  written root-only, its path printed; every docker run of the rank
                                  writes it first (docker's --env-file cannot unset a variable)
    lane_ctl.py run PLAN          ExecStart: the rank's container; on the head also the lane's watch:
                                  a worker unit that is not active, or an API that stops answering a
                                  one-token completion, stops the head (its unit restarts the lane);
                                  a worker it cannot reach does not, while the API completes (for
                                  unreachable_grace). On a worker, the rank stops itself once rank
                                  0's rendezvous port is gone for head_lost_timeout.
                                  Every rank drops the page cache while the weights load, until the
                                  head's /health answers (the plan's drop_caches; none under instanttensor)
    lane_ctl.py post PLAN         head, ExecStopPost: stop the workers (a dead head takes the lane down);
                                  a failed run counted with its reason (the ``failures`` mark), a
                                  stop asked for clears the count; the stop recorded in the history
    lane_ctl.py restart PLAN WHY  head: restart the lane's unit for a converge, WHY kept as the reason
                                  of the stop and of the start; systemctl's exit status
    lane_ctl.py history PLAN [N]  head: the last N (20) starts, readies and stops, one JSON line each
    lane_ctl.py stop PLAN         worker: stop this rank's unit; prints ``stopped`` or what it was
    lane_ctl.py clean PLAN        ExecStartPre, every rank: remove the stale /dev/shm/psm_* segments a
                                  crashed container left, drop the page cache
    lane_ctl.py status PLAN       JSON: units, container, started digest, workers, API, the head's last
                                  5 events; {} when the lane is not placed (--local: this node only,
                                  no workers, no API request)
    lane_ctl.py wait-ready PLAN [TIMEOUT]
                                  head: port open -> /health 200 -> a completion returns tokens; says
                                  the start's phase, read from vLLM's lines in the unit's journal
                                  (a line when it changes, else one every 15 s)
    lane_ctl.py warmup PLAN       one throwaway request per workload shape, then mark the lane warm
    lane_ctl.py trial PLAN KNOB VALUE TIMEOUT
                                  head: one start of the lane with KNOB (an env variable, or a --flag
                                  of the command) set to VALUE on every rank, in trial containers, the
                                  lane's units stopped; until rank 0 serves, a rank exits, or TIMEOUT
                                  seconds; prints every rank's log, then removes the trial containers
    lane_ctl.py trial-rank PLAN KNOB VALUE
                                  this rank's trial container, detached (the head runs it on workers)

PLAN is the rank's plan, ``/etc/sparkinfra/lanes/LANE.json`` (written by the deploy, the same path on
every node): it names everything this runner touches (``sparkinfra.serving.RankPlan.runner_plan``):
the lane's unit and the pattern of every lane's units, its env file, the folder of its runtime marks
(``/run/sparkinfra/lanes/``: lost at reboot, as the lane is), the head's restart history (kept over
reboots).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def plan(path: str) -> dict:
    return json.loads(Path(path).read_text())


def mark(p: dict, name: str) -> Path:
    """This lane's runtime mark ``name`` (started, warm, trial.env)."""
    return Path(p["marks_dir"]) / f"{p['lane']}.{name}"


def write_private(path: Path, text: str) -> None:
    """Write ``path`` readable by root only from its first byte (marks may hold a key's stamp)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def key_stamp(p: dict, key: str = "") -> dict | None:
    """
    The API-key file's HMAC under ``key`` (a new random one when empty), kept with the key in the
    root-only ``started`` mark: tells whether the key changed since the lane started, while no
    digest of the key appears in the plan, the status or pyinfra's output. None without a file.
    """
    path = p.get("api_key_file")
    if not path or not os.path.exists(path):
        return None
    key = key or os.urandom(32).hex()
    return {"key": key, "hmac": hmac.new(bytes.fromhex(key), Path(path).read_bytes(), "sha256").hexdigest()}


def say(message: str) -> None:
    print(f"lane: {message}", file=sys.stderr, flush=True)


def sh(*args: str, check: bool = False, timeout: float | None = 60) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=timeout)


SSH_FAILED = 255  # ssh's own status: the command did not run there (no route, refused, a changed key)


def on_worker(ip: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a command as root on a worker over the head's fabric SSH mesh; a worker that does not
    answer within ``timeout`` ends as ssh's own failure (``SSH_FAILED``), never as an exception."""
    try:
        return sh("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", ip, "sudo", "-n", *args, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, SSH_FAILED, "", f"ssh {ip}: no answer within {timeout:.0f}s")


def reached(result: subprocess.CompletedProcess) -> bool:
    """Whether ``on_worker``'s command ran on the worker (its own status, whatever it is)."""
    return result.returncode != SSH_FAILED


def ssh_error(result: subprocess.CompletedProcess) -> str:
    """Why ``on_worker`` did not reach the worker, in one line; a changed host key by its name."""
    text = result.stderr or ""
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or "Host key verification failed" in text:
        return ("its SSH host key changed (not the key the head's mesh pinned): a converge re-pins it from "
                "the key the controller trusts")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else f"ssh exited {result.returncode}"


def on_workers(workers: list[dict], *args: str, timeout: float = 30) -> list[subprocess.CompletedProcess]:
    """``on_worker`` on every worker at once (8 nodes stop and start as fast as 2), in their order."""
    with ThreadPoolExecutor(max_workers=max(1, len(workers))) as pool:
        return list(pool.map(lambda w: on_worker(w["ip"], *args, timeout=timeout), workers))


def unit_state(unit: str) -> str:
    return sh("systemctl", "is-active", unit).stdout.strip() or "unknown"


def other_lane_units(p: dict) -> list[str]:
    listed = sh("systemctl", "list-units", "--plain", "--no-legend", "--state=active,activating,reloading",
                p["lane_units"]).stdout
    units = [line.split()[0] for line in listed.splitlines() if line.strip()]
    return [u for u in units if u != p["unit"]]


# API
# ---


def api_key(p: dict) -> str:
    """The API key from the head's root-only secret env file (``VLLM_API_KEY=...``), if any."""
    path = p.get("api_key_file")
    if path and os.path.exists(path):
        for line in Path(path).read_text().splitlines():
            if line.startswith("VLLM_API_KEY="):
                return line.split("=", 1)[1].strip()
    return ""


def request(p: dict, path: str, body: dict | None = None, timeout: float = 10) -> tuple[int, dict | str]:
    url = f"http://127.0.0.1:{p['api_port']}{path}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    key = api_key(p)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode(errors="replace")
            status = resp.status
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:300]
    except (OSError, urllib.error.URLError) as exc:
        return 0, str(exc)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def port_open(p: dict) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", p["api_port"])) == 0


def completion(p: dict, max_tokens: int = 1, timeout: float = 60, **extra) -> tuple[bool, str]:
    """A real chat completion: True when it returns at least one token."""
    body = {"model": p["served_model_name"], "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": "ping"}]}
    body.update(extra)
    status, reply = request(p, "/v1/chat/completions", body, timeout=timeout)
    if status != 200 or not isinstance(reply, dict):
        return False, f"HTTP {status}: {str(reply)[:200]}"
    tokens = (reply.get("usage") or {}).get("completion_tokens", 0)
    return tokens > 0, f"{tokens} completion tokens"


# Unit steps
# ----------


def lane_of_unit(p: dict, unit: str) -> str:
    """The lane whose unit is ``unit`` (the plan's ``lane_units`` pattern); '' when it is none."""
    prefix, _, suffix = p["lane_units"].partition("*")
    if unit.startswith(prefix) and unit.endswith(suffix) and len(unit) > len(prefix) + len(suffix):
        return unit[len(prefix):len(unit) - len(suffix)]
    return ""


def stop_other_lanes(p: dict, why: str = "") -> None:
    """Stop every other lane's units, here and on the workers; each one stopped here is left ``why``
    (default: "lane <this> starts") as its stop's reason, which its ``post`` records."""
    others = other_lane_units(p)
    if others:
        say(f"stopping other lanes here: {' '.join(others)}")
        for unit in others:
            other = lane_of_unit(p, unit)
            if other:
                note_stop({**p, "lane": other}, why or f"lane {p['lane']} starts")
        sh("systemctl", "stop", *others, timeout=300)
    for worker in p["workers"]:
        listed = on_worker(worker["ip"], "systemctl", "list-units", "--plain", "--no-legend",
                           "--state=active,activating", p["lane_units"]).stdout
        stale = [line.split()[0] for line in listed.splitlines() if line.strip()
                 and line.split()[0] != p["unit"]]
        if stale:
            say(f"stopping other lanes on {worker['ip']}: {' '.join(stale)}")
            on_worker(worker["ip"], "systemctl", "stop", *stale, timeout=300)


def image_id(image: str) -> str:
    return sh("docker", "image", "inspect", "-f", "{{.Id}}", image).stdout.strip()


def nccl_copies(p: dict) -> list[str]:
    """
    Every ``libnccl.so*`` file in this rank's container but the pin itself: the image's own copies
    (pip's nvidia-nccl, the system's) and any in the lane's mounts, listed by ``container_check.py
    --find-nccl`` in a throwaway container of the rank's options. Found once per image ID and
    mounts, kept in the marks: a changed image is searched again. Raises RuntimeError when the
    search fails.
    """
    pin = p.get("nccl_pin") or ""
    if not pin:
        return []
    mounts = [o for i, o in enumerate(p["docker_options"]) if i and p["docker_options"][i - 1] == "-v"]
    key = hashlib.sha256(json.dumps([image_id(p["image"]), mounts, pin]).encode()).hexdigest()[:16]
    kept = mark(p, "nccl-copies")
    if kept.exists():
        found = json.loads(kept.read_text())
        if found.get("key") == key:
            return found["paths"]
    write_nccl_env(p)  # the options name it
    done = check_script(p, "find", p["docker_options"], "--find-nccl")
    if done.returncode != 0:
        raise RuntimeError(f"listing the libnccl copies of {p['image']} failed: {done.stderr.strip()[-300:]}")
    paths = [line for line in done.stdout.splitlines() if line.startswith("/") and line != pin]
    Path(p["marks_dir"]).mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps({"key": key, "image": p["image"], "paths": paths}))
    return paths


def check_script(p: dict, purpose: str, options: list[str], *args: str) -> subprocess.CompletedProcess:
    """The plan's ``container_check.py ARGS`` in a throwaway container ``<container>-<purpose>`` of
    ``options`` and the rank's image (a leftover of that name is removed first)."""
    c = p["container_check"]
    name = f"{p['container']}-{purpose}"
    sh("docker", "rm", "-f", name)
    beside = c.get("identity")  # nccl_identity.py, which the check imports from its own folder
    extra = ["-v", f"{beside['script']}:{beside['mount']}:ro"] if beside else []
    return sh("docker", "run", "--rm", "--name", name, *options, "-v", f"{c['script']}:{c['mount']}:ro", *extra,
              "--entrypoint", "python3", p["image"], c["mount"], *args, timeout=300)


def rank_options(p: dict) -> list[str]:
    """The rank's ``docker run`` options: the plan's, then the pin mounted read-only over every
    other ``libnccl.so*`` its container holds (``LD_PRELOAD`` reaches only what loads by name).
    The lane's NCCL env file, which the options name, is written first (``write_nccl_env``)."""
    write_nccl_env(p)
    pin = p.get("nccl_pin") or ""
    return [*p["docker_options"], *(x for path in nccl_copies(p) for x in ("-v", f"{pin}:{path}:ro"))]


# The rank's NCCL environment
# ---------------------------


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


def write_nccl_env(p: dict) -> str:
    """
    The NCCL env file of the plan's ``nccl_env`` (a lane that changes the node's): the node's file
    with the lane's changes, written root-only from its first byte (replaced whole: a ``docker run``
    reading it at the same time reads the old or the new); '' without changes (the options name the
    node's file). Raises RuntimeError when the node's file cannot be read (prepare writes it).
    """
    spec = p.get("nccl_env")
    if not spec:
        return ""
    try:
        node_text = Path(spec["node"]).read_text()
    except OSError as exc:
        raise RuntimeError(f"the node's NCCL environment {spec['node']} cannot be read ({exc.strerror}): "
                           "deploys/prepare.py writes it") from None
    target = Path(spec["file"])
    part = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        write_private(part, nccl_env_text(node_text, spec["changes"], p["lane"], spec["node"]))
        os.replace(part, target)
    except OSError as exc:
        raise RuntimeError(f"the lane's NCCL environment {target} cannot be written ({exc.strerror})") from None
    finally:
        part.unlink(missing_ok=True)
    return str(target)


def cmd_nccl_env(path: str) -> int:
    try:
        written = write_nccl_env(plan(path))
    except RuntimeError as exc:
        say(str(exc))
        return 1
    if written:
        print(written, flush=True)
    return 0


def cmd_copies(path: str) -> int:
    print("\n".join(nccl_copies(plan(path))), flush=True)
    return 0


def container_check(p: dict) -> tuple[bool, list[str]]:
    """This rank's ``container_check.py`` run in a container of its own options and image: its verdict
    and lines (``container check: PASS|FAIL …``)."""
    try:
        options = rank_options(p)
    except RuntimeError as exc:
        return False, [f"container check: FAIL nccl: {exc}"]
    done = check_script(p, "check", options, *p["container_check"]["args"])
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return done.returncode == 0, lines or [f"container check: FAIL docker: exit {done.returncode}"]


def cmd_check(path: str) -> int:
    ok, lines = container_check(plan(path))
    print("\n".join(lines), flush=True)
    return 0 if ok else 1


def check_every_rank(path: str, p: dict) -> str:
    """``check`` on every rank at once (the head here, the workers over SSH); says each line. The
    ranks that failed ('' when every rank passed: the lane may start)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        head = pool.submit(container_check, p)
        workers = on_workers(p["workers"], "python3", str(Path(__file__).resolve()), "check", path, timeout=300)
        ok, lines = head.result()
    results = [(0, "this node", ok, lines)]
    for worker, done in zip(p["workers"], workers):
        said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        if not reached(done):
            said = [f"not reached: {ssh_error(done)}"]
        results.append((worker["rank"], worker["ip"], done.returncode == 0, said or [f"exit {done.returncode}"]))
    for rank, where, _, lines in results:
        for line in lines:
            say(f"rank {rank} on {where}: {line}")
    return ", ".join(f"rank {rank} on {where}" for rank, where, ok, _ in results if not ok)


def cmd_pre(path: str) -> int:
    p = plan(path)
    # A stopper's note for a stop that never came (the unit was waiting to restart): not this start's.
    mark(p, "stop-reason").unlink(missing_ok=True)
    why = start_reason(p)
    back_off(p)
    say(f"starting the lane: {why}")
    record(p, "start", why)
    stop_other_lanes(p)
    failed = check_every_rank(path, p)
    if failed:
        note_stop(p, f"a rank's container check failed ({failed})")
        say("a rank's container check failed: the lane does not start (the lines above say why)")
        return 1
    # All ranks start fresh together, the workers first: a lane never recovers rank by rank.
    say("(re)starting " + ", ".join(f"rank {w['rank']} on {w['ip']}" for w in p["workers"]))
    failed = [(w, r) for w, r in zip(p["workers"], on_workers(p["workers"], "systemctl", "restart", p["unit"],
                                                              timeout=300)) if r.returncode != 0]
    for worker, result in failed:
        why = result.stderr.strip() if reached(result) else f"not reached: {ssh_error(result)}"
        say(f"rank {worker['rank']} on {worker['ip']} did not start: {why}")
    if failed:
        note_stop(p, "rank " + ", ".join(str(w["rank"]) for w, _ in failed) + " did not start")
    return 1 if failed else 0


def stop_workers(p: dict, path: str) -> None:
    """Stop every worker's unit of the lane, all at once; says which stopped (one already down is
    not "stopped") and which could not be reached (it stops itself: ``watch_rendezvous``)."""
    results = on_workers(p["workers"], "python3", str(Path(__file__).resolve()), "stop", path, timeout=300)
    for worker, result in zip(p["workers"], results):
        where = f"rank {worker['rank']} on {worker['ip']}"
        if not reached(result):
            say(f"{where} not reached to stop it ({ssh_error(result)}): it stops itself once rank 0's "
                f"rendezvous is gone for {p['head_lost_timeout']}s")
        elif result.returncode != 0:
            say(f"{where} did not stop: {(result.stdout + result.stderr).strip()[-300:]}")
        elif result.stdout.strip() == "stopped":
            say(f"stopped {where}")


def cmd_stop(path: str) -> int:
    """A worker's unit stopped (the head's ``post`` runs it there): prints ``stopped``, or what the unit was."""
    p = plan(path)
    state = unit_state(p["unit"])
    if state not in ("active", "activating", "reloading", "deactivating"):
        print(f"was {state}", flush=True)
        return 0
    done = sh("systemctl", "stop", p["unit"], timeout=300)
    print("stopped" if done.returncode == 0 else done.stderr.strip(), flush=True)
    return done.returncode


def cmd_post(path: str) -> int:
    p = plan(path)
    stop_workers(p, path)
    why, failed = count_stop(p, os.environ.get("SERVICE_RESULT", ""), os.environ.get("EXIT_STATUS", ""))
    if not why:
        shutting_down = sh("systemctl", "is-system-running").stdout.strip() == "stopping"
        why = "the node shuts down" if shutting_down else "stopped on purpose"
    record(p, "stop", why, failed=failed)
    return 0


def cmd_restart(path: str, why: str) -> int:
    """
    A converge's restart of the lane (on the head): ``why`` kept as the reason of the start
    ("a converge: WHY", the ``start-reason`` mark ``pre`` takes) and, when the unit runs, of its
    stop ("a converge restarts it: WHY"); then ``systemctl restart``. Its exit status.
    """
    p = plan(path)
    if p["rank"] != 0:
        say("restart runs on the lane's head (rank 0), which restarts every rank")
        return 2
    Path(p["marks_dir"]).mkdir(parents=True, exist_ok=True)
    mark(p, "start-reason").write_text(f"a converge: {why}")
    if unit_state(p["unit"]) in ("active", "activating", "reloading"):
        note_stop(p, f"a converge restarts it: {why}")
    done = sh("systemctl", "restart", p["unit"], timeout=None)
    if done.returncode != 0:
        mark(p, "start-reason").unlink(missing_ok=True)  # no start took it: not the next one's reason
        print(done.stderr.strip() or f"systemctl restart {p['unit']}: exit {done.returncode}", file=sys.stderr)
    return done.returncode


# Restarts: counted, backed off, each with its reason
# ---------------------------------------------------

BACKOFF_FIRST = 5  # seconds before the start after a first failure (systemd's RestartSec adds its own 5)
BACKOFF_MAX = 120  # ... doubling with each failure in a row, up to this


def note_stop(p: dict, why: str) -> None:
    """Keep why the lane is about to stop (``post`` counts it when the stop was a failure)."""
    Path(p["marks_dir"]).mkdir(parents=True, exist_ok=True)
    mark(p, "stop-reason").write_text(why)


def count_stop(p: dict, result: str, status: str) -> tuple[str, bool]:
    """After the lane stopped: a failure (``result`` is systemd's ``SERVICE_RESULT``) counted in the
    ``failures`` mark with its reason; a stop that was asked for clears the count. (The stop's
    reason, whether it failed): the ``stop-reason`` mark (consumed), else systemd's words for a
    failure, else '' (a stop asked for that left no reason)."""
    reason_mark = mark(p, "stop-reason")
    why = reason_mark.read_text().strip() if reason_mark.exists() else ""
    reason_mark.unlink(missing_ok=True)
    if result in ("", "success"):
        mark(p, "failures").unlink(missing_ok=True)
        return why, False
    count = failures(p).get("count", 0) + 1
    why = why or f"rank 0 ended ({result}, status {status or '?'})"
    Path(p["marks_dir"]).mkdir(parents=True, exist_ok=True)
    mark(p, "failures").write_text(json.dumps({"count": count, "reason": why, "at": time.time()}))
    say(f"the lane failed ({count} in a row): {why}")
    return why, True


def failures(p: dict) -> dict:
    """The ``failures`` mark: ``{count, reason, at}`` of the lane's failed starts and runs in a row."""
    found = mark(p, "failures")
    try:
        return json.loads(found.read_text()) if found.exists() else {}
    except ValueError:
        return {}


def backoff(count: int) -> int:
    """Seconds between the ``count``-th failure in a row and the next start: 0, 5, 10, 20, ... 120."""
    return 0 if count <= 0 else min(BACKOFF_FIRST * 2 ** (count - 1), BACKOFF_MAX)


def back_off(p: dict) -> None:
    """Before a start after failures in a row: wait out their back-off (counted from the last one)."""
    last = failures(p)
    wait = backoff(last.get("count", 0)) - (time.time() - last.get("at", 0))
    if wait > 0:
        say(f"backing off {wait:.0f}s before the next start: {last['count']} failure(s) in a row, "
            f"the last: {last.get('reason', '?')}")
        time.sleep(wait)


# The restart history (the head's): every start, ready and stop, with its reason
# ------------------------------------------------------------------------------

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


def events(p: dict, last: int = HISTORY_MAX) -> list[dict]:
    """The last ``last`` events of the head's history (none on a worker, or before its first start)."""
    path = p.get("history")
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


def record(p: dict, event: str, why: str, **extra) -> dict | None:
    """
    Append one event to the head's history (``{"at", "event", "why", "boot", "digest", ...extra}``,
    one JSON line), keeping the last ``HISTORY_MAX``: written whole to a root-only file beside it,
    then renamed over it (a crash never leaves half a history). Workers keep none. Never fails the
    unit: a history that cannot be written is said, and the lane goes on.
    """
    path = p.get("history")
    if not path:
        return None
    entry = {"at": round(time.time(), 1), "event": event, "why": why[:500], "boot": boot_id(),
             "digest": p.get("digest", ""), **extra}
    kept = [*events(p, HISTORY_MAX - 1), entry]
    target = Path(path)
    temp = target.with_name(target.name + ".new")
    try:
        write_private(temp, "".join(json.dumps(e, sort_keys=True) + "\n" for e in kept))
        os.replace(temp, target)
    except OSError as exc:
        say(f"the lane's history was not written ({exc})")
        return None
    return entry


def start_reason(p: dict) -> str:
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
    found = mark(p, "start-reason")
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


def seconds_since_start(p: dict, fallback: float) -> int:
    """Seconds since the last start recorded in this boot (else since the monotonic ``fallback``)."""
    start = next((e for e in reversed(events(p, 20)) if e.get("event") == "start"), None)
    if start and start.get("boot") == boot_id() and isinstance(start.get("at"), (int, float)):
        return round(time.time() - start["at"])
    return round(time.monotonic() - fallback)


def cmd_history(path: str, count: int = 20) -> int:
    """The head's last ``count`` events, one JSON object a line (nothing on a worker)."""
    if Path(path).exists():
        for event in events(plan(path), count):
            print(json.dumps(event, sort_keys=True), flush=True)
    return 0


# Memory hygiene around a start (seed 001, a3refaat's notes)
# ----------------------------------------------------------

DROP_CACHES = "/proc/sys/vm/drop_caches"
SHM = "/dev/shm"


def drop_page_cache() -> None:
    os.sync()
    Path(DROP_CACHES).write_text("3\n")


def cmd_clean(path: str) -> int:
    """Before a start (the lane's container is gone): stale PSM segments, then the page cache."""
    plan(path)
    stale = sorted(Path(SHM).glob("psm_*"))
    size = sum(f.stat().st_size for f in stale if f.is_file())
    for segment in stale:
        segment.unlink(missing_ok=True)
    if stale:
        say(f"removed {len(stale)} stale {SHM}/psm_* segment(s) of a crashed start ({size / 2**20:.0f} MiB)")
    drop_page_cache()
    return 0


def api_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


def drop_caches_while_loading(p: dict, done: threading.Event) -> None:
    """Drop the page cache every ``every`` seconds until the head's API answers ``until`` (the
    weights are in), the rank's container ends (``done``) or ``at_most`` seconds pass."""
    spec = p.get("drop_caches")
    if not spec:
        return
    say(f"page-cache dropper: every {spec['every']}s while the weights load, until {spec['until']} answers")
    started, drops, why = time.monotonic(), 0, ""
    while not why:
        if done.wait(spec["every"]):
            why = "the rank's container ended"
        elif api_healthy(spec["until"]):
            why = "the lane is ready"
        elif time.monotonic() - started > spec["at_most"]:
            why = f"{spec['at_most']}s passed"
        else:
            try:
                drop_page_cache()
                drops += 1
            except OSError as exc:
                why = f"cannot drop the page cache: {exc}"
    say(f"page-cache dropper: stopped after {time.monotonic() - started:.0f}s and {drops} drops: {why}")


def image_key(p: dict) -> str:
    """The short image ID the rank's compile caches are kept under."""
    return image_id(p["image"]).removeprefix("sha256:")[:12] or "unknown"


def compile_cache_options(p: dict, image: str) -> list[str]:
    """Mounts of this lane's compile caches for ``image``: ``<root>/<image>/<kind>``, each at its
    default path in the container."""
    spec = p.get("compile_cache") or {"mounts": {}}
    return [x for kind, path in spec["mounts"].items() for x in ("-v", f"{spec['root']}/{image}/{kind}:{path}")]


def prepare_compile_cache(p: dict, image: str) -> None:
    """Before a start: the folders of the lane's other images removed (a new image starts cold),
    this image's made; says whether the start is warm and with what."""
    spec = p.get("compile_cache")
    if not spec:
        return
    root = Path(spec["root"])
    for old in sorted(root.glob("*")) if root.exists() else []:
        if old.name != image and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
            say(f"compile caches of image {old.name} removed: a new image starts cold")
    sizes = {}
    for kind in spec["mounts"]:
        folder = root / image / kind
        folder.mkdir(parents=True, exist_ok=True)
        sizes[kind] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    held = ", ".join(f"{kind} {size / 2**20:.1f} MiB" if size >= 2**20 else f"{kind} {size // 1024} KiB"
                     for kind, size in sizes.items() if size)
    say(f"compile caches of image {image}: " + (f"warm ({held})" if held else "cold (nothing compiled yet)"))


def docker_run(p: dict, image: str) -> list[str]:
    """The rank's container: the plan's options, the pin over each copy, the compile caches of ``image``."""
    return ["docker", "run", "--rm", "--name", p["container"], *rank_options(p), *compile_cache_options(p, image),
            p["image"], *p["command"]]


def cmd_run(path: str) -> int:
    p = plan(path)
    try:
        image = image_key(p)
        prepare_compile_cache(p, image)
        argv = docker_run(p, image)
    except RuntimeError as exc:
        say(str(exc))
        return 1
    if p.get("nccl_env"):
        say(f"NCCL environment: {p['nccl_env']['node']} with the lane's nccl_env "
            f"({nccl_changes_text(p['nccl_env']['changes'])}), in {p['nccl_env']['file']}")
    Path(p["marks_dir"]).mkdir(parents=True, exist_ok=True)
    write_private(mark(p, "started"), json.dumps({"digest": p["digest"], "at": time.time(), "api_key": key_stamp(p)}))
    mark(p, "warm").unlink(missing_ok=True)
    child = subprocess.Popen(argv)
    ended = threading.Event()
    dropper = threading.Thread(target=drop_caches_while_loading, args=(p, ended), daemon=True)
    dropper.start()
    try:
        if p["rank"] > 0:  # a worker rank: the container is the unit (its ExecStop stops it)
            return watch_rendezvous(p, child)
        return watch_head(p, path, child)
    finally:
        ended.set()  # the dropper's last line says why it stopped
        dropper.join(timeout=5)


def exit_status(code: int) -> int:
    return 128 - code if code < 0 else code  # killed by a signal: as a shell reports it


def stop_container(p: dict, child: subprocess.Popen) -> None:
    sh("docker", "stop", "-t", str(p["stop_seconds"]), p["container"], timeout=p["stop_seconds"] + 60)
    child.wait()


def tcp_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(3)
        return s.connect_ex((host, port)) == 0


def watch_rendezvous(p: dict, child: subprocess.Popen) -> int:
    """
    A worker rank's container ``child`` until it ends; stopped by this rank itself once rank 0's
    rendezvous (the port every rank joined through) stopped answering for ``head_lost_timeout``
    seconds, or never answered within ``start_timeout``: a worker the head could not stop (its
    fabric or SSH down) does not outlive its lane. The unit's exit status.
    """
    spec = p.get("rendezvous")
    if not spec:
        return exit_status(child.wait())
    where = f"rank 0's rendezvous {spec['host']}:{spec['port']}"
    started, seen, lost = time.monotonic(), None, None
    while True:
        try:
            return exit_status(child.wait(timeout=p["watch_interval"]))
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if tcp_open(spec["host"], spec["port"]):
            if lost is not None:
                say(f"{where} answers again after {now - lost:.0f}s")
            seen, lost = now, None
            continue
        if seen is None:
            if now - started >= p["start_timeout"]:
                reason = f"{where} did not answer within {p['start_timeout']}s"
                break
            continue
        if lost is None:
            lost = now
            say(f"{where} stopped answering: this rank stops itself if it is gone for {p['head_lost_timeout']}s")
        if now - lost >= p["head_lost_timeout"]:
            reason = f"{where} has been gone for {now - lost:.0f}s"
            break
    say(f"{reason}: stopping this rank (no worker outlives its lane; rank 0 starts it again)")
    stop_container(p, child)
    return 1


def worker_states(p: dict) -> tuple[list[dict], dict[str, str]]:
    """Every worker's unit, asked at once: (the workers reached whose unit is not active,
    {ip: why} of the workers not reached)."""
    results = on_workers(p["workers"], "systemctl", "is-active", p["unit"], timeout=20)
    down = [w for w, r in zip(p["workers"], results) if reached(r) and r.stdout.strip() != "active"]
    lost = {w["ip"]: ssh_error(r) for w, r in zip(p["workers"], results) if not reached(r)}
    return down, lost


def watch_head(p: dict, path: str, child: subprocess.Popen) -> int:
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
    ranks = {w["ip"]: w["rank"] for w in p["workers"]}
    reason = ""
    while not stopping:
        try:
            code = child.wait(timeout=p["watch_interval"])
            if stopping:
                break
            reason = f"rank 0 container exited with status {code}"
            say(reason)
            note_stop(p, reason)  # post stops the workers
            return code or 1  # exit 0 after a dead worker still means "not serving"
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if now - started < p["watch_grace"]:
            continue
        down, lost = worker_states(p)
        if down and mark(p, "stop-reason").exists():
            # A stopper (a teardown, another lane, a converge's restart) left its reason here before
            # stopping the lane's units on every node at once: a worker that stopped first is its
            # doing, not a failure; the stop records the stopper's reason.
            say(f"rank {', '.join(str(w['rank']) for w in down)} stopped: {mark(p, 'stop-reason').read_text().strip()}")
            stopping.append("asked")
            break
        if down:
            reason = "rank " + ", ".join(f"{w['rank']} on {w['ip']}" for w in down) + " is not running"
            break
        for ip, why in lost.items():
            if ip not in lost_since:
                lost_since[ip] = now
                say(f"rank {ranks[ip]} on {ip} not reached ({why}): the lane serves on while its API completes, "
                    f"for at most {p['unreachable_grace']}s")
        for ip in [ip for ip in lost_since if ip not in lost]:
            say(f"rank {ranks[ip]} on {ip} reached again after {now - lost_since.pop(ip):.0f}s")
        overdue = [ip for ip, since in lost_since.items() if now - since >= p["unreachable_grace"]]
        if overdue:
            reason = ", ".join(f"rank {ranks[ip]} on {ip}" for ip in overdue) + (
                f" not reached for {p['unreachable_grace']}s ({lost[overdue[0]]})")
            break
        if not ready:
            ready = request(p, "/health", timeout=5)[0] == 200
            if ready:
                mark(p, "failures").unlink(missing_ok=True)  # serving: the next failure backs off from zero
                record(p, "ready", "its API answers /health", seconds=seconds_since_start(p, started))
                warm(p)  # after any (re)start, also one nobody asked for: JIT costs stay out of use
            continue
        if lost_since or now - last_live >= p["liveness_interval"]:
            ok, detail = completion(p, timeout=p["liveness_timeout"])
            last_live = time.monotonic()
            failed = 0 if ok else failed + 1
            if failed >= 2:
                reason = f"the API stopped completing ({detail})"
                if lost_since:
                    reason += " while " + ", ".join(f"rank {ranks[ip]} on {ip}" for ip in lost_since) + " is not reached"
                break
    if reason:
        say(f"{reason}: restarting the lane on every node")
        note_stop(p, reason)
    # The workers stop while rank 0 does (each engine's shutdown takes seconds); post finds them stopped.
    workers = threading.Thread(target=stop_workers, args=(p, path))
    workers.start()
    stop_container(p, child)
    workers.join()
    return 0 if stopping and not reason else 1


def unit_state_remote(ip: str, p: dict) -> str:
    result = on_worker(ip, "systemctl", "is-active", p["unit"], timeout=20)
    return result.stdout.strip() if reached(result) else f"not reached: {ssh_error(result)}"


# Facts and readiness
# -------------------


def cmd_status(path: str, probe: bool = True) -> int:
    """Print the lane's state here ({} when its plan is not placed); ``probe``: on the head, also
    ask the workers and the API."""
    if not Path(path).exists():
        print("{}")
        return 0
    p = plan(path)
    status = {"lane": p["lane"], "unit": unit_state(p["unit"]), "planned": p["digest"], "started": None,
              "warm": None, "container": None, "workers": {}, "api": None, "others": other_lane_units(p)}
    inspect = sh("docker", "inspect", "-f", "{{.State.Running}} {{.Image}}", p["container"])
    status["container"] = inspect.stdout.strip() or None
    marks = {name: mark(p, name) for name in ("started", "warm")}
    marks = {name: json.loads(found.read_text()) for name, found in marks.items() if found.exists()}
    status["started"] = marks.get("started", {}).get("digest")
    status["warm"] = marks.get("warm", {}).get("digest")
    status["age"] = round(time.time() - marks["started"]["at"]) if "started" in marks else None
    stamp = marks.get("started", {}).get("api_key")
    status["api_key"] = None if not stamp else "current" if key_stamp(p, stamp["key"]) == stamp else "changed"
    if p["rank"] == 0:
        status["history"] = events(p, 5)
    if p["rank"] == 0 and probe:
        status["workers"] = {w["ip"]: unit_state_remote(w["ip"], p) for w in p["workers"]}
        status["failures"] = failures(p) or None
        if status["unit"] == "active" and port_open(p):
            ok, detail = completion(p, timeout=30)
            status["api"] = "ok" if ok else detail
        else:
            status["api"] = "down"
    print(json.dumps(status, sort_keys=True))
    return 0


def restarts(unit: str) -> int:
    value = sh("systemctl", "show", "-p", "NRestarts", "--value", unit).stdout.strip()
    return int(value) if value.isdigit() else 0


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
        invocation = sh("systemctl", "show", "-p", "InvocationID", "--value", self.unit).stdout.strip()
        if not invocation:
            return []
        if invocation != self.invocation:  # another start: read it from its beginning
            self.invocation, self.cursor = invocation, ""
        args = ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat", "-q", "--no-pager",
                "--show-cursor", *([f"--after-cursor={self.cursor}"] if self.cursor else [])]
        lines = []
        for line in sh(*args, timeout=30).stdout.splitlines():
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


def cmd_wait_ready(path: str, timeout: float) -> int:
    """
    Wait until the head's lane completes a request: its port, then /health, then a completion.
    Says the start's phase read from vLLM's lines in the unit's journal (``PHASES``): a line when
    the phase changes, else one every ``NOTE_EVERY`` seconds. Fails (with the unit's last lines)
    when the unit fails or restarts, or after ``timeout`` seconds.
    """
    p = plan(path)
    lane, unit = p["lane"], p["unit"]
    started, baseline = time.monotonic(), None
    stage, said, last_note = "port", "", 0.0
    journal, phase, detail = Journal(unit), -1, ""
    while True:
        elapsed = time.monotonic() - started
        state = unit_state(unit)
        if state == "active" and baseline is None:
            baseline = restarts(unit)  # counted from the start we wait for
        if state in ("failed", "inactive") or (baseline is not None and restarts(unit) > baseline):
            what = f"unit {state}" if state in ("failed", "inactive") else "rank 0 exited and the unit restarted it"
            log = sh("journalctl", "-u", unit, "-n", "30", "--no-pager", "-o", "cat").stdout
            print(f"lane {lane}: {what} after {elapsed:.0f}s; its last lines:\n{log}", file=sys.stderr)
            return 1
        phase, detail = phase_of(journal.new(), phase, detail)
        if stage == "port" and port_open(p):
            stage = "health"
        if stage == "health" and request(p, "/health", timeout=5)[0] == 200:
            stage, phase, detail = "completion", len(PHASES) - 1, ""
        if stage == "completion":
            ok, answer = completion(p, max_tokens=8, timeout=120)
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


def cmd_warmup(path: str) -> int:
    return 0 if warm(plan(path)) else 1


def warm(p: dict) -> bool:
    """One throwaway request per workload shape; marks the lane warm for the plan it started with."""
    for shape in p["warmup"]:
        extra = {k: shape[k] for k in ("chat_template_kwargs", "response_format") if shape.get(k)}
        body_messages = shape.get("messages") or [{"role": "user", "content": shape.get("prompt", "ping")}]
        began = time.monotonic()
        ok, detail = completion(p, max_tokens=shape.get("max_tokens", 16), timeout=900,
                                messages=body_messages, **extra)
        print(f"warm-up {shape['name']}: {detail} in {time.monotonic() - began:.1f}s", flush=True)
        if not ok:
            return False
    started = json.loads(mark(p, "started").read_text())
    write_private(mark(p, "warm"), json.dumps(started))
    return True


# Trials (GMU bracketing)
# -----------------------


# vLLM's own words when the engine gives up (it takes a while to exit after them)
FAILED_START = ("EngineCore failed to start", "Engine core initialization failed")


def trial_name(p: dict) -> str:
    return f"{p['container']}-trial"


def trial_plan(p: dict, knob: str, value: str) -> dict:
    """
    This rank's plan with ``knob`` set to ``value``: a ``--flag`` of the command (replaced, or
    appended), or an environment variable (in a root-only copy of the lane's env file).
    """
    q = {**p, "container": trial_name(p), "command": list(p["command"]), "docker_options": list(p["docker_options"])}
    if knob.startswith("--"):
        cmd = q["command"]
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
    source = p["env_file"]
    lines = [line for line in Path(source).read_text().splitlines() if not line.startswith(f"{knob}=")]
    Path(p["marks_dir"]).mkdir(parents=True, exist_ok=True)
    env_file = mark(p, "trial.env")
    env_file.touch(mode=0o600)
    env_file.write_text("\n".join([*lines, f"{knob}={value}"]) + "\n")
    opts = q["docker_options"]
    opts[opts.index(source)] = str(env_file)
    return q


def cmd_trial_rank(path: str, knob: str, value: str) -> int:
    q = trial_plan(plan(path), knob, value)
    sh("docker", "rm", "-f", q["container"])
    try:
        options = rank_options(q)
    except RuntimeError as exc:
        say(str(exc))
        return 1
    started = sh("docker", "run", "-d", "--name", q["container"], *options, q["image"], *q["command"])
    if started.returncode != 0:
        say(f"trial container did not start: {started.stderr.strip()}")
    return started.returncode


def running(container: str, ip: str | None = None) -> bool:
    args = ("docker", "inspect", "-f", "{{.State.Running}}", container)
    out = on_worker(ip, *args) if ip else sh(*args)
    return out.stdout.strip() == "true"


def cmd_trial(path: str, knob: str, value: str, timeout: float) -> int:
    """One start with the knob at ``value``; prints each rank's log under a ``=== rank N`` line."""
    p = plan(path)
    name = trial_name(p)
    if unit_state(p["unit"]) in ("active", "activating", "reloading"):
        note_stop(p, f"a trial of {knob}={value} stops it")
    sh("systemctl", "stop", p["unit"], timeout=300)  # its ExecStopPost stops the workers
    stop_other_lanes(p, f"a trial of lane {p['lane']} starts")
    for worker in p["workers"]:
        on_worker(worker["ip"], "systemctl", "stop", p["unit"], timeout=300)
    began, verdict = time.monotonic(), "timeout"
    try:
        for worker in p["workers"]:
            out = on_worker(worker["ip"], "python3", str(Path(__file__).resolve()), "trial-rank", path, knob, value,
                            timeout=120)
            if out.returncode != 0:
                say(f"rank {worker['rank']} on {worker['ip']}: {out.stderr.strip()}")
                return 1
        if cmd_trial_rank(path, knob, value) != 0:
            return 1
        while time.monotonic() - began < timeout:
            time.sleep(2)
            logs = sh("docker", "logs", name)
            text = logs.stdout + logs.stderr
            if "Application startup complete" in text:
                verdict = "serving"
                break
            if any(mark in text for mark in FAILED_START):
                verdict = "rank 0 failed to start"
                time.sleep(3)  # the others log why they stop too
                break
            exited = ["rank 0"] if not running(name) else []
            exited += [f"rank {w['rank']}" for w in p["workers"] if not running(name, w["ip"])]
            if exited:
                verdict = f"{', '.join(exited)} exited"
                time.sleep(3)  # the others log why they stop too
                break
        print(f"=== trial {knob}={value}: {verdict} after {time.monotonic() - began:.0f}s", flush=True)
        ranks = [(0, None)] + [(w["rank"], w["ip"]) for w in p["workers"]]
        for rank, ip in ranks:
            logs = on_worker(ip, "docker", "logs", name) if ip else sh("docker", "logs", name)
            print(f"=== rank {rank}" + (f" ({ip})" if ip else " (head)"), flush=True)
            print(logs.stdout + logs.stderr, flush=True)
        return 0
    finally:
        sh("docker", "rm", "-f", name, timeout=120)
        for worker in p["workers"]:
            on_worker(worker["ip"], "docker", "rm", "-f", name, timeout=120)
            on_worker(worker["ip"], "rm", "-f", str(mark(p, "trial.env")))
        mark(p, "trial.env").unlink(missing_ok=True)


def main(argv: list[str]) -> int:
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
    if command == "status":
        return cmd_status(path, probe="--local" not in argv[2:])
    if command == "wait-ready":
        return cmd_wait_ready(path, float(argv[2]) if len(argv) > 2 else 1800)
    if command == "warmup":
        return cmd_warmup(path)
    if command == "trial" and len(argv) == 5:
        return cmd_trial(path, argv[2], argv[3], float(argv[4]))
    if command == "trial-rank" and len(argv) == 4:
        return cmd_trial_rank(path, argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
