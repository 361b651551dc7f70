"""
vLLM start-up outcomes, and the bracketing of the memory knob that sizes the KV pool.

``gpu_memory_utilization`` is a knife edge on a GB10 (seed 001): 0.93 failed vLLM's start-up
free-memory check by 0.02 GiB, 0.925 booted with a KV pool below the lane's 196,608 tokens, 0.929
booted. vLLM says which side a start fell on, with numbers: too high reports the free memory and
what was requested, too low reports the KV memory needed and available (or the pool in tokens).
``parse_startup`` reads that from a start's log; ``next_value``/``bracket`` turn a few starts
into the highest value that boots with a big enough pool.

Message formats, from vLLM's own source (``format_gib`` rounds to 2 decimals everywhere):

- too high, GPU: ``Free memory on device cuda:0 (F/T GiB) on startup is less than desired GPU
  memory utilization (U, R GiB). ...`` (``vllm/v1/worker/utils.py`` ``request_memory``, 0.21-0.32;
  older V1 releases wrote ``Free memory on device (F/T GiB)`` in ``gpu_worker.py``); 0.32 adds
  ``... is less than the engine's budget after excluding external process's weights (U, R GiB)``.
- too high, CPU build: ``Available memory on node N (F/T GiB) on startup is less than desired CPU
  memory utilization (U, R GiB)`` and, for an explicit KV size (``VLLM_CPU_KVCACHE_SPACE``),
  ``... on kv cache allocation is less than requested memory for kv (R GiB)``
  (``vllm/v1/worker/cpu_worker.py``).
- too low: ``To serve at least one request with the model's max seq len (X), (N GiB KV cache is
  needed, which is larger than the available KV cache memory (A GiB). Based on the available
  memory, the estimated maximum model length is E. ...`` (``vllm/v1/core/kv_cache_utils.py``;
  ``models's`` up to 0.21); ``No available memory for the cache blocks`` when nothing is left;
  V0 engines: ``The model's max seq len (X) is larger than the maximum number of tokens that can be
  stored in KV cache (Y)`` (``vllm/worker/worker.py``).
- booted: ``GPU KV cache size: N tokens`` (0.21-0.23, also on CPU), ``CPU KV cache size: N tokens,
  Maximum concurrency for ...`` (0.32), then uvicorn's ``Application startup complete.``
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Callable, Literal

Kind = Literal["ok", "too_high", "too_low", "other_failure", "incomplete"]

_NUM = r"-?\d+(?:\.\d+)?(?:e-?\d+)?"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# Too high: the start-up free-memory checks (GPU: utils.request_memory / gpu_worker; CPU: cpu_worker).
_GPU_FREE = re.compile(
    rf"Free memory on device(?: (?P<device>\S+))? \((?P<free>{_NUM})/(?P<total>{_NUM}) GiB\) on startup "
    r"is less than (?:desired GPU memory utilization|the engine's budget after excluding external "
    rf"process's weights) \((?P<gmu>{_NUM}), (?P<requested>{_NUM}) GiB\)"
)
_CPU_FREE = re.compile(
    rf"Available memory on node (?P<node>\d+) \((?P<free>{_NUM})/(?P<total>{_NUM}) GiB\) on startup "
    rf"is less than desired CPU memory utilization \((?P<gmu>{_NUM}), (?P<requested>{_NUM}) GiB\)"
)
_CPU_KV_ALLOC = re.compile(
    rf"Available memory on node (?P<node>\d+) \((?P<free>{_NUM})/(?P<total>{_NUM}) GiB\) on kv cache "
    rf"allocation is less than requested memory for kv \((?P<requested>{_NUM})(?:/(?P<budget>{_NUM}))? GiB\)"
)
# Too low: the KV pool cannot hold one request of max_model_len.
_V1_TOO_LOW = re.compile(
    r"To serve at least one request with the models?'s max seq len \((?P<max_len>\d+)\),? \(?"
    rf"(?P<needed>{_NUM}) GiB KV cache is needed, which is larger than the available KV cache memory "
    rf"\((?P<available>{_NUM}) GiB\)\.?(?: Based on the available memory, the estimated maximum "
    r"model length is (?P<estimate>\d+)\.)?"
)
_V0_TOO_LOW = re.compile(
    r"The model's max seq len \((?P<max_len>\d+)\) is larger than the maximum number of tokens that "
    r"can be stored in KV cache \((?P<tokens>\d+)\)"
)
_NO_CACHE_MEMORY = re.compile(
    r"No available memory for the cache blocks|Cannot auto-fit max_model_len: not enough GPU memory"
)
# Facts of a start that went through.
_KV_SIZE = re.compile(r"\b(?P<pool>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens")
_CONCURRENCY = re.compile(rf"Maximum concurrency for (?P<max_len>[\d,]+) tokens per request: (?P<x>{_NUM})x")
_AVAILABLE_KV = re.compile(rf"Available KV cache memory: (?P<gib>{_NUM}) GiB")
_CPU_KV_SET = re.compile(
    rf"(?:Explicitly|Auto) set \((?P<gib>{_NUM})/(?P<total>{_NUM})\) GiB for KV cache on node \d+"
)
_AUTO_FIT = re.compile(r"Auto-fit max_model_len: reduced from (?P<old>\d+) to (?P<new>\d+)")
_STARTED = re.compile(r"Application startup complete")
# Context.
_VERSION = re.compile(
    r"Initializing an? (?:V\d )?LLM engine \(v(?P<v>[^)\s]+)\)|vLLM (?:API )?server version (?P<v2>[^\s,]+)"
)
_GMU_ARG = re.compile(rf"'gpu_memory_utilization': (?P<gmu>{_NUM})|--gpu-memory-utilization[= ](?P<gmu2>{_NUM})")
_MAX_SEQ = re.compile(r"\bmax_seq_len=(?P<n>\d+)")
# Anything else that ends a start.
_ERROR = re.compile(r"\b[A-Za-z_][\w.]*(?:Error|Exception)(?:\([^)]*\))?: \S")
_FATAL = re.compile(
    r"EngineCore failed to start|Engine core initialization failed|WorkerProc failed to start|"
    r"CUDA out of memory|OutOfMemoryError|Traceback \(most recent call last\)"
)


@dataclass
class Outcome:
    """
    What one start of vLLM came to, read from its log.

    kind: ``ok`` (serving), ``too_high`` (start-up free-memory check failed), ``too_low`` (KV pool
    cannot hold one request of max_model_len), ``other_failure``, ``incomplete`` (no verdict yet).
    Sizes are in GiB as vLLM printed them (2 decimals); ``shortfall_gib`` is requested - free (too
    high) or needed - available KV memory (too low). ``kv_tokens`` is the pool in tokens: the
    ``KV cache size`` line, the V0 message's ``KV cache (Y)``, or the V1 message's estimated
    maximum model length. ``evidence`` holds the log lines the verdict rests on (ANSI codes removed).
    """

    kind: Kind
    gmu: float | None = None
    shortfall_gib: float | None = None
    free_gib: float | None = None
    total_gib: float | None = None
    requested_gib: float | None = None
    kv_tokens: int | None = None
    kv_available_gib: float | None = None
    kv_needed_gib: float | None = None
    needed_tokens: int | None = None
    max_model_len: int | None = None
    version: str | None = None
    evidence: list[str] = field(default_factory=list)

    def pool_tokens(self) -> int | None:
        """The pool in tokens: logged, else needed tokens scaled by available/needed KV memory."""
        if self.kv_tokens is not None:
            return self.kv_tokens
        tokens = self.needed_tokens or self.max_model_len
        if tokens and self.kv_needed_gib and self.kv_available_gib is not None and self.kv_needed_gib > 0:
            return max(0, int(tokens * self.kv_available_gib / self.kv_needed_gib))
        return None


def _clean(line: str) -> str:
    return _ANSI.sub("", line).replace("\r", "").rstrip()


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_startup(log_text: str) -> Outcome:
    """
    Read one start's log (head and worker logs may be concatenated) into an ``Outcome``.

    A too-high or too-low message decides, wherever it appears (the worst shortfall wins when
    several ranks report); else ``Application startup complete`` means ok; else an error or a
    traceback means other_failure; else the start is incomplete.
    """
    lines = [_clean(line) for line in log_text.splitlines()]
    high: list[tuple[float, str, re.Match]] = []
    low: list[tuple[str, re.Match]] = []
    info: dict[str, object] = {}
    info_lines: dict[str, str] = {}
    errors: list[str] = []
    seen: set[str] = set()

    def first(key: str, value: object, line: str) -> None:
        if key not in info:
            info[key] = value
            info_lines[key] = line

    for line in lines:
        if not line.strip():
            continue
        for pattern in (_GPU_FREE, _CPU_FREE, _CPU_KV_ALLOC):
            m = pattern.search(line)
            if m and m.group(0) not in seen:
                seen.add(m.group(0))
                requested = float(m["requested"])
                if pattern is _CPU_KV_ALLOC and requested <= 0:
                    low.append((line, m))  # the utilization budget does not even cover the weights
                else:
                    high.append((requested - float(m["free"]), line, m))
        for pattern in (_V1_TOO_LOW, _V0_TOO_LOW, _NO_CACHE_MEMORY):
            m = pattern.search(line)
            if m and m.group(0) not in seen:
                seen.add(m.group(0))
                low.append((line, m))
        if m := _KV_SIZE.search(line):
            tokens = _int(m["tokens"])
            if "kv_tokens" not in info or tokens < info["kv_tokens"]:  # several engines: the smallest
                info["kv_tokens"], info_lines["kv_tokens"] = tokens, line
        if m := _CONCURRENCY.search(line):
            first("concurrency", (_int(m["max_len"]), float(m["x"])), line)
        if m := _AVAILABLE_KV.search(line):
            first("kv_available", float(m["gib"]), line)
        if m := _CPU_KV_SET.search(line):
            first("kv_available", float(m["gib"]), line)
            first("total", float(m["total"]), line)
        if m := _AUTO_FIT.search(line):
            first("auto_fit", _int(m["new"]), line)
        if _STARTED.search(line):
            first("started", True, line)
        if m := _VERSION.search(line):
            first("version", m["v"] or m["v2"], line)
        if m := _GMU_ARG.search(line):
            first("gmu", float(m["gmu"] or m["gmu2"]), line)
        if m := _MAX_SEQ.search(line):
            first("max_seq", int(m["n"]), line)
        if (_ERROR.search(line) or _FATAL.search(line)) and line not in errors:
            errors.append(line)

    outcome = Outcome(kind="incomplete", version=info.get("version"), gmu=info.get("gmu"))
    outcome.max_model_len = info.get("auto_fit") or info.get("max_seq")
    if "concurrency" in info and not outcome.max_model_len:
        outcome.max_model_len = info["concurrency"][0]

    if high:
        shortfall, line, m = max(high, key=lambda item: item[0])
        outcome.kind = "too_high"
        outcome.shortfall_gib = round(shortfall, 2)
        outcome.free_gib, outcome.total_gib = float(m["free"]), float(m["total"])
        outcome.requested_gib = float(m["requested"])
        if "gmu" in m.re.groupindex:
            outcome.gmu = float(m["gmu"])
        outcome.evidence = [line for _, line, _ in high]
        return outcome

    if low:
        outcome.kind = "too_low"
        outcome.evidence = [line for line, _ in low]
        for line, m in low:
            if m.re is _V1_TOO_LOW:
                outcome.max_model_len = outcome.needed_tokens = int(m["max_len"])
                outcome.kv_needed_gib, outcome.kv_available_gib = float(m["needed"]), float(m["available"])
                outcome.shortfall_gib = round(outcome.kv_needed_gib - outcome.kv_available_gib, 2)
                if m["estimate"]:
                    outcome.kv_tokens = int(m["estimate"])
            elif m.re is _V0_TOO_LOW:
                outcome.max_model_len = outcome.needed_tokens = int(m["max_len"])
                outcome.kv_tokens = int(m["tokens"])
            elif m.re is _CPU_KV_ALLOC:
                outcome.free_gib, outcome.total_gib = float(m["free"]), float(m["total"])
                outcome.requested_gib = float(m["budget"]) if m["budget"] else None
                outcome.kv_available_gib = float(m["requested"])
            elif outcome.kv_tokens is None:
                outcome.kv_tokens = 0
        if outcome.kv_available_gib is None and "kv_available" in info:
            outcome.kv_available_gib = info["kv_available"]
            outcome.evidence.insert(0, info_lines["kv_available"])
        outcome.total_gib = outcome.total_gib or info.get("total")
        return outcome

    if "started" in info:
        outcome.kind = "ok"
        if "kv_tokens" in info:
            outcome.kv_tokens = info["kv_tokens"]
        elif "concurrency" in info:
            max_len, x = info["concurrency"]
            outcome.kv_tokens = int(max_len * x)
        outcome.kv_available_gib = info.get("kv_available")
        outcome.total_gib = info.get("total")
        keys = ("kv_available", "auto_fit", "kv_tokens", "concurrency", "started")
        outcome.evidence = list(dict.fromkeys(info_lines[k] for k in keys if k in info_lines))
        return outcome

    if errors:
        outcome.kind = "other_failure"
        specific = [line for line in errors if _ERROR.search(line)]
        outcome.evidence = (specific or errors)[:3]
        return outcome

    last = next((line for line in reversed(lines) if line.strip()), None)
    outcome.evidence = [last] if last else []
    return outcome


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
