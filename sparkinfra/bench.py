"""
Benchmarks of a serving lane: the seeds' probe protocol, llama-benchy sweeps, and their reports.

Probes (seed 001): ``n`` requests of 256 completion tokens, temperature 0, one at a time, on a
warm engine (``warmup`` burns one request per shape first: the first request after boot pays a
~60 s JIT), JSON and code workloads, thinking set per request through ``chat_template_kwargs``;
decode tok/s = ``completion_tokens / wall``. Sweeps (seeds 002, 004): llama-benchy over prompt
size x depth x concurrency, read back from its ``--format json`` report.

``write_results`` files a run under ``<root>/<cluster>/<lane>/<timestamp>/``: ``results.json``
(meta + raw), ``results.md`` (the seeds' tables) and PNG plots; ``compare`` diffs two runs
(``python -m sparkinfra.bench --compare A B``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pyinfra.api.exceptions import PyinfraError

from . import lanes, serving, transfer
from .facts.lane import LaneStatus
from .facts.nccl import NcclVersion
from .facts.stage import DockerImageId, SnapshotFiles

# Prompts that run past 256 tokens, so every probe decodes the full max_tokens.
WORKLOADS = {
    "json": (
        "Return a JSON array of 12 objects describing fictional servers in a data centre. Each object "
        "has the fields id (integer), hostname, rack, cpu_cores, memory_gib, disks (an array of objects "
        "with device and size_gib) and tags (an array of strings). Output only the JSON, no prose."
    ),
    "code": (
        "Write a Python module implementing a thread-safe LRU cache class with get, put and delete, a "
        "maximum size and per-entry expiry, with type hints and docstrings, followed by pytest tests "
        "covering eviction order and expiry. Output only the code."
    ),
}
THINKING_LABELS = {False: "thinking disabled", True: "thinking enabled", None: "template default"}


class BenchError(Exception):
    """A request to the lane failed (the message never carries the API key)."""


class BenchRefused(PyinfraError):
    """The cluster cannot be benchmarked now (no lane, or not serving): said before anything runs."""


# Probes
# ------


def chat_url(base_url: str) -> str:
    """``.../v1/chat/completions`` for a base URL given with or without ``/v1``."""
    base = base_url.rstrip("/")
    base = base[: -len("/v1")] if base.endswith("/v1") else base
    return f"{base}/v1/chat/completions"


def _post(url: str, body: dict, api_key: str | None, timeout: float) -> tuple[dict, float]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
    except urllib.error.HTTPError as e:
        detail = e.read(300).decode(errors="replace").strip()
        raise BenchError(f"{url}: HTTP {e.code} {e.reason}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise BenchError(f"{url}: {getattr(e, 'reason', e)}") from None
    wall = time.perf_counter() - start
    try:
        return json.loads(payload), wall
    except ValueError:
        raise BenchError(f"{url}: not JSON: {payload[:200]!r}") from None


def request_body(model: str, workload: str, thinking: bool | None, max_tokens: int = 256) -> dict:
    """The chat request of one probe: temperature 0, no streaming, thinking through the chat template."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}: one of {', '.join(WORKLOADS)}")
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": WORKLOADS[workload]}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": False,
    }
    if thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
    return body


def probe(
    base_url: str,
    model: str,
    api_key: str | None,
    workload: str,
    thinking: bool | None,
    n: int,
    max_tokens: int = 256,
    timeout: float = 600.0,
) -> list[dict]:
    """
    ``n`` single-stream probes of one shape; one dict each: workload, thinking, run, prompt and
    completion tokens (the server's ``usage``), wall seconds, ``decode_tps`` and finish reason.
    ``thinking``: False/True sets ``enable_thinking``; None leaves the template's default.
    """
    url, body = chat_url(base_url), request_body(model, workload, thinking, max_tokens)
    out = []
    for run in range(n):
        reply, wall = _post(url, body, api_key, timeout)
        usage = reply.get("usage") or {}
        completion = usage.get("completion_tokens")
        if completion is None:
            raise BenchError(f"{url}: reply has no usage.completion_tokens")
        choice = (reply.get("choices") or [{}])[0]
        out.append({
            "workload": workload,
            "thinking": thinking,
            "run": run,
            "max_tokens": max_tokens,
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": completion,
            "wall_s": round(wall, 4),
            "decode_tps": round(completion / wall, 3) if wall > 0 else None,
            "finish_reason": choice.get("finish_reason"),
        })
    return out


