"""
A ``vllm serve`` command line as a recipe writes it, read into settings keyed by flag name (short
flags spelt out, ``-cc.x=y`` into its JSON setting, ``--no-x`` as false, ``nargs="+"`` as a list):
what every recipe format's import starts from.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

# Short flags of ``vllm serve`` a recipe may use.
SHORT_FLAGS = {
    "-tp": "tensor_parallel_size",
    "-pp": "pipeline_parallel_size",
    "-dp": "data_parallel_size",
    "-cc": "compilation_config",
    "-q": "quantization",
}
def arg_value(text: str) -> Any:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d*\.\d+([eE]-?\d+)?", text):
        return float(text)
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def command_settings(tokens: list[str], refuse) -> tuple[str | None, dict[str, Any]]:
    """(positional model, settings by flag name) of a ``vllm serve`` argument list."""
    model = None
    settings: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("-"):
            if model is None and not settings:
                model = token
                continue
            refuse(f"unexpected argument {token!r}")
        name, eq, inline = token.partition("=")
        if name in SHORT_FLAGS or name.split(".")[0] in SHORT_FLAGS:
            head, _, rest = name.partition(".")
            name = "--" + SHORT_FLAGS[head].replace("_", "-") + (f".{rest}" if rest else "")
        elif not name.startswith("--"):
            refuse(f"short flag {name}: spell it out (--name)")
        key = name[2:].replace("-", "_")
        if eq:
            value: Any = arg_value(inline)
        elif i < len(tokens) and not re.match(r"-[A-Za-z-]", tokens[i]):
            value = arg_value(tokens[i])
            i += 1
            while i < len(tokens) and not tokens[i].startswith("-"):  # nargs="+"
                value = [*(value if isinstance(value, list) else [value]), arg_value(tokens[i])]
                i += 1
        elif key.startswith("no_"):
            key, value = key[3:], False
        else:
            value = True
        if "." in key:  # -cc.mode=X: one key of a JSON setting
            top, *inner = key.split(".")
            target = settings.setdefault(top, {})
            if not isinstance(target, dict):
                refuse(f"{name} after a whole --{top.replace('_', '-')}")
            for part in inner[:-1]:
                target = target.setdefault(part, {})
            target[inner[-1]] = value
        else:
            settings[key] = value
    return model, settings


def serve_tokens(command: str, refuse) -> list[str]:
    """The arguments after ``vllm serve`` of a rendered command line (``refuse(message)`` raises)."""
    try:
        tokens = shlex.split(re.sub(r"\\[ \t]*\n", " ", command))
    except ValueError as exc:
        refuse(f"not a shell command: {exc}")
    if tokens[:2] != ["vllm", "serve"]:
        refuse("only `vllm serve ...` commands can be imported")
    return tokens[2:]
