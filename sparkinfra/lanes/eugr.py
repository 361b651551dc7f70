"""
An eugr/spark-vllm-docker recipe imported as a lane: its ``vllm serve`` command line read into
settings, what sparkinfra renders itself refused with the recipe's key.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..settings import HostSettings
from .schema import (
    PLACEHOLDER_RE,
    RESERVED,
    Lane,
    LaneError,
    display,
    key_text,
    line_of,
    locate,
    read_yaml,
    validation_error,
)

# Short flags of ``vllm serve`` a recipe may use.
_SHORT_FLAGS = {
    "-tp": "tensor_parallel_size",
    "-pp": "pipeline_parallel_size",
    "-dp": "data_parallel_size",
    "-cc": "compilation_config",
    "-q": "quantization",
}
_RECIPE_KEYS = {
    "name", "recipe_version", "description", "model", "container", "command", "defaults", "env", "mods",
    "build_args", "cluster_only", "solo_only",
}
# The flags sparkinfra renders itself (``RESERVED``) an import turns into the lane's own keys.
_MAPPED = ("model", "tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization", "host", "port",
           "distributed_executor_backend", "speculative_config", "served_model_name")
_PER_RANK = ("data_parallel_rank",)  # not rendered, but never the same on every rank


def _value(text: str) -> Any:
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


def _command_settings(tokens: list[str], refuse) -> tuple[str | None, dict[str, Any]]:
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
        if name in _SHORT_FLAGS or name.split(".")[0] in _SHORT_FLAGS:
            head, _, rest = name.partition(".")
            name = "--" + _SHORT_FLAGS[head].replace("_", "-") + (f".{rest}" if rest else "")
        elif not name.startswith("--"):
            refuse(f"short flag {name}: spell it out (--name)")
        key = name[2:].replace("-", "_")
        if eq:
            value: Any = _value(inline)
        elif i < len(tokens) and not re.match(r"-[A-Za-z-]", tokens[i]):
            value = _value(tokens[i])
            i += 1
            while i < len(tokens) and not tokens[i].startswith("-"):  # nargs="+"
                value = [*(value if isinstance(value, list) else [value]), _value(tokens[i])]
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


# eugr's launcher expands a recipe's env in its shell; what those variables are there, here. The
# token is not a lane's: the head's download reads it from the controller (hf_token_env), and
# serving containers run offline (HF_HUB_OFFLINE=1).
ENV_REFERENCES = {
    "HF_TOKEN": "", "HUGGING_FACE_HUB_TOKEN": "",
    "VLLM_HOST_IP": "{fabric_ip}", "LOCAL_IP": "{fabric_ip}", "NODE_IP": "{fabric_ip}",
    "HEAD_IP": "{head_ip}", "HEAD_NODE_IP": "{head_ip}", "MASTER_ADDR": "{head_ip}",
}
_REFERENCE_RE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def env_reference(text: str) -> str | None:
    """``text`` (an eugr env value with ``$VAR``/``${VAR}``) as a lane's value: each known variable
    mapped (``ENV_REFERENCES``), "" for a value that is only the token (dropped); None when a
    variable is not known."""
    names = [a or b for a, b in _REFERENCE_RE.findall(text)]
    if not names or any(n not in ENV_REFERENCES for n in names) or "$" in _REFERENCE_RE.sub("", text):
        return None
    if all(ENV_REFERENCES[n] == "" for n in names):
        return "" if _REFERENCE_RE.sub("", text).strip() == "" else None
    if any(ENV_REFERENCES[n] == "" for n in names):
        return None
    return _REFERENCE_RE.sub(lambda m: ENV_REFERENCES[m.group(1) or m.group(2)], text)


def import_eugr(path: str | Path) -> Lane:
    """
    A lane from an eugr/spark-vllm-docker recipe (v1: name, recipe_version, container, command,
    defaults, env, mods...). The lane is named after the recipe file.

    A recipe's mods (``mods/<name>`` of the eugr repository) become the lane's ``mods`` by name: copy
    their folders into the project's ``mods/``. Refused (``LaneError`` naming the file and key): command
    placeholders without a default, an env value expanding a variable ``ENV_REFERENCES`` does not
    map (``$HF_TOKEN`` is dropped: the token reaches the head's download through ``hf_token_env``),
    and flags sparkinfra sets per rank or from the cluster's settings.
    """
    path = Path(path)
    source = display(path)
    recipe, lines = read_yaml(path, source, holds="an eugr recipe holds one mapping (name, container, command...)")

    def refuse(key: str, message: str):
        raise LaneError(f"{locate(source, key, line_of(lines, tuple(key.split('.'))))}: {message}")

    for key in recipe:
        if key not in _RECIPE_KEYS:
            refuse(str(key), "unknown recipe key (eugr recipe v1)")
    for key in ("name", "recipe_version", "container", "command"):
        if key not in recipe:
            refuse(key, "required recipe key is missing")
    if str(recipe["recipe_version"]) != "1":
        refuse("recipe_version", f"version {recipe['recipe_version']!r}: only version 1 recipes can be imported")
    mods = [Path(str(m)).name for m in recipe.get("mods") or []]  # eugr's mods/<name>: the lane's mods/<name>

    defaults = dict(recipe.get("defaults") or {})
    try:
        command = str(recipe["command"]).format(**defaults)
    except KeyError as exc:
        refuse("command", f"placeholder {{{exc.args[0]}}} has no value in defaults")
    except (IndexError, ValueError) as exc:
        refuse("command", f"cannot fill placeholders: {exc}")
    try:
        tokens = shlex.split(command.replace("\\\n", " "))
    except ValueError as exc:
        refuse("command", f"not a shell command: {exc}")
    if tokens[:2] != ["vllm", "serve"]:
        refuse("command", "only `vllm serve ...` commands can be imported")

    model, settings = _command_settings(tokens[2:], lambda message: refuse("command", message))
    model = model or settings.pop("model", None) or recipe.get("model")
    if not model:
        refuse("command", "no model (vllm serve MODEL)")
    if recipe.get("model") and recipe["model"] != model:
        refuse("model", f"{recipe['model']!r} differs from the command's model {model!r}")
    for key in settings:
        if key in _PER_RANK or key in RESERVED and key not in _MAPPED:
            where = f"from {RESERVED[key]}" if key in RESERVED else "per rank"
            refuse("command", f"--{key.replace('_', '-')} is set by sparkinfra {where}; remove it")

    tp = settings.pop("tensor_parallel_size", 1)
    pp = settings.pop("pipeline_parallel_size", 1)
    if not isinstance(tp, int) or not isinstance(pp, int):
        refuse("command", "tensor/pipeline parallel sizes must be numbers")
    gmu = settings.pop("gpu_memory_utilization", None)
    if gmu is None:
        refuse("command", "no --gpu-memory-utilization: a lane pins it")
    host = settings.pop("host", "0.0.0.0")
    if host != "0.0.0.0":
        refuse("command", f"--host {host}: rank 0 serves on 0.0.0.0")
    port = settings.pop("port", None)
    backend = settings.pop("distributed_executor_backend", "mp")
    if backend not in ("mp", "ray"):
        refuse("command", f"--distributed-executor-backend {backend}: lanes launch with mp or ray")
    speculative = settings.pop("speculative_config", None)
    drafter = None
    if speculative is not None:
        if not isinstance(speculative, dict):
            refuse("command", "--speculative-config is not a JSON object")
        drafter = speculative.pop("model", None)
    if backend == "mp" and tp * pp > 1:
        settings["distributed_executor_backend"] = "mp"
    if recipe.get("solo_only") and tp * pp != 1:
        refuse("solo_only", f"a solo recipe with {tp * pp} GPUs")
    if recipe.get("cluster_only") and tp * pp == 1:
        refuse("cluster_only", "a cluster recipe on one GPU")

    env = {}
    for key, value in (recipe.get("env") or {}).items():
        text = "" if value is None else (json.dumps(value) if isinstance(value, bool) else str(value))
        if PLACEHOLDER_RE.search(text):
            refuse(f"env.{key}", f"{text!r}: unknown placeholder")
        if "$" in text:
            mapped = env_reference(text)
            if mapped is None:
                refuse(f"env.{key}", f"{text!r} expands the launching shell's variable; a lane's values are literal "
                       f"(known: {', '.join(sorted(ENV_REFERENCES))}): write its value")
            if mapped == "":
                continue  # the token: the head's download has it from hf_token_env; serving runs offline
            text = mapped
        env[str(key)] = text

    description = str(recipe.get("description") or recipe["name"])
    if recipe.get("build_args"):
        description += f" (image built with: {' '.join(str(a) for a in recipe['build_args'])})"
    data = {
        "name": path.stem,
        "description": description,
        "model": model,
        "drafter": drafter,
        "image": str(recipe["container"]),
        "nodes": tp * pp,
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
        "launch": backend,
        "served_model_name": settings.pop("served_model_name", None),
        "gpu_memory_utilization": gmu,
        "api_port": port if port != HostSettings.model_fields["api_port"].default else None,
        "serve": settings,
        "speculative": speculative,
        "env": env,
        "mods": mods or None,
    }
    try:
        return Lane.model_validate({k: v for k, v in data.items() if v is not None})
    except ValidationError as exc:
        lane_path, message = validation_error(exc, data)
        if lane_path[:1] == ("env",):
            recipe_key = key_text(lane_path)
        else:
            recipe_key = {"image": "container", "mods": "mods"}.get(str(lane_path[:1] and lane_path[0]), "command")
        refuse(recipe_key, f"{message} (lane key {key_text(lane_path) or '-'})")