def warmup(
    base_url: str,
    model: str,
    api_key: str | None,
    workloads: tuple[str, ...] = ("json", "code"),
    thinking: tuple[bool | None, ...] = (False, None),
    max_tokens: int = 256,
    timeout: float = 900.0,
) -> list[dict]:
    """One throwaway request per (workload, thinking) shape; their records, marked ``warmup``."""
    out = []
    for w in workloads:
        for t in thinking:
            record = probe(base_url, model, api_key, w, t, 1, max_tokens, timeout)[0]
            out.append({**record, "warmup": True})
    return out


# llama-benchy
# ------------


def benchy_command(
    base_url: str,
    model: str,
    tokenizer_path: str,
    pp: list[int],
    tg: list[int],
    depth: list[int],
    concurrency: list[int],
    api_key_env: str | None = None,
    *,
    save_result: str | None = None,
    runs: int = 3,
    served_model_name: str | None = None,
    latency_mode: str = "generation",
    book_url: str | None = None,
    coherence: bool = True,
    python: str = sys.executable,
    module: str = "llama_benchy",
) -> list[str]:
    """
    argv for a llama-benchy sweep reporting JSON (to ``save_result`` when given, else stdout after
    its banner lines). ``tokenizer_path``: a local snapshot folder (its ``tokenizer.json`` is read,
    nothing is downloaded). llama-benchy takes the API key only as ``--api-key``: with
    ``api_key_env``, ``python -c`` reads it from that environment variable and appends it to
    ``sys.argv`` inside the process before running ``module``, so it is in no process's argv
    (``ps``, ``/proc/*/cmdline``) and in nothing built or logged here. llama-benchy downloads
    ``book_url`` once into ``~/.cache/llama-benchy/<md5 of url>.txt``; offline, seed that file.
    ``coherence=False`` skips its coherence check (meaningless for the bed's tiny random model).
    """
    base = base_url.rstrip("/")
    base = base if base.endswith("/v1") else f"{base}/v1"
    args = [
        "--base-url", base,
        "--model", model,
        "--tokenizer", tokenizer_path,
        "--pp", *map(str, pp),
        "--tg", *map(str, tg),
        "--depth", *map(str, depth),
        "--concurrency", *map(str, concurrency),
        "--runs", str(runs),
        "--latency-mode", latency_mode,
        "--format", "json",
    ]
    if served_model_name:
        args += ["--served-model-name", served_model_name]
    if save_result:
        args += ["--save-result", save_result]
    if book_url:
        args += ["--book-url", book_url]
    if not coherence:
        args.append("--skip-coherence")
    if api_key_env is None:
        return [python, "-m", module, *args]
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", api_key_env):
        raise ValueError(f"not an environment variable name: {api_key_env!r}")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", module):
        raise ValueError(f"not a module name: {module!r}")
    code = (
        f"import os, runpy, sys; sys.argv += ['--api-key', os.environ['{api_key_env}']]; "
        f"runpy.run_module('{module}', run_name='__main__', alter_sys=True)"
    )
    return [python, "-c", code, *args]


@dataclass
class Row:
    """
    One llama-benchy measurement (means over its runs): tok/s are for all users together
    (``*_req_tps``: per user), times in ms. ``phase`` is ``ctx`` for a prefix-cache context load.
    """

    pp: int
    tg: int
    depth: int
    concurrency: int
    phase: str = "std"
    pp_tps: float | None = None
    pp_tps_std: float | None = None
    pp_req_tps: float | None = None
    tg_tps: float | None = None
    tg_tps_std: float | None = None
    tg_req_tps: float | None = None
    tg_req_tps_std: float | None = None
    peak_tps: float | None = None
    ttfr_ms: float | None = None
    est_ppt_ms: float | None = None
    e2e_ttft_ms: float | None = None

    @property
    def key(self) -> tuple:
        return (self.phase, self.pp, self.tg, self.depth, self.concurrency)

    @property
    def label(self) -> str:
        """llama-benchy's test name, e.g. ``pp2048/tg32 @ d8192 (c2)``."""
        head = "ctx" if self.phase == "ctx" else f"pp{self.pp}/tg{self.tg}"
        return f"{head} @ d{self.depth} (c{self.concurrency})"


