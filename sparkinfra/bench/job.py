"""
A bench run from ``deploys/bench.py``: the job read from the settings and the head's facts
(refused for a lane not serving its current plan), the snapshot's tokenizer fetched, the probes and
the sweep run from the controller, the results filed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pyinfra.api.exceptions import PyinfraError

from .. import transfer
from ..cluster_lane import ClusterLane
from ..facts.lane import LaneStatus
from ..facts.nccl import NcclVersion
from ..facts.stage import DockerImageId, SnapshotFiles
from .benchy import Row, benchy_command, parse_benchy
from .probes import THINKING_LABELS, BenchError, probe, template_kwargs, warmup
from .report import Meta, run_dir, write_results


class BenchRefused(PyinfraError):
    """The cluster cannot be benchmarked now (no lane, or not serving): said before anything runs."""


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
    thinking_switch: dict  # the lane's: its chat template's key and off/on values
    sweep_thinking: bool  # the llama-benchy sweep's thinking, set through the same switch
    pp: list[int]
    tg: list[int]
    depth: list[int]
    concurrency: list[int]
    runs: int
    book: str
    coherence: bool
    results_dir: str
    meta: Meta


def snapshot_of(cluster, model: str) -> tuple[str, str]:
    """(revision, the staged snapshot's folder on a node) of ``model`` as the cluster stages it."""
    revision = dict(transfer.models(cluster)).get(model, "main")
    return revision, f"{transfer.repo_dir(cluster.config.model_dir, model)}/snapshots/{revision}"


def fetch_tokenizer(host, job: Job, cache: Path | None = None) -> Path:
    """The snapshot's tokenizer files, copied once from the head into a controller cache folder."""
    return copy_tokenizer(host, job.snapshot, job.tokenizer_files, job.meta.model, job.meta.model_revision, cache)


def copy_tokenizer(host, snapshot: str, files: dict[str, int], model: str, revision: str,
                   cache: Path | None = None) -> Path:
    """The tokenizer ``files`` (name -> size) of ``snapshot`` on ``host``, copied once into a
    controller cache folder of ``model`` at ``revision``; that folder."""
    if not files:
        raise BenchError(f"{snapshot} on {host.name} holds no tokenizer files: stage the model first")
    cache = cache or Path.home() / ".cache" / "sparkinfra" / "tokenizers"
    folder = cache / f"{model.replace('/', '--')}@{revision}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, size in files.items():
        local = folder / name
        if local.is_file() and local.stat().st_size == size:
            continue
        partial = local.with_name(local.name + ".part")
        if not host.get_file(f"{snapshot}/{name}", str(partial), _sudo=True):
            raise BenchError(f"could not copy {snapshot}/{name} from {host.name}")
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
        template_kwargs=template_kwargs(job.sweep_thinking, job.thinking_switch),
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
    switch = job.thinking_switch
    records = warmup(job.base_url, job.served_model, key, workloads, thinking, job.max_tokens, switch=switch)
    log(f"warm-up: {len(records)} requests in {time.monotonic() - started:.0f}s")
    for workload in workloads:
        for mode in thinking:
            done = probe(job.base_url, job.served_model, key, workload, mode, job.probes, job.max_tokens, switch=switch)
            records += done
            rates = [p["decode_tps"] for p in done if p["decode_tps"] is not None]
            log(f"probes {workload}, {THINKING_LABELS[mode]}: "
                f"{statistics.mean(rates):.1f} tok/s decode (n={len(rates)})")
    rows: list[Row] = []
    raw = None
    if job.pp:
        rows, raw = sweep(job, fetch_tokenizer(host, job), folder, log)
    return write_results(job.results_dir, job.meta, records, rows, benchy_raw=raw)


def job_for(host, cluster, on: ClusterLane | None) -> Job:
    """
    The bench job of a cluster's lane (``on``: it on the cluster, None: none), from its settings and
    the head's facts (image ID, NCCL, tokenizer files). Refuses (``BenchRefused``) a cluster with no lane, or a lane not serving
    its current plan: a bench never starts or restarts what it measures.
    """

    config = cluster.config
    if on is None:
        raise BenchRefused(f"cluster {cluster.name} serves no lane (settings: lane)")
    lane, digest = on.lane, on.digest
    status = host.get_fact(LaneStatus, lane=lane.name) or {}
    if status.get("unit") != "active" or status.get("started") != digest or status.get("api") != "ok":
        found = (f"unit {status.get('unit', 'not installed')}, plan {status.get('started') or 'none'} "
                 f"(current {digest}), API {status.get('api')}")
        raise BenchRefused(f"lane {lane.name} is not serving its current plan on {host.name} ({found}): "
                           "run deploys/serve.py first")
    revision, snapshot = snapshot_of(cluster, lane.model)
    files = host.get_fact(SnapshotFiles, path=snapshot)
    image = on.image
    kv_space = next((v for k, v in lane.env.items() if k == "VLLM_CPU_KVCACHE_SPACE"), None)
    switch = lane.thinking.model_dump()  # its chat template's thinking key and values
    meta = Meta(
        cluster=cluster.name,
        lane=lane.name,
        image_id=host.get_fact(DockerImageId, image=image) or "",
        model=lane.model,
        model_revision=revision,
        nccl_version=host.get_fact(NcclVersion, path=config.nccl_library) or "",
        gmu=on.gmu,
        extra={
            "plan": digest, "image_name": image, "nodes": len(cluster.nodes), "tensor_parallel": lane.tensor_parallel,
            "served_model_name": on.served_name,
            "thinking_switch": switch,
            "sweep_thinking": config.bench_sweep_thinking,  # the llama-benchy sweep's, through the switch
            **({"VLLM_CPU_KVCACHE_SPACE": kv_space} if kv_space else {}),
        },
    )
    return Job(
        base_url=on.api_url,
        served_model=on.served_name,
        api_key_env=config.api_key_env,
        snapshot=snapshot,
        tokenizer_files={name: files[name] for name in tokenizer_names(files)},
        probes=config.bench_probes,
        max_tokens=config.bench_max_tokens,
        workloads=list(config.bench_workloads),
        thinking=list(config.bench_thinking),
        thinking_switch=switch,
        sweep_thinking=config.bench_sweep_thinking,
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
