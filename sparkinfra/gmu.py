"""
vLLM start-up outcomes, and the bracketing of the memory knob that sizes the KV pool.

``gpu_memory_utilization`` is a knife edge on a GB10 (seed 001): 0.93 failed vLLM's start-up
free-memory check by 0.02 GiB, 0.925 booted with a KV pool below the lane's 196,608 tokens, 0.929
booted. vLLM says which side a start fell on, with numbers: too high reports the free memory and
what was requested, too low reports the KV memory needed and available (or the pool in tokens).
``parse_startup`` reads that from a start's log; ``next_value``/``bracket`` turn a few starts
into the highest value that boots with a big enough pool.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from .vllm_log import Outcome

Kind = Literal["ok", "too_high", "too_low", "other_failure", "incomplete"]


@dataclass(frozen=True)
class Knob:
    """
    The setting that sizes the KV pool. ``unit`` is ``fraction`` (of the device's total memory)
    or ``GiB``; ``hi`` is the most the operator allows (tried when no start was too high yet);
    ``margin`` (knob units) is kept below the edge a too-high start reports; ``setting`` is the
    per-cluster settings line that holds a value (``{value}`` stands for it).
    """

    name: str
    unit: Literal["fraction", "GiB"]
    lo: float
    hi: float
    resolution: float
    margin: float = 0.0
    setting: str = "{name} = {value}"

    def setting_line(self, value: float) -> str:
        return self.setting.format(name=self.name, value=self.format(value))

    @property
    def decimals(self) -> int:
        return max(0, -Decimal(str(self.resolution)).normalize().as_tuple().exponent)

    def snap(self, value: float, how: Literal["down", "up", "nearest"] = "nearest") -> float:
        """``value`` on the knob's grid (multiples of ``resolution``)."""
        steps = value / self.resolution
        fn = {"down": math.floor, "up": math.ceil, "nearest": round}[how]
        steps = fn(steps + (1e-6 if how == "down" else -1e-6 if how == "up" else 0))
        return round(steps * self.resolution, self.decimals)

    def format(self, value: float) -> str:
        return f"{value:.{self.decimals}f}"


# vLLM's gpu_memory_utilization: a fraction of the device's total memory.
GMU = Knob("gpu_memory_utilization", "fraction", lo=0.10, hi=0.95, resolution=0.001, margin=0.0005)


# The CPU build's KV cache size: VLLM_CPU_KVCACHE_SPACE is read with int() (whole GiB only);
# ``--kv-cache-memory-bytes`` takes bytes where finer steps are needed.
CPU_KV_SPACE = Knob(
    "VLLM_CPU_KVCACHE_SPACE", "GiB", lo=1, hi=16, resolution=1, margin=0.5,
    setting='lane_env = {{"{name}": "{value}"}}',
)


def _good(outcome: Outcome, required_tokens: int) -> bool:
    pool = outcome.pool_tokens()
    return outcome.kind == "ok" and (pool is None or pool >= required_tokens)


def _low(outcome: Outcome, required_tokens: int) -> bool:
    pool = outcome.pool_tokens()
    return outcome.kind == "too_low" or (outcome.kind == "ok" and pool is not None and pool < required_tokens)


def _units_per_gib(knob: Knob, history: list[tuple[float, Outcome]]) -> float | None:
    """Knob units per GiB: 1 for a GiB knob, 1/total memory for a fraction."""
    if knob.unit == "GiB":
        return 1.0
    for value, o in reversed(history):
        if o.total_gib:
            return 1.0 / o.total_gib
        if o.requested_gib and value > 0:
            return value / o.requested_gib
    return None


def _predicted_top(knob: Knob, history: list[tuple[float, Outcome]]) -> float | None:
    """Highest value the latest too-high start says would pass: value - shortfall - margin."""
    per_gib = _units_per_gib(knob, history)
    for value, o in reversed(history):
        if o.kind == "too_high" and o.shortfall_gib is not None and per_gib:
            return knob.snap(value - o.shortfall_gib * per_gib - knob.margin, "down")
    return None


def _predicted_need(knob: Knob, history: list[tuple[float, Outcome]], required_tokens: int) -> float | None:
    """Lowest value the too-low starts say could hold ``required_tokens``."""
    per_gib = _units_per_gib(knob, history)
    needs = []
    for value, o in history:
        if not _low(o, required_tokens):
            continue
        tokens = o.needed_tokens or o.max_model_len or required_tokens
        if o.kv_needed_gib and o.kv_available_gib is not None and per_gib:
            need_gib = o.kv_needed_gib * required_tokens / tokens
            needs.append(value + (need_gib - o.kv_available_gib) * per_gib)
        elif (pool := o.pool_tokens()) and value > 0:
            needs.append(value * required_tokens / pool)  # pool taken as proportional to the knob
        elif o.kv_available_gib is not None and o.kv_available_gib < 0 and per_gib:
            needs.append(value - o.kv_available_gib * per_gib)  # at least the deficit
    return max(needs) if needs else None


def next_value(knob: Knob, history: list[tuple[float, Outcome]], required_tokens: int) -> float | None:
    """
    The next value to start with, or None when done: the highest value that boots with a pool of
    at least ``required_tokens`` is known within ``resolution``, or nothing can be learned
    (the last start failed otherwise, or no value between the known-low and known-high ones is
    left / predicted to boot).

    A start that is too high reports the free memory: the next one goes to the edge that implies
    (shortfall / total memory, less the margin), then one step above a good one confirms the edge.
    With no too-high start yet, the top of the knob's range is tried: the free-memory check fails
    within seconds, before weights load, and names the edge. Without numbers: bisection between
    the best known-good (or known-low, or predicted need) and the lowest known-high value.
    """
    if not history:
        raise ValueError("next_value needs at least one start in the history")
    if history[-1][1].kind in ("other_failure", "incomplete"):
        return None
    res, eps = knob.resolution, knob.resolution * 1e-3
    best = max((v for v, o in history if _good(o, required_tokens)), default=None)
    low = max((v for v, o in history if _low(o, required_tokens)), default=None)
    upper = min((v for v, o in history if o.kind == "too_high"), default=None)
    if best is not None and (best >= knob.hi - eps or (upper is not None and upper - best <= res + eps)):
        return None

    floor = max((x for x in (best, low) if x is not None), default=None)
    lo = knob.snap(knob.lo if floor is None else floor + res, "up")
    hi = knob.snap(knob.hi if upper is None else upper - res, "down")
    if lo > hi + eps:
        return None
    if upper is None:
        return hi

    top = _predicted_top(knob, history)
    if top is not None:
        if floor is None or top > floor + eps:
            return min(max(top, lo), hi)
        return lo if best is not None else None  # confirm the edge; or: what boots is too small
    need = _predicted_need(knob, history, required_tokens) if best is None else None
    bottom = max(lo, knob.snap(need, "up")) if need is not None and knob.snap(need, "up") <= hi else lo
    return min(max(knob.snap((bottom + hi) / 2), lo), hi)


Status = Literal["bracketed", "top_of_range", "infeasible", "stopped", "max_starts"]


@dataclass
class Result:
    """
    A bracketing: ``value`` is the highest start that booted with the pool (None if none did),
    ``upper`` the lowest that was too high; ``evidence`` the log lines of the starts that bound it.
    """

    knob: Knob
    value: float | None
    upper: float | None
    status: Status
    starts: int
    required_tokens: int
    history: list[tuple[float, Outcome]]
    evidence: list[str]


def _summarize(
    knob: Knob, history: list[tuple[float, Outcome]], required_tokens: int, pending: float | None
) -> Result:
    res = knob.resolution
    goods = [(v, o) for v, o in history if _good(o, required_tokens)]
    highs = [(v, o) for v, o in history if o.kind == "too_high"]
    lows = [(v, o) for v, o in history if _low(o, required_tokens)]
    best = max(goods, key=lambda item: item[0], default=None)
    upper = min(highs, key=lambda item: item[0], default=None)
    if pending is not None:
        status: Status = "max_starts"
    elif history and history[-1][1].kind in ("other_failure", "incomplete"):
        status = "stopped"
    elif best and upper and upper[0] - best[0] <= res * 1.001:
        status = "bracketed"
    elif best and best[0] >= knob.hi - res * 1e-3:
        status = "top_of_range"
    else:
        status = "infeasible"

    bounds = []
    if status == "stopped":
        bounds = [history[-1]]
    else:
        bounds = [x for x in (best or max(lows, key=lambda item: item[0], default=None), upper) if x]
    evidence = [line for _, o in bounds for line in o.evidence]
    return Result(
        knob=knob,
        value=best[0] if best else None,
        upper=upper[0] if upper else None,
        status=status,
        starts=len(history),
        required_tokens=required_tokens,
        history=list(history),
        evidence=evidence,
    )


def bracket(
    knob: Knob,
    start: float,
    try_start: Callable[[float], Outcome],
    required_tokens: int,
    max_starts: int = 6,
) -> Result:
    """
    Start vLLM through ``try_start(value) -> Outcome`` (e.g. launch, then ``parse_startup`` on the
    log) from ``start`` until ``next_value`` is done or ``max_starts`` starts were made.
    """
    history: list[tuple[float, Outcome]] = []
    value: float | None = knob.snap(min(max(start, knob.lo), knob.hi))
    while value is not None and len(history) < max_starts:
        history.append((value, try_start(value)))
        value = next_value(knob, history, required_tokens)
    return _summarize(knob, history, required_tokens, value)


def _describe(knob: Knob, value: float, o: Outcome) -> str:
    v = knob.format(value)
    if o.kind == "too_high":
        short = f"{o.shortfall_gib:.2f} GiB" if o.shortfall_gib is not None else "?"
        return f"{v} fails the start-up free-memory check (short by {short})"
    pool = o.pool_tokens()
    pool_text = f"a {pool:,}-token KV pool" if pool is not None else "an unreported KV pool"
    if o.kind == "ok":
        return f"{v} boots with {pool_text}"
    if o.kind == "too_low":
        return f"{v} is too small ({pool_text})"
    return f"{v}: {o.kind.replace('_', ' ')}"


def suggestion_text(result: Result, cluster: str, lane: str) -> str:
    """
    A per-cluster setting line for the lane, with why, and the evidence log lines as comments::

        gpu_memory_utilization = 0.929  # cluster pair-a, lane balanced: 0.929 boots with ...
    """
    knob, req = result.knob, result.required_tokens
    by_value = {v: o for v, o in result.history}
    where = f"cluster {cluster}, lane {lane}"
    reasons = []
    if result.value is not None:
        reasons.append(_describe(knob, result.value, by_value[result.value]) + f" (>= {req:,} needed)")
    if result.upper is not None:
        reasons.append(_describe(knob, result.upper, by_value[result.upper]))

    if result.status in ("bracketed", "top_of_range"):
        head = f"{knob.setting_line(result.value)}  # {where}: " + "; ".join(reasons)
    elif result.status == "max_starts" and result.value is not None:
        head = (
            f"{knob.setting_line(result.value)}  # {where}: not settled after "
            f"{result.starts} starts: " + "; ".join(reasons)
        )
    elif result.status == "stopped":
        value, o = result.history[-1]
        ended = o.kind.replace("_", " ")
        head = f"# {knob.name}: no setting for {where}: the start at {knob.format(value)} ended {ended}"
    else:
        lows = [v for v, o in result.history if _low(o, req)]
        detail = f"; {_describe(knob, max(lows), by_value[max(lows)])}" if lows else ""
        head = f"# {knob.name}: no value boots with a {req:,}-token KV pool on {where}" + detail
        if result.upper is not None:
            head += f"; {_describe(knob, result.upper, by_value[result.upper])}"

    tried = ", ".join(f"{knob.format(v)} {o.kind}" for v, o in result.history)
    out = [head, f"# starts ({result.starts}): {tried}"]
    if result.evidence:
        out.append("# evidence:")
        out += [f"#   {line}" for line in result.evidence]
    return "\n".join(out) + "\n"