def _report(text_or_data: str | dict) -> dict:
    if isinstance(text_or_data, dict):
        return text_or_data
    text = text_or_data
    start = re.search(r"^\{", text, re.M)  # stdout carries banner lines before the JSON
    if start is None:
        raise ValueError("no llama-benchy JSON report found")
    data, _ = json.JSONDecoder().raw_decode(text[start.start():])
    return data


def parse_benchy(json_text: str | dict) -> list[Row]:
    """Rows of a llama-benchy ``--format json`` report (file content, stdout, or the parsed dict)."""
    data = _report(json_text)
    if "benchmarks" not in data:
        raise ValueError("not a llama-benchy JSON report: no 'benchmarks'")

    def mean(run: dict, name: str) -> float | None:
        metric = run.get(name)
        return None if metric is None else float(metric["mean"])

    def std(run: dict, name: str) -> float | None:
        metric = run.get(name)
        return None if metric is None else float(metric["std"])

    return [
        Row(
            pp=int(run["prompt_size"]),
            tg=int(run["response_size"]),
            depth=int(run["context_size"]),
            concurrency=int(run["concurrency"]),
            phase="ctx" if run.get("is_context_prefill_phase") else "std",
            pp_tps=mean(run, "pp_throughput"),
            pp_tps_std=std(run, "pp_throughput"),
            pp_req_tps=mean(run, "pp_req_throughput"),
            tg_tps=mean(run, "tg_throughput"),
            tg_tps_std=std(run, "tg_throughput"),
            tg_req_tps=mean(run, "tg_req_throughput"),
            tg_req_tps_std=std(run, "tg_req_throughput"),
            peak_tps=mean(run, "peak_throughput"),
            ttfr_ms=mean(run, "ttfr"),
            est_ppt_ms=mean(run, "est_ppt"),
            e2e_ttft_ms=mean(run, "e2e_ttft"),
        )
        for run in data["benchmarks"]
    ]


# Results
# -------


@dataclass
class Meta:
    """What a run was measured on; ``timestamp`` is UTC ISO-8601 (``2026-07-05T10:15:00Z``)."""

    cluster: str
    lane: str
    image_id: str = ""
    model: str = ""
    model_revision: str = ""
    nccl_version: str = ""
    gmu: float | None = None
    timestamp: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict) -> Meta:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def run_dir(root: str | Path, meta: Meta) -> Path:
    """``<root>/<cluster>/<lane>/<timestamp>`` (timestamp without separators: ``20260705T101500Z``)."""
    stamp = re.sub(r"[^0-9A-Za-z]", "", meta.timestamp)
    return Path(root) / meta.cluster / meta.lane / stamp


def _rate(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}{unit}"


def _seconds(ms: float | None) -> str:
    return "—" if ms is None else f"{ms / 1000:.2f} s"


def _depth(depth: int) -> str:
    return f"{depth // 1024}k" if depth and depth % 1024 == 0 else str(depth)


def _probe_stats(probes: list[dict]) -> dict[tuple, list[float]]:
    stats: dict[tuple, list[float]] = {}
    for p in probes:
        if not p.get("warmup") and p.get("decode_tps") is not None:
            stats.setdefault((p["workload"], p["thinking"]), []).append(p["decode_tps"])
    return stats


def _table(header: list[str], rows: list[list[str]], align: list[str]) -> list[str]:
    sep = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(r) + " |" for r in [header, sep, *rows]]


