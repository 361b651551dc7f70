"""
Lanes on a node: one lane at a time, its container, validated by vLLM in the image, running on
every rank, warm; and the lane's teardown.
"""

from __future__ import annotations

import hashlib
import json
import shlex

from pyinfra import host, logger
from pyinfra.api import (
    FunctionCommand,
    QuoteString,
    StringCommand,
    operation,
)

from .. import node, progress, serving
from ..bench import canary as bench_canary
from ..bench.canary import Canary
from ..bench.probes import BenchError
from ..facts.files import FileDigest
from ..facts.lane import DockerContainer, LaneFiles, LaneStatus, LaneUnits
from ..facts.reading import gathered
from ..facts.stage import DockerImageId, SnapshotFiles
from ..node import docker, paths
from ..node.paths import CHECK_CONTAINER
from ..node.plan import CompileCache
from ..progress import shown
from .files import put_private


@operation()
def stale_container_absent(container: str):
    """
    Ensure no stopped container holds a lane's container name (an aborted launch leaves a
    placeholder that eats the next launch's exec script).

    + container: the container name (``vllm_node``)
    """
    state = gathered(host, DockerContainer, container=container)
    if state is None or state["running"]:
        host.noop(f"no stale container {container}")
        return
    yield StringCommand("docker", "rm", "-f", QuoteString(container))


@operation()
def container_absent(container: str):
    """
    Ensure no container, running or not, holds this name (teardown).

    + container: the container name
    """
    if gathered(host, DockerContainer, container=container) is None:
        host.noop(f"no container {container}")
        return
    yield StringCommand("docker", "rm", "-f", QuoteString(container))


@operation(is_idempotent=False)
def page_caches_dropped():
    """
    Drop the page cache (run it right before a lane starts, with ``_if=``: not on every converge).
    """
    yield "sync"
    yield "echo 3 > /proc/sys/vm/drop_caches"


# Lanes
# -----

ACTIVE_STATES = ("active", "activating", "reloading", "deactivating")


@operation()
def other_lanes_stopped(lane: str):
    """
    Ensure no other lane's unit runs, or starts at boot, on this node (one lane at a time). A
    running unit is left the stop's reason first (its runner's ``stop-reason`` mark, which the
    head's history records): "a teardown stops it", or "lane <lane> is placed here".

    + lane: the lane that may run (empty: none may)
    """
    units = gathered(host, LaneUnits)
    others = sorted(
        name for name, state in units.items()
        if name != lane and (state["active"] in ACTIVE_STATES or state["enabled"] == "enabled")
    )
    failed = sorted(name for name, state in units.items() if name != lane and state["active"] == "failed")
    if not others and not failed:
        host.noop("no other lane runs here")
        return
    running = [o for o in others if units[o]["active"] in ACTIVE_STATES]
    if running:
        why = QuoteString(f"lane {lane} is placed here" if lane else "a teardown stops it")
        notes = [x for o in running for x in ("&&", "printf", "%s", why, ">", f"{paths.MARKS_DIR}/{o}.stop-reason")]
        yield StringCommand("mkdir", "-p", paths.MARKS_DIR, *notes)
    if others:
        yield StringCommand("systemctl", "disable", "--now", *[paths.unit_name(o) for o in others])
    # A rank stopped mid-start may end "failed": stopped on purpose, it is just inactive.
    stale = sorted(set(others) | set(failed))
    yield StringCommand("systemctl", "reset-failed", *[paths.unit_name(o) for o in stale], "2>/dev/null", "||", "true")


@operation()
def other_lanes_absent(lane: str, keep_history: bool = False):
    """
    Ensure no other lane left files on this node (``paths.lane_paths``: its unit, plan, env files,
    the head's API-key file, validation marks and restart history, its mods, its runtime marks); a
    unit still running or enabled is stopped and disabled first. Reload systemd after it (``_if=``
    its ``did_change``).

    + lane: the lane whose files stay (empty: none stay, a teardown)
    + keep_history: leave each lane's restart history (a teardown: ``status`` still tells how the
      lane last stopped; a full teardown removes the folder)
    """
    others = {
        name: [p for p in found if not (keep_history and p == paths.history_path(name))]
        for name, found in gathered(host, LaneFiles).items() if name != lane
    }
    others = {name: found for name, found in others.items() if found}
    if not others:
        host.noop("no other lane's files are here")
        return
    units = gathered(host, LaneUnits)
    live = sorted(
        name for name, state in units.items()
        if name in others and (state["active"] in ACTIVE_STATES or state["enabled"] == "enabled")
    )
    if live:
        yield StringCommand("systemctl", "disable", "--now", *[paths.unit_name(n) for n in live])
    yield StringCommand("rm", "-rf", *[QuoteString(p) for name in sorted(others) for p in others[name]])




