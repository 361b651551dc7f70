"""
A changed lane's canary, from the controller (``operations.lane.lane_known_good``): once the new plan
serves and is warm, the seeds' probes (JSON and code, thinking off, one warm-up each, then ``runs``
each) and a short llama-benchy subset (the first ``bench_pp``/``bench_tg`` shape, depth 0, one user,
``runs`` runs), each measure the median of its runs:

    {"decode_tps": {"json": 41.2, "code": 40.8}, "ttft_ms": 212.0, "tg_tps": 40.1,
     "shape": {"max_tokens": 256, "pp": 2048, "tg": 32, "runs": 3}}

compared with the lane's baseline: a bench result the settings name (``canary_baseline``), else the
canary of the lane's newest known good set measured on the same shape. Decode tok/s may fall by the
lane's ``canary.decode_tolerance``, TTFT rise by its ``canary.ttft_tolerance``; past either, the
change is rolled back. No baseline: the numbers become the first one.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .benchy import benchy_command
from .job import copy_tokenizer, seed_book, snapshot_of, tokenizer_names
from .probes import BenchError, probe, template_kwargs, warmup
from .report import load_results


@dataclass(frozen=True)
class Canary:
    """What a lane's canary measures, where, and what it may lose."""

    lane: str
    base_url: str
    served_model: str
    api_key_env: str
    switch: dict  # the lane's thinking switch (off for every request)
    workloads: tuple[str, ...]
    max_tokens: int
    runs: int
    pp: int | None  # None: no llama-benchy subset (bench_pp empty), no TTFT
    tg: int
    book: str
    coherence: bool
    decode_tolerance: float
    ttft_tolerance: float
    baseline_results: str  # a bench result folder ("": the newest known good set's canary)
    model: str
    revision: str
    snapshot: str  # the staged snapshot on the head (its tokenizer, for llama-benchy)

    @property
    def shape(self) -> dict:
        return {"max_tokens": self.max_tokens, "pp": self.pp, "tg": self.tg, "runs": self.runs}


def of_lane(on) -> Canary:
    """The canary of ``on`` (a ``cluster_lane.ClusterLane``), from the cluster's settings and the lane's
    (its tolerances, unless the cluster's settings override them)."""
    config, lane = on.cluster.config, on.lane
    revision, snapshot = snapshot_of(on.cluster, lane.model)
    return Canary(
        lane=lane.name, base_url=on.api_url, served_model=on.served_name, api_key_env=config.api_key_env,
        switch=lane.thinking.model_dump(), workloads=tuple(config.bench_workloads),
        max_tokens=config.canary_max_tokens, runs=config.canary_runs,
        pp=config.bench_pp[0] if config.bench_pp else None, tg=config.bench_tg[0],
        book=config.bench_book, coherence=config.bench_coherence,
        decode_tolerance=lane.canary.decode_tolerance if config.canary_decode_tolerance is None
        else config.canary_decode_tolerance,
        ttft_tolerance=lane.canary.ttft_tolerance if config.canary_ttft_tolerance is None else config.canary_ttft_tolerance,
        baseline_results=config.canary_baseline, model=lane.model, revision=revision, snapshot=snapshot,
    )


# Measuring
# ---------


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def measure(c: Canary, tokenizer: Path | None, log=print) -> dict:
    """The canary's numbers (medians of ``c.runs``); raises ``BenchError`` when a request or
    llama-benchy fails (a failed canary as well)."""
    key = os.environ.get(c.api_key_env, "") if c.api_key_env else ""
    if c.api_key_env and not key:
        raise BenchError(f"the controller's environment has no {c.api_key_env} (settings: api_key_env)")
    warmup(c.base_url, c.served_model, key, c.workloads, (False,), c.max_tokens, switch=c.switch)
    decode = {}
    for workload in c.workloads:
        done = probe(c.base_url, c.served_model, key, workload, False, c.runs, c.max_tokens, switch=c.switch)
        if all(p["completion_tokens"] == 0 for p in done):
            raise BenchError(f"the {workload} probe answered no tokens")
        decode[workload] = _median([p["decode_tps"] for p in done if p["decode_tps"]])
    measured = {"decode_tps": decode, "ttft_ms": None, "tg_tps": None, "shape": c.shape}
    if c.pp is not None and tokenizer is not None:
        measured.update(_benchy(c, tokenizer))
    log("canary: " + describe(measured))
    return measured


def _benchy(c: Canary, tokenizer: Path) -> dict:
    """TTFT (ms) and decode tok/s of one llama-benchy shape at depth 0, one user: medians of its runs."""
    with tempfile.TemporaryDirectory(prefix="sparkinfra-canary-") as folder:
        report = Path(folder) / "benchy.json"
        argv = benchy_command(
            c.base_url, c.model, str(tokenizer), [c.pp], [c.tg], [0], [1], api_key_env=c.api_key_env or None,
            save_result=str(report), runs=c.runs, served_model_name=c.served_model, book_url=seed_book(c.book),
            coherence=c.coherence, template_kwargs=template_kwargs(False, c.switch),  # thinking off, as the probes
        )
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
        if done.returncode != 0 or not report.is_file():
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-4:])
            raise BenchError(f"llama-benchy failed (exit {done.returncode}): {tail}")
        return benchy_numbers(json.loads(report.read_text()), c.pp, c.tg)