def render_markdown(meta: Meta, probes: list[dict], rows: list[Row]) -> str:
    """``results.md``: the run's meta, then the seeds' tables (probes; depth sweeps; users)."""
    out = [f"# {meta.cluster} / {meta.lane} — {meta.timestamp}", ""]
    facts = [
        ("lane", meta.lane), ("image", meta.image_id), ("model", meta.model),
        ("model revision", meta.model_revision), ("NCCL", meta.nccl_version),
        ("gpu_memory_utilization", "" if meta.gmu is None else f"{meta.gmu:g}"),
        *((k, str(v)) for k, v in meta.extra.items()),
    ]
    out += _table(["field", "value"], [[k, f"`{v}`" if v else "—"] for k, v in facts], ["l", "l"]) + [""]

    stats = _probe_stats(probes)
    if stats:
        modes = [t for t in (False, True, None) if any(k[1] is t for k in stats)]
        workloads = [w for w in WORKLOADS if any(k[0] == w for k in stats)]
        workloads += sorted({k[0] for k in stats} - set(workloads))
        max_tokens = sorted({p.get("max_tokens") for p in probes if not p.get("warmup")} - {None})
        out += [
            "## Probes",
            "",
            f"{'/'.join(map(str, max_tokens)) or '256'}-token probes, temperature 0, single stream, warm engine; "
            "decode tok/s = completion_tokens / wall, mean (min–max, n).",
            "",
        ]
        body = []
        for w in workloads:
            cells = [w.upper() if w == "json" else w]
            for t in modes:
                v = stats.get((w, t))
                cells.append(f"{statistics.mean(v):.1f} ({min(v):.1f}–{max(v):.1f}, {len(v)})" if v else "—")
            body.append(cells)
        out += _table(["workload", *(THINKING_LABELS[t] for t in modes)], body, ["l", *"r" * len(modes)]) + [""]

    std = [r for r in rows if r.phase == "std"]
    shapes = sorted({(r.pp, r.tg) for r in std})
    for pp, tg in shapes:
        shape = [r for r in std if (r.pp, r.tg) == (pp, tg)]
        depths = sorted({r.depth for r in shape})
        users = sorted({r.concurrency for r in shape})
        for c in users if len(depths) > 1 or len(users) == 1 else []:
            sel = sorted((r for r in shape if r.concurrency == c), key=lambda r: r.depth)
            who = "1 user" if c == 1 else f"{c} users"
            out += [f"## Depth sweep: pp{pp} / tg{tg}, {who} (llama-benchy)", ""]
            header = ["depth", "prefill (PP)", "decode (TG)"] + (["decode per user"] if c > 1 else []) + ["TTFT"]
            body = [
                [_depth(r.depth), _rate(r.pp_tps, 0, " tok/s"), _rate(r.tg_tps, 1, " tok/s")]
                + ([_rate(r.tg_req_tps, 1, " tok/s")] if c > 1 else []) + [_seconds(r.e2e_ttft_ms)]
                for r in sel
            ]
            out += _table(header, body, ["l"] + ["r"] * (len(header) - 1)) + [""]
        if len(users) > 1:  # like the users plot: at the shape's lowest depth
            d = depths[0]
            sel = sorted((r for r in shape if r.depth == d), key=lambda r: r.concurrency)
            out += [f"## Users: pp{pp} / tg{tg} at depth {_depth(d)} (llama-benchy)", ""]
            header = ["users", "agg tok/s", "per-user tok/s", "prefill tok/s", "TTFT"]
            body = [
                [str(r.concurrency), _rate(r.tg_tps), _rate(r.tg_req_tps), _rate(r.pp_tps, 0),
                 _seconds(r.e2e_ttft_ms)]
                for r in sel
            ]
            out += _table(header, body, ["l", "r", "r", "r", "r"]) + [""]
    if any(r.pp_tps is None for r in std):
        out += [
            "— as prefill: llama-benchy reports no prefill rate when the time to the first token was not "
            "above its measured round-trip latency (a prompt too short to time on this engine).",
            "",
        ]
    return "\n".join(out).rstrip() + "\n"