@operation()
def lane_validated(lane: str, image: str, request: dict, docker_options: list[str], mods: list[tuple[str, str]] = (),
                   compile_cache: CompileCache | None = None):
    """
    Ensure the lane's serve arguments of every rank passed the vLLM inside the lane's image (its own
    parser, ``validate_parsed_serve_args``, and ``create_engine_config`` against the staged model),
    for this image ID and these arguments. Nothing starts while they do not.

    + lane: the lane's name
    + image: the lane's image (on this node, the head)
    + request: what ``node/vllm_check.py`` checks (``lanes.vllm_request(..., in_image=True)``)
    + docker_options: ``docker run`` options giving the check the lane's mounts and environment
    + mods: (name, digest) of the lane's mods, applied first in this order as a rank's start does
      (a flag a mod registers is then known to the parser)
    + compile_cache: the lane's compile caches, mounted as a rank's start mounts them (vLLM's
      inspection of the model's class, kept there, is then done once per image, not per check)
    """

    image_id = gathered(host, DockerImageId, image=image) or "absent"
    check = (node.DIR / "vllm_check.py").read_text()  # run from the node programs (``programs_present``)
    request = json.dumps(request, sort_keys=True)
    key = hashlib.sha256(f"{image_id}\n{request}\n{check}\n{json.dumps(list(mods))}".encode()).hexdigest()[:16]
    marker = paths.validated_path(lane)
    if gathered(host, FileDigest, path=marker) == key:
        host.noop(f"{lane}'s arguments passed the image's vLLM")
        return
    data = paths.check_request_path(lane)
    yield StringCommand("mkdir", "-p", "-m", "700", paths.STATE_DIR)
    yield FunctionCommand(lambda state, host: put_private(host, request, data), (), {})  # 0600 from its first byte
    yield serving.runner(lane, "nccl-env")  # the lane's NCCL env file, which docker_options may name
    # Named, so a converge killed during the check leaves nothing the next one does not remove.
    yield StringCommand("docker", "rm", "-f", CHECK_CONTAINER, ">/dev/null", "2>&1", "||", "true")
    # The mods' own lines go to the output before the check's report, its last line.
    apply = [serving.CONTAINER_APPLY_MODS, paths.CONTAINER_MODS, *(name for name, _ in mods), "--", "python3"] if mods else []
    mount = f"{paths.PROGRAMS}:{paths.CONTAINER_PROGRAMS}:ro"  # the lane's options hold it when it has mods
    caches = docker.cache_folders(compile_cache, docker.cache_key(image_id))
    if caches:
        yield StringCommand("mkdir", "-p", *caches.values())
    options = [*([] if mount in docker_options else ["-v", mount]), *docker_options,
               *(x for path, folder in caches.items() for x in ("-v", f"{folder}:{path}"))]
    run = docker.run(CHECK_CONTAINER, options, image, [*apply, paths.CONTAINER_PROGRAMS, "vllm_check"], stdin=True,
                     entrypoint="sh" if apply else "python3")
    # Its verdict and the image rules' warnings on screen; vLLM's own lines in a log, shown on failure.
    log = paths.check_log_path(lane)
    report = shlex.join([*paths.program("check_report"), log])
    yield shown(f"{shlex.join(run)} < {data} 2> {log} | {report} && echo {key} > {marker}")


@operation()
def lane_running(lane: str, digest: str, ready_timeout: int):
    """
    Ensure the lane serves: its units active on every node, started from the current plan (digest),
    and the head's API completing a request. Otherwise the whole lane restarts (workers first,
    from the head's unit; ``lane_ctl rollout`` keeps the reasons in the head's restart history)
    and this waits until a completion returns tokens, its phases printed as they come (``shown``).
    A start that fails or is not ready in time is rolled back by the runner to the newest known good
    set of another plan, which it starts; the operation then fails, naming both and the kept logs.

    + lane: the lane's name (this runs on its head)
    + digest: the plan every rank must run (``serving.lane_digest``)
    + ready_timeout: seconds the lane may take to answer after a (re)start
    """
    status = host.get_fact(LaneStatus, lane=lane) or {}
    unit = paths.unit_name(lane)
    wait = serving.runner(lane, "wait-ready", str(ready_timeout))  # its lines: the start's phases

    def rollout(why: str) -> StringCommand:
        """The start, waited for; a failed one rolled back to the newest known good set (``lane_ctl rollout``)."""
        return serving.runner(lane, "rollout", str(ready_timeout), why)

    age = status.get("age")
    starting = (
        status.get("unit") in ("active", "activating") and status.get("started") == digest
        and age is not None and age < ready_timeout and status.get("api") != "ok"
        # a rotated key: the running lane refuses the new one (401), nothing is starting
        and status.get("api_key") != "changed"
        and all(state in ("active", "activating") for state in status.get("workers", {}).values())
    )
    if starting:
        # Already (re)starting on its own (its unit restarts the lane when a rank dies): wait for it,
        # restarting it only if it does not become ready.
        logger.info(f"    [{host.name}] {unit} is starting ({age}s ago): waiting for it")
        yield shown(StringCommand(wait, "||", rollout("it did not become ready")))
        return
    reasons = []
    if status.get("unit") != "active":
        reasons.append(f"its unit is {status.get('unit', 'not installed')}")
    elif status.get("started") != digest:
        reasons.append("its plan changed")
    elif status.get("api_key") == "changed":  # compared on the head (lane_ctl's stamp): no digest of it here
        reasons.append("its API key changed")
    else:
        down = [f"{ip} ({state})" for ip, state in sorted(status.get("workers", {}).items()) if state != "active"]
        if down:
            reasons.append("workers not running: " + ", ".join(down))
        elif status.get("api") != "ok":
            reasons.append(f"the API does not complete ({status.get('api')})")
    if not reasons:
        host.noop(f"lane {lane} serves")
        return
    # Said in every run, --dry included: what restarts, and why.
    logger.info(f"    [{host.name}] {unit} restarts (with its workers): {'; '.join(reasons)}")
    # A converge is a deliberate start: it does not wait out the back-off of earlier failures.
    yield StringCommand("rm", "-f", paths.failures_path(lane))
    yield shown(rollout("; ".join(reasons)))  # the reasons go to the head's restart history


