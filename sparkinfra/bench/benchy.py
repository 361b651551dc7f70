"""
llama-benchy sweeps (seeds 002, 004): prompt size x depth x concurrency, read back from its
``--format json`` report.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass

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
    template_kwargs: dict | None = None,
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
    ``template_kwargs``: the chat template's switches every request sends (``chat_template_kwargs``,
    the lane's thinking switch as the probes set it), through llama-benchy's ``--extra-body``.
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
    if template_kwargs:
        value = json.dumps(template_kwargs, separators=(",", ":"))
        if "," in value:  # llama-benchy splits --extra-body at commas
            raise ValueError(f"one chat template switch at a time: {template_kwargs}")
        args += ["--extra-body", f"chat_template_kwargs={value}"]
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