def _figure(title: str, xlabel: str, ylabel: str):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def plot_decode_vs_depth(rows: list[Row], title: str = ""):
    """Figure: decode tok/s (all users) against context depth, one line per concurrency (and shape)."""
    std = [r for r in rows if r.phase == "std" and r.tg_tps is not None]
    if not std:
        return None
    fig, ax = _figure(
        "Decode throughput vs context depth" + (f" — {title}" if title else ""),
        "context depth (tokens)", "decode tok/s (all users)",
    )
    shapes = sorted({(r.pp, r.tg) for r in std})
    for pp, tg in shapes:
        for c in sorted({r.concurrency for r in std if (r.pp, r.tg) == (pp, tg)}):
            sel = sorted((r for r in std if (r.pp, r.tg, r.concurrency) == (pp, tg, c)), key=lambda r: r.depth)
            label = f"{c} user{'s' if c > 1 else ''}" + (f", pp{pp}/tg{tg}" if len(shapes) > 1 else "")
            ax.plot([r.depth for r in sel], [r.tg_tps for r in sel], marker="o", label=label)
    depths = sorted({r.depth for r in std})
    ax.set_xticks(depths, labels=[_depth(d) for d in depths])
    ax.set_ylim(bottom=0)
    ax.legend(title="concurrency")
    return fig


def plot_users(rows: list[Row], title: str = ""):
    """Figure: aggregate and per-user decode tok/s against concurrent users, at each shape's lowest depth."""
    std = [r for r in rows if r.phase == "std" and r.tg_tps is not None]
    if not std:
        return None
    fig, ax = _figure(
        "Decode throughput vs concurrent users" + (f" — {title}" if title else ""),
        "concurrent users", "decode tok/s",
    )
    shapes = sorted({(r.pp, r.tg) for r in std})
    for pp, tg in shapes:
        depth = min(r.depth for r in std if (r.pp, r.tg) == (pp, tg))
        sel = sorted((r for r in std if (r.pp, r.tg, r.depth) == (pp, tg, depth)), key=lambda r: r.concurrency)
        suffix = f" (pp{pp}/tg{tg}, depth {_depth(depth)})"
        users = [r.concurrency for r in sel]
        ax.plot(users, [r.tg_tps for r in sel], marker="o", label="aggregate" + suffix)
        per_user = [r.tg_req_tps or r.tg_tps for r in sel]
        ax.plot(users, per_user, marker="s", linestyle="--", label="per user" + suffix)
    ax.set_xticks(sorted({r.concurrency for r in std}))
    ax.set_ylim(bottom=0)
    ax.legend()
    return fig


def write_results(
    root: str | Path, meta: Meta, probes: list[dict], sweep: list[Row], *, benchy_raw: dict | None = None
) -> Path:
    """
    Write a run under ``run_dir(root, meta)``: ``results.json`` (meta, probes, sweep rows, the raw
    llama-benchy report), ``results.md``, and ``decode_vs_depth.png`` / ``users.png`` when there is
    a sweep. Returns the run's folder.
    """
    folder = run_dir(root, meta)
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "meta": asdict(meta),
        "probes": probes,
        "sweep": [asdict(r) for r in sweep],
        "benchy_raw": benchy_raw,
    }
    (folder / "results.json").write_text(json.dumps(data, indent=2) + "\n")
    (folder / "results.md").write_text(render_markdown(meta, probes, sweep))
    title = f"{meta.cluster}/{meta.lane}"
    for name, plot in (("decode_vs_depth.png", plot_decode_vs_depth), ("users.png", plot_users)):
        fig = plot(sweep, title)
        if fig is not None:
            fig.savefig(folder / name, dpi=120)
    return folder


def load_results(folder: str | Path) -> tuple[Meta, list[dict], list[Row]]:
    """A run written by ``write_results``."""
    path = Path(folder) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"no results.json in {folder}")
    data = json.loads(path.read_text())
    rows = [Row(**r) for r in data.get("sweep") or []]
    return Meta.from_dict(data["meta"]), data.get("probes") or [], rows


def _delta(a: float | None, b: float | None, digits: int = 1) -> list[str]:
    if a is None or b is None:
        return [_rate(a, digits), _rate(b, digits), "—", "—"]
    pct = f"{(b - a) / a * 100:+.1f}%" if a else "—"
    return [f"{a:.{digits}f}", f"{b:.{digits}f}", f"{b - a:+.{digits}f}", pct]


