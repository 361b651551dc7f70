"""
One chat completion from a cluster's serving lane, from the controller.

    python -m sparkinfra chat inventory/pair.py "Write a haiku about RoCE"   [--data key=value ...]

The head's address, API port and served model name come from the same settings the deploy used;
an API key, when the settings name one, is read from the controller's environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..api_key import where as key_where
from ..cluster_lane import cluster_lane
from ..run import load_files


def chat(url: str, model: str, prompt: str, max_tokens: int, api_key: str = "", timeout: float = 300) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(prog="python -m sparkinfra chat", description=__doc__.split("\n\n")[0])
    parser.add_argument("inventory")
    parser.add_argument("prompt")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cluster", help="which cluster of the inventory (default: the first)")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args(argv)

    _, settings = load_files(args.inventory, args.data)
    cluster = settings.clusters[args.cluster] if args.cluster else next(iter(settings.clusters.values()))
    on = cluster_lane(cluster)
    if on is None:
        print(f"cluster {cluster.name} serves no lane (settings: lane)", file=sys.stderr)
        return 2
    url = f"{on.api_url}/v1/chat/completions"
    model = on.served_name
    api_key = os.environ.get(cluster.config.api_key_env, "") if cluster.config.api_key_env else ""
    if cluster.config.api_key_env and not api_key:
        print(f"cluster {cluster.name}: no API key in this shell; its key is {key_where(cluster, Path.cwd())}",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        reply = chat(url, model, args.prompt, args.max_tokens, api_key)
    except (urllib.error.URLError, OSError) as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1
    seconds = time.monotonic() - started
    text = reply["choices"][0]["message"]["content"]
    tokens = reply["usage"]["completion_tokens"]
    print(f"[{cluster.name} / lane {on.lane.name} / {model}] {args.prompt}")
    print(text)
    print(f"-- {tokens} tokens in {seconds:.2f}s from {url}")
    return 0