@operation()
def lane_warm(lane: str, digest: str):
    """
    Ensure the running lane has had one throwaway request per workload shape since it started,
    so start-up JIT costs never land in a measurement.

    + lane: the lane's name (this runs on its head)
    + digest: the plan the lane runs
    """
    status = gathered(host, LaneStatus, lane=lane, probe=False) or {}  # the marks are enough here
    if status.get("warm") == digest and status.get("started") == digest:
        host.noop(f"lane {lane} is warm")
        return
    yield serving.runner(lane, "warmup")


@operation()
def lane_known_good(lane: str, digest: str, keep: int, canary: Canary, ready_timeout: int):
    """
    Ensure the lane, serving and warm on plan ``digest``, is the newest known good set on every node:
    its canary (``bench.canary``, from the controller: the probes and a llama-benchy subset, medians)
    within the lane's tolerances of its baseline, it is promoted (``lane_ctl promote``: each node
    keeps its rank's placed files; the numbers become the next change's baseline; the newest ``keep``
    sets stay). A canary past a tolerance, or whose requests fail, rolls the lane back (``lane_ctl
    rollback``) to the newest known good set of another plan, started and waited for; the operation
    then fails, naming the measure, both numbers and the kept logs.

    + lane: the lane's name (this runs on its head)
    + digest: the plan the lane runs
    + keep: how many known good sets each node keeps
    + canary: what the canary measures (``bench.canary.of_lane``)
    + ready_timeout: seconds the set rolled back to may take to answer
    """
    status = gathered(host, LaneStatus, lane=lane, probe=False) or {}  # lane_warm's read, in a run that changed nothing
    known = status.get("known") or []
    if known and known[-1]["lane"] == lane and known[-1]["digest"] == digest:
        host.noop(f"lane {lane}'s plan {digest} is known good #{known[-1]['number']}")
        return
    files = gathered(host, SnapshotFiles, path=canary.snapshot) if canary.pp is not None else {}
    arguments = progress.op_arguments()
    name = host.name

    def say(line: str) -> None:
        logger.info(f"    [{name}] {line}")

    def check(state, host) -> bool:
        base, source = bench_canary.baseline(canary, known)
        try:
            tokenizer = bench_canary.tokenizer_for(host, canary, files)
        except BenchError as exc:
            logger.error(f"    [{name}] lane {lane}: the canary cannot be measured ({exc}): plan {digest} "
                         "serves, not known good")
            return False
        try:
            measured = bench_canary.measure(canary, tokenizer, say)
        except BenchError as exc:
            failed, measured = [f"a canary request failed: {exc}"], None
        else:
            failed, said = bench_canary.compare(measured, base, canary.decode_tolerance, canary.ttft_tolerance)
            say(f"canary against {source}: " + ("; ".join(said) or "nothing to compare: these numbers are the baseline"))
        if not failed:
            why = f"it served, warm, after a converge; canary {bench_canary.describe(measured)}"
            promote = serving.runner(lane, "promote", str(keep), why, json.dumps(measured, sort_keys=True))
            return progress.run_printed(state, host, promote, arguments)
        why = "failed its canary: " + "; ".join(failed)
        progress.run_printed(state, host, serving.runner(lane, "rollback", str(ready_timeout), why), arguments)
        logger.error(f"    [{name}] lane {lane}: plan {digest} {why}; rolled back (above: what serves now "
                     "and where its logs are kept)")
        return False

    check.__name__ = f"canary of lane {lane}, then promote or roll back"
    yield FunctionCommand(check, (), {})