def compare(a_dir: str | Path, b_dir: str | Path) -> str:
    """Two runs side by side: what differs in their meta, then every shared row's throughput, B vs A."""
    (ma, pa, ra), (mb, pb, rb) = load_results(a_dir), load_results(b_dir)
    out = [f"A: {a_dir}", f"B: {b_dir}", ""]

    da, db = asdict(ma), asdict(mb)
    extra_a, extra_b = da.pop("extra"), db.pop("extra")
    da.update({f"extra.{k}": v for k, v in extra_a.items()})
    db.update({f"extra.{k}": v for k, v in extra_b.items()})
    keys = dict.fromkeys([*da, *db])
    changed = [[k, f"`{da.get(k)}`", f"`{db.get(k)}`"] for k in keys if da.get(k) != db.get(k)]
    out += ["## Meta", ""]
    out += _table(["field", "A", "B"], changed, ["l", "l", "l"]) if changed else ["(same)"]
    out.append("")

    sa, sb = _probe_stats(pa), _probe_stats(pb)
    if sa or sb:
        body = []
        for key in dict.fromkeys([*sa, *sb]):
            name = f"{key[0]}, {THINKING_LABELS.get(key[1], key[1])}"
            mean_a = statistics.mean(sa[key]) if key in sa else None
            mean_b = statistics.mean(sb[key]) if key in sb else None
            body.append([name, *_delta(mean_a, mean_b)])
        out += ["## Probes (decode tok/s, mean)", ""]
        out += _table(["probe", "A", "B", "Δ", "Δ %"], body, ["l", "r", "r", "r", "r"]) + [""]

    ka, kb = {r.key: r for r in ra}, {r.key: r for r in rb}
    if ka or kb:
        body = []
        for key in sorted(set(ka) & set(kb)):
            a, b = ka[key], kb[key]
            body.append([a.label, "decode tok/s", *_delta(a.tg_tps, b.tg_tps)])
            if a.concurrency > 1:
                body.append([a.label, "decode tok/s per user", *_delta(a.tg_req_tps, b.tg_req_tps)])
            body.append([a.label, "prefill tok/s", *_delta(a.pp_tps, b.pp_tps, 0)])
            body.append([a.label, "TTFT ms", *_delta(a.e2e_ttft_ms, b.e2e_ttft_ms, 0)])
        out += ["## Sweep (llama-benchy)", ""]
        out += _table(["row", "metric", "A", "B", "Δ", "Δ %"], body, ["l", "l", "r", "r", "r", "r"]) + [""]
        for side, only in (("A", set(ka) - set(kb)), ("B", set(kb) - set(ka))):
            if only:
                labels = ", ".join((ka if side == "A" else kb)[k].label for k in sorted(only))
                out += [f"Only in {side}: {labels}", ""]
    return "\n".join(out).rstrip() + "\n"


# A run from deploys/bench.py
# ---------------------------

TOKENIZER_FILE = re.compile(
    r"tokenizer.*|special_tokens_map\.json|config\.json|generation_config\.json|vocab\.\w+|merges\.txt|"
    r"chat_template\.\w+|.*\.tiktoken|added_tokens\.json"
)


def tokenizer_names(files: dict[str, int]) -> list[str]:
    """The snapshot files a tokenizer loads from (never weights)."""
    return sorted(name for name in files if TOKENIZER_FILE.fullmatch(name))


@dataclass
class Job:
    """One bench run of a lane: where it answers, what runs, what it is measured on."""

    base_url: str
    served_model: str
    api_key_env: str
    snapshot: str  # the staged snapshot on the head
    tokenizer_files: dict[str, int]  # name -> size, of the snapshot's tokenizer files
    probes: int
    max_tokens: int
    workloads: list[str]
    thinking: list[bool]
    pp: list[int]
    tg: list[int]
    depth: list[int]
    concurrency: list[int]
    runs: int
    book: str
    coherence: bool
    results_dir: str
    meta: Meta


