"""
vLLM start-up outcomes, read from a start's log (``parse_startup``): which side of the memory
knife edge a start fell on, with vLLM's own numbers.

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

import re
from dataclasses import dataclass, field
from typing import Literal

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
        for _, m in low:
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
