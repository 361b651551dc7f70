"""
The seeds' probe protocol (seed 001): ``n`` requests of 256 completion tokens, temperature 0,
one at a time, on a warm engine (``warmup`` burns one request per shape first: the first request
after boot pays a ~60 s JIT), JSON and code workloads, thinking set per request through
``chat_template_kwargs``; decode tok/s = ``completion_tokens / wall``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

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


# The lane's ``thinking`` (``lanes.schema.Thinking``): the chat template's key and its off/on values.
DEFAULT_SWITCH = {"key": "enable_thinking", "off_value": False, "on_value": True}


def template_kwargs(thinking: bool, switch: dict | None = None) -> dict:
    """The ``chat_template_kwargs`` that set the lane's thinking switch on or off."""
    switch = switch or DEFAULT_SWITCH
    return {switch["key"]: switch["on_value"] if thinking else switch["off_value"]}


def request_body(
    model: str, workload: str, thinking: bool | None, max_tokens: int = 256, switch: dict | None = None
) -> dict:
    """
    The chat request of one probe: temperature 0, no streaming, thinking through the chat template.

    + switch: the lane's thinking switch (key, off_value, on_value); ``DEFAULT_SWITCH`` when not given
    """
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
        body["chat_template_kwargs"] = template_kwargs(thinking, switch)
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
    switch: dict | None = None,
) -> list[dict]:
    """
    ``n`` single-stream probes of one shape; one dict each: workload, thinking, run, prompt and
    completion tokens (the server's ``usage``), wall seconds, ``decode_tps`` and finish reason.
    ``thinking``: False/True sets the lane's switch (``switch``) off/on; None leaves the template's default.
    """
    url, body = chat_url(base_url), request_body(model, workload, thinking, max_tokens, switch)
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
    switch: dict | None = None,
) -> list[dict]:
    """One throwaway request per (workload, thinking) shape; their records, marked ``warmup``."""
    out = []
    for w in workloads:
        for t in thinking:
            record = probe(base_url, model, api_key, w, t, 1, max_tokens, timeout, switch)[0]
            out.append({**record, "warmup": True})
    return out