def fetch_tokenizer(host, job: Job, cache: Path | None = None) -> Path:
    """The snapshot's tokenizer files, copied once from the head into a controller cache folder."""
    if not job.tokenizer_files:
        raise BenchError(f"{job.snapshot} on {host.name} holds no tokenizer files: stage the model first")
    cache = cache or Path.home() / ".cache" / "sparkinfra" / "tokenizers"
    folder = cache / f"{job.meta.model.replace('/', '--')}@{job.meta.model_revision}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, size in job.tokenizer_files.items():
        local = folder / name
        if local.is_file() and local.stat().st_size == size:
            continue
        partial = local.with_name(local.name + ".part")
        if not host.get_file(f"{job.snapshot}/{name}", str(partial), _sudo=True):
            raise BenchError(f"could not copy {job.snapshot}/{name} from {host.name}")
        partial.replace(local)
    return folder


def seed_book(book: str) -> str | None:
    """
    llama-benchy's ``--book-url`` for a local text file: the file is placed where llama-benchy
    caches a download of that URL, so it never fetches it. None: llama-benchy's default book.
    """
    if not book:
        return None
    path = Path(book).resolve()
    if not path.is_file():
        raise BenchError(f"bench_book {book}: no such file")
    url = path.as_uri()
    cached = Path.home() / ".cache" / "llama-benchy" / f"{hashlib.md5(url.encode()).hexdigest()}.txt"
    text = path.read_text(encoding="utf-8", errors="replace")
    if not cached.is_file() or cached.read_text(encoding="utf-8", errors="replace") != text:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(text, encoding="utf-8")
    return url


