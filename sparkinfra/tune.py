"""
GMU bracketing on a cluster (``deploys/tune.py``): start the lane with the memory knob at a value,
read vLLM's start-up outcome from every rank's log (``vllm_log.parse_startup``), and move the knob as
the reported GiB say (``gmu.bracket``) until the highest value that boots with a KV pool of the
lane's ``max_model_len`` is known. Each start is a trial (``lane_ctl.py trial``): trial containers
with the lane's plan and the knob changed, the lane's units stopped meanwhile.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pyinfra.api import StringCommand
from pyinfra.api.exceptions import OperationError, PyinfraError

from . import gmu, lanes, serving, vllm_log
from .cluster_lane import ClusterLane
from .settings import SERVE_KEYS
from .facts.lane import LaneStatus

KNOBS = {"gpu_memory_utilization": gmu.GMU, "VLLM_CPU_KVCACHE_SPACE": gmu.CPU_KV_SPACE}


class TuneRefused(PyinfraError):
    """The lane cannot be bracketed (said before anything starts)."""


@dataclass
class TuneJob:
    cluster: str
    lane: str
    knob: gmu.Knob
    trial_knob: str  # what lane_ctl's trial sets: a --flag or an env variable
    start: float
    required_tokens: int
    max_starts: int
    timeout: int
    results_dir: str
    restore: bool  # the lane was serving: start it again afterwards
    timestamp: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))

    @property
    def folder(self) -> Path:
        return Path(self.results_dir) / self.cluster / self.lane / f"tune-{self.timestamp}"


def job_for(host, cluster, on: ClusterLane | None) -> TuneJob:
    """The bracketing of the cluster's lane (``on``: it on the cluster, None: none), from its settings
    (``tune_*``) and the head's facts."""
    config = cluster.config
    if on is None:
        raise TuneRefused(f"cluster {cluster.name} serves no lane (settings: lane)")
    lane = on.lane
    required = lane.serve.get("max_model_len")
    if not isinstance(required, int):
        raise TuneRefused(f"{lanes.lane_source(lane)}: serve.max_model_len is not set: the KV pool it needs is unknown")
    name = config.tune_knob
    knob = KNOBS[name]
    if config.tune_max is not None:
        knob = dataclasses.replace(knob, hi=config.tune_max)
    if config.tune_start is not None:
        start = config.tune_start
    elif name == "gpu_memory_utilization":
        start = on.gmu
    else:
        env = {**lane.env, **config.lane_env}
        if name not in env:
            raise TuneRefused(f"lane {lane.name} sets no {name} (lane env or settings lane_env): set tune_start")
        start = float(env[name])
    if not knob.lo <= start <= knob.hi:
        raise TuneRefused(f"tune_start {start} is outside {knob.name}'s range {knob.lo}..{knob.hi} (settings: tune_max)")
    status = host.get_fact(LaneStatus, lane=lane.name, probe=False) or {}
    return TuneJob(
        cluster=cluster.name, lane=lane.name, knob=knob, trial_knob=_trial_knob(name), start=start,
        required_tokens=required, max_starts=config.tune_max_starts, timeout=config.lane_ready_timeout,
        results_dir=config.results_dir, restore=status.get("unit") == "active",
    )


def _trial_knob(name: str) -> str:
    """What a trial sets for knob ``name``: the ``vllm serve`` flag its setting renders, else the
    environment variable of that name."""
    flag = next((flag for flag, key in SERVE_KEYS.items() if key == name), None)
    return f"--{flag.replace('_', '-')}" if flag else name


def trial(host, job: TuneJob, value: float, number: int, log) -> vllm_log.Outcome:
    """One start at ``value`` on every rank; its log is kept in the job's folder."""
    text_value = job.knob.format(value)
    command = serving.runner(job.lane, "trial", job.trial_knob, text_value, str(job.timeout))
    ok, output = host.run_shell_command(command, _sudo=True, _timeout=job.timeout + 600)
    text = output.output
    (job.folder / f"start-{number}-{text_value}.log").write_text(text + "\n")
    if not ok:
        raise OperationError(f"trial start {job.knob.name}={text_value} could not run: {text[-600:]}")
    outcome = vllm_log.parse_startup(text)
    verdict = next((line for line in text.splitlines() if line.startswith("=== trial")), "")
    log(f"start {number}: {job.knob.name}={text_value}: {outcome.kind}"
        + (f", pool {outcome.pool_tokens():,} tokens" if outcome.pool_tokens() is not None else "")
        + (f", short by {outcome.shortfall_gib} GiB" if outcome.shortfall_gib is not None else "")
        + (f" ({verdict[4:]})" if verdict else ""))
    return outcome


def run_from_deploy(state, host, job: TuneJob) -> bool:
    """The bracketing as a pyinfra ``python.call``; the suggestion goes to the output and the job's folder."""
    from pyinfra import logger

    def log(line: str) -> None:
        logger.info(f"    [{host.name}] {line}")

    job.folder.mkdir(parents=True, exist_ok=True)
    starts = []

    def try_start(value: float) -> vllm_log.Outcome:
        starts.append(value)
        return trial(host, job, value, len(starts), log)

    try:
        result = gmu.bracket(job.knob, job.start, try_start, job.required_tokens, max_starts=job.max_starts)
    finally:
        if job.restore:
            log(f"lane {job.lane} serves again with its settings")
            unit = serving.unit_name(job.lane)
            wait = serving.runner(job.lane, "wait-ready", str(job.timeout))
            host.run_shell_command(StringCommand("systemctl", "restart", unit, "&&", wait), _sudo=True,
                                   _timeout=job.timeout + 120)
    text = gmu.suggestion_text(result, job.cluster, job.lane)
    (job.folder / "suggestion.txt").write_text(text)
    log(f"{result.status} after {result.starts} starts; put in the cluster's group_data "
        f"({job.folder / 'suggestion.txt'}):")
    for line in text.splitlines():
        log(f"  {line}")
    if result.value is None:
        raise OperationError(f"no {job.knob.name} boots lane {job.lane} with its max_model_len: see {job.folder}")
    return True