def benchy_numbers(raw: dict, pp: int, tg: int) -> dict:
    """``ttft_ms`` and ``tg_tps`` (medians of the runs) of the pp/tg, depth 0, one-user row of a
    llama-benchy JSON report; None for what it does not hold."""
    for row in raw.get("benchmarks") or []:
        if (row.get("prompt_size"), row.get("response_size"), row.get("context_size"), row.get("concurrency")) == (
                pp, tg, 0, 1) and not row.get("is_context_prefill_phase"):
            ttfr, tg_rate = row.get("ttfr") or {}, row.get("tg_throughput") or {}
            ttft = _median(ttfr.get("values") or [])
            return {"ttft_ms": None if ttft is None else round(ttft, 1), "tg_tps": _median(tg_rate.get("values") or [])}
    return {"ttft_ms": None, "tg_tps": None}


# The baseline
# ------------


def baseline(c: Canary, known: list[dict]) -> tuple[dict | None, str]:
    """(the numbers to compare with, where they come from): ``c.baseline_results`` (a bench
    result folder), else the canary of the lane's newest known good set (``known``: the head's
    sets, oldest first). (None, why) when there is none."""
    if c.baseline_results:
        return from_results(c.baseline_results, c), f"bench result {c.baseline_results}"
    for meta in reversed(known):
        if meta.get("lane") == c.lane and meta.get("canary"):
            return meta["canary"], f"known good #{meta['number']} (plan {meta['digest']})"
    return None, f"no known good set of lane {c.lane} with canary numbers"


def from_results(folder: str, c: Canary) -> dict:
    """A bench result (``deploys/bench.py``'s folder) as canary numbers: its thinking-off probes'
    decode per workload, and its llama-benchy row of the canary's shape. Raises ``BenchError``
    for a folder that is not one."""
    try:
        meta, probes, _ = load_results(folder)
        raw = json.loads((Path(folder) / "results.json").read_text()).get("benchy_raw") or {}
    except (OSError, ValueError, KeyError) as exc:
        raise BenchError(f"canary_baseline {folder}: not a bench result ({exc})") from None
    if meta.lane != c.lane:
        raise BenchError(f"canary_baseline {folder} measured lane {meta.lane}, not {c.lane}")
    measured = [p for p in probes if p.get("thinking") is False and not p.get("warmup")]
    decode = {w: _median([p["decode_tps"] for p in measured if p["workload"] == w and p.get("decode_tps")])
              for w in sorted({p["workload"] for p in measured})}
    tokens = {p.get("max_tokens") for p in measured}
    shape = {"max_tokens": tokens.pop() if len(tokens) == 1 else None, "pp": c.pp, "tg": c.tg, "runs": None}
    return {"decode_tps": decode, **(benchy_numbers(raw, c.pp, c.tg) if c.pp else {"ttft_ms": None}),
            "shape": shape}


# The verdict
# -----------


def compare(measured: dict, base: dict | None, decode_tolerance: float, ttft_tolerance: float) -> tuple[list[str], list[str]]:
    """(what failed, every comparison in words). A measure the baseline lacks, or a baseline of
    another probe or llama-benchy shape, is not compared (said)."""
    if base is None:
        return [], []
    failed, said = [], []
    ours, theirs = measured.get("shape") or {}, base.get("shape") or {}
    same_probe = ours.get("max_tokens") == theirs.get("max_tokens")
    same_benchy = (ours.get("pp"), ours.get("tg")) == (theirs.get("pp"), theirs.get("tg"))
    if not same_probe:
        said.append(f"decode not compared: the baseline's probes were {theirs.get('max_tokens')} tokens, "
                    f"these {ours.get('max_tokens')}")
    for workload, now in sorted((measured.get("decode_tps") or {}).items()):
        then = (base.get("decode_tps") or {}).get(workload)
        if not same_probe or not then or now is None:
            continue
        change = (now - then) / then
        line = f"decode tok/s ({workload}) {now:.1f}, baseline {then:.1f} ({change:+.0%}, may fall {decode_tolerance:.0%})"
        said.append(line)
        if now < then * (1 - decode_tolerance):
            failed.append(line)
    now, then = measured.get("ttft_ms"), base.get("ttft_ms")
    if now is not None and then and same_benchy:
        change = (now - then) / then
        line = f"TTFT {now:.0f} ms, baseline {then:.0f} ms ({change:+.0%}, may rise {ttft_tolerance:.0%})"
        said.append(line)
        if now > then * (1 + ttft_tolerance):
            failed.append(line)
    return failed, said


def describe(measured: dict) -> str:
    """The numbers in one line."""
    decode = ", ".join(f"{w} {v:.1f}" for w, v in sorted((measured.get("decode_tps") or {}).items()) if v is not None)
    ttft = measured.get("ttft_ms")
    return f"decode tok/s {decode or 'none'}" + (f"; TTFT {ttft:.0f} ms" if ttft is not None else "") + (
        f" (median of {measured['shape']['runs']})" if (measured.get("shape") or {}).get("runs") else "")


def tokenizer_for(host, c: Canary, files: dict[str, int]) -> Path | None:
    """The head's tokenizer files copied to the controller for llama-benchy (None: no subset)."""
    if c.pp is None:
        return None
    return copy_tokenizer(host, c.snapshot, {n: files[n] for n in tokenizer_names(files)}, c.model, c.revision)