def sweep(job: Job, tokenizer: Path, folder: Path, log=print) -> tuple[list[Row], dict]:
    """A llama-benchy sweep (offline, with the snapshot's tokenizer); its rows and raw report."""
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / "benchy.json"
    argv = benchy_command(
        job.base_url, job.meta.model, str(tokenizer), job.pp, job.tg, job.depth, job.concurrency,
        api_key_env=job.api_key_env or None, save_result=str(report), runs=job.runs,
        served_model_name=job.served_model, book_url=seed_book(job.book), coherence=job.coherence,
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    output = proc.stdout + proc.stderr
    (folder / "benchy.log").write_text(output)
    if "Falling back to 'gpt2'" in output:  # it would fetch gpt2's tokenizer instead
        raise BenchError(f"llama-benchy could not load the tokenizer in {tokenizer}: see {folder / 'benchy.log'}")
    if proc.returncode != 0 or not report.is_file():
        tail = "\n".join(output.strip().splitlines()[-8:])
        raise BenchError(f"llama-benchy failed (exit {proc.returncode}):\n{tail}")
    raw = json.loads(report.read_text())
    rows = parse_benchy(raw)
    log(f"llama-benchy: {len(rows)} measurements in {time.monotonic() - started:.0f}s")
    return rows, raw


def run(job: Job, host=None, log=print) -> Path:
    """
    Warm-up (one request per probe shape), the probes, the sweep (when ``job.pp``), then
    ``write_results``; returns the run's folder.
    """
    key = os.environ.get(job.api_key_env, "") if job.api_key_env else ""
    if job.api_key_env and not key:
        raise BenchError(f"the controller's environment has no {job.api_key_env} (settings: api_key_env)")
    folder = run_dir(job.results_dir, job.meta)
    thinking = tuple(job.thinking)
    workloads = tuple(job.workloads)
    started = time.monotonic()
    records = warmup(job.base_url, job.served_model, key, workloads, thinking, job.max_tokens)
    log(f"warm-up: {len(records)} requests in {time.monotonic() - started:.0f}s")
    for workload in workloads:
        for mode in thinking:
            done = probe(job.base_url, job.served_model, key, workload, mode, job.probes, job.max_tokens)
            records += done
            rates = [p["decode_tps"] for p in done if p["decode_tps"] is not None]
            log(f"probes {workload}, {THINKING_LABELS[mode]}: "
                f"{statistics.mean(rates):.1f} tok/s decode (n={len(rates)})")
    rows: list[Row] = []
    raw = None
    if job.pp:
        rows, raw = sweep(job, fetch_tokenizer(host, job), folder, log)
    return write_results(job.results_dir, job.meta, records, rows, benchy_raw=raw)


def job_for(host, cluster) -> Job:
    """
    The bench job of a cluster's lane, from its settings and the head's facts (image ID, NCCL,
    tokenizer files). Refuses (``BenchRefused``) a cluster with no lane, or a lane not serving
    its current plan: a bench never starts or restarts what it measures.
    """

    config = cluster.config
    if not config.lane:
        raise BenchRefused(f"cluster {cluster.name} serves no lane (settings: lane)")
    lane = lanes.find_lane(config.lane)
    digest = serving.rank_plans(lane, cluster)[0].plan["digest"]
    status = host.get_fact(LaneStatus, lane=lane.name) or {}
    if status.get("unit") != "active" or status.get("started") != digest or status.get("api") != "ok":
        found = (f"unit {status.get('unit', 'not installed')}, plan {status.get('started') or 'none'} "
                 f"(current {digest}), API {status.get('api')}")
        raise BenchRefused(f"lane {lane.name} is not serving its current plan on {host.name} ({found}): "
                           "run deploys/serve.py first")
    revision = dict(transfer.models(cluster)).get(lane.model, "main")
    snapshot = f"{transfer.repo_dir(config.model_dir, lane.model)}/snapshots/{revision}"
    files = host.get_fact(SnapshotFiles, path=snapshot)
    image = lane.image or config.image
    kv_space = next((v for k, v in lane.env.items() if k == "VLLM_CPU_KVCACHE_SPACE"), None)
    meta = Meta(
        cluster=cluster.name,
        lane=lane.name,
        image_id=host.get_fact(DockerImageId, image=image) or "",
        model=lane.model,
        model_revision=revision,
        nccl_version=host.get_fact(NcclVersion, path=config.nccl_library) or "",
        gmu=config.gpu_memory_utilization or lane.gpu_memory_utilization,
        extra={
            "plan": digest, "image_name": image, "nodes": len(cluster.nodes), "tensor_parallel": lane.tensor_parallel,
            "served_model_name": lane.served_model_name or lane.model,
            **({"VLLM_CPU_KVCACHE_SPACE": kv_space} if kv_space else {}),
        },
    )
    port = lanes.effective_ports(lane, cluster)["api_port"]
    return Job(
        base_url=f"http://{cluster.head.ssh_host}:{port}",
        served_model=lane.served_model_name or lane.model,
        api_key_env=config.api_key_env,
        snapshot=snapshot,
        tokenizer_files={name: files[name] for name in tokenizer_names(files)},
        probes=config.bench_probes,
        max_tokens=config.bench_max_tokens,
        workloads=list(config.bench_workloads),
        thinking=list(config.bench_thinking),
        pp=list(config.bench_pp),
        tg=list(config.bench_tg),
        depth=list(config.bench_depth),
        concurrency=list(config.bench_concurrency),
        runs=config.bench_runs,
        book=config.bench_book,
        coherence=config.bench_coherence,
        results_dir=config.results_dir,
        meta=meta,
    )


def run_from_deploy(state, host, job: Job) -> bool:
    """``run`` as a pyinfra ``python.call``: progress in pyinfra's output, a failure as the op's error."""
    from pyinfra import logger

    def log(line: str) -> None:
        logger.info(f"    [{host.name}] {line}")

    try:
        folder = run(job, host, log)
    except BenchError as e:
        logger.error(f"    [{host.name}] bench: {e}")
        return False
    log(f"results: {folder}")
    table = (folder / "results.md").read_text().split("## Probes", 1)
    if len(table) == 2:
        for line in table[1].strip().splitlines()[2:]:
            if not line.startswith("|"):
                break
            log(line)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkinfra.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--compare", nargs=2, metavar=("A", "B"), required=True,
        help="two results/<cluster>/<lane>/<timestamp> folders: print how B differs from A",
    )
    args = parser.parse_args(argv)
    try:
        print(compare(*args.compare), end="")
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
