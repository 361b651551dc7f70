"""
A lane written back as a recipe people share: eugr/spark-vllm-docker v1 or sparkrun v2. The serve
command is written whole (the lane's rendered flags, tensor/pipeline parallel and GPU memory as
``defaults``), so importing the export renders the same ``vllm serve`` arguments and environment on
every rank (``tests/unit/test_recipes.py`` checks it for every shipped lane). What a recipe cannot
say is named in the export's header comment, never dropped silently: the lane's NCCL removals,
warm-up, start-up checks, container options, image flags, the thinking switch.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import yaml

from .images import images_dir, load_recipe
from .render import serve_flags
from .schema import Lane, lane_source

FORMATS = ("eugr", "sparkrun")
# A lane's placeholders as eugr's launching shell names them (the inverse of recipes.ENV_REFERENCES).
SHELL = {"{fabric_ip}": "$VLLM_HOST_IP", "{head_ip}": "$HEAD_IP"}


def _image(lane: Lane, notes: list[str]) -> str:
    if isinstance(lane.image, str):
        return lane.image
    if lane.image is None:
        notes.append("image: the cluster's (`vllm-node`, eugr's default tag, written: edit it)")
        return "vllm-node"
    recipe = load_recipe(images_dir(lane) / lane.image.recipe)
    notes.append(f"image: built by sparkinfra's images/{lane.image.recipe} (not exported)")
    return recipe.produces or f"sparkinfra/{lane.image.recipe}"


def _unsaid(lane: Lane, notes: list[str]) -> None:
    removed = sorted(k for k, v in lane.nccl_env.items() if v is None)
    if removed:
        notes.append(f"nccl_env removals {', '.join(removed)} (a recipe's env cannot unset a variable)")
    default = Lane.model_fields
    for key in ("warmup", "startup_checks", "worker_startup_checks", "image_flags", "thinking", "canary",
                "container", "master_port", "ray_port", "ray_object_store_gb"):
        if getattr(lane, key) != (default[key].default if default[key].default_factory is None
                                  else default[key].default_factory()):
            notes.append(f"{key} (sparkinfra's own)")
    if lane.mods_from == "image":
        notes.append("mods_from: image (the mods are in the image recipe's build repository)")


def _words(lane: Lane, model: str, escape: bool) -> list[str]:
    """The serve command's words: the lane's flags, tensor/pipeline parallel and GPU memory as the
    ``defaults`` placeholders."""
    settings: dict[str, Any] = dict(lane.serve)
    if lane.speculative is not None:
        settings["speculative_config"] = {**lane.speculative, **({"model": lane.drafter} if lane.drafter else {})}
    if lane.launch == "ray":
        settings["distributed_executor_backend"] = "ray"
    if lane.served_model_name:
        settings["served_model_name"] = lane.served_model_name
    flags = serve_flags(settings)
    if escape:  # eugr fills the command with str.format: literal braces doubled
        flags = [f.replace("{", "{{").replace("}", "}}") for f in flags]
    words = ["vllm", "serve", model, "--tensor-parallel-size", "{tensor_parallel}",
             "--pipeline-parallel-size", "{pipeline_parallel}", "--gpu-memory-utilization", "{gpu_memory_utilization}"]
    if lane.api_port is not None:
        words += ["--port", "{port}"]
    return words + flags


def _command(words: list[str]) -> str:
    """One flag and its values a line, shell-quoted (placeholders as they are)."""
    lines: list[list[str]] = []
    for word in words:
        quoted = word if re.fullmatch(r"\{[a-z_]+\}", word) else shlex.quote(word)
        if word.startswith("-") or not lines:
            lines.append([quoted])
        else:
            lines[-1].append(quoted)
    return " \\\n    ".join(" ".join(line) for line in lines) + "\n"


def _env(lane: Lane, fmt: str, notes: list[str]) -> dict[str, str]:
    env = dict(lane.env)
    env.update({k: v for k, v in lane.nccl_env.items() if v is not None})
    out = {}
    for key, value in env.items():
        if fmt == "eugr":
            for placeholder, variable in SHELL.items():
                value = value.replace(placeholder, variable)
        if "{" in value:
            notes.append(f"env.{key}: sparkinfra's placeholder kept ({value}; the other tool does not fill it)")
        out[key] = value
    return out


def export_lane(lane: Lane, fmt: str) -> str:
    """``lane`` as a recipe of ``fmt`` (``eugr`` or ``sparkrun``): YAML, its header naming what the
    format cannot say."""
    notes: list[str] = []
    image = _image(lane, notes)
    _unsaid(lane, notes)
    defaults: dict[str, Any] = {"tensor_parallel": lane.tensor_parallel, "pipeline_parallel": lane.pipeline_parallel,
                                "gpu_memory_utilization": lane.gpu_memory_utilization}
    if lane.api_port is not None:
        defaults["port"] = lane.api_port
    env = _env(lane, fmt, notes)
    mods = [f"mods/{m}" for m in lane.mods]
    if fmt == "eugr":
        data: dict[str, Any] = {"recipe_version": "1", "name": lane.name, "description": lane.description or lane.name,
                                "model": lane.model, "container": image}
        data["cluster_only" if lane.nodes > 1 else "solo_only"] = True
        words = _words(lane, lane.model, escape=True)
    elif fmt == "sparkrun":
        data = {"recipe_version": "2", "model": lane.model,
                "runtime": "vllm-ray" if lane.launch == "ray" else "vllm-distributed", "container": image,
                "min_nodes": lane.nodes, "max_nodes": lane.nodes,
                "metadata": {"description": lane.description or lane.name}}
        words = _words(lane, "{model}", escape=False)
    else:
        raise ValueError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    if mods:
        data["mods"] = mods
    data["defaults"] = defaults
    if env:
        data["env"] = env
    kind = "eugr/spark-vllm-docker recipe v1" if fmt == "eugr" else "sparkrun recipe v2"
    head = [f"# Exported by sparkinfra from {lane_source(lane)} ({kind}); the model's and drafter's revisions "
            "are the site's (its lock)."]
    head += [f"# Not in this recipe: {note}" for note in notes]
    body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000)
    command = "command: |\n" + "".join(f"  {line}\n" for line in _command(words).splitlines())
    return "\n".join(head) + "\n" + body + command

