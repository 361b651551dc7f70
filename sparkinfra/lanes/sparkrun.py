"""
A sparkrun recipe (v2) imported as lanes: one lane per cluster size its ``overrides`` name.

The format, as sparkrun publishes it (spark-arena/sparkrun: ``RECIPES.md``, the keys of
``src/sparkrun/core/recipe.py``, the vLLM runtimes' flag map in ``src/sparkrun/runtimes/
_vllm_common.py``, ``docs/STARTUP_READINESS.md`` for ``readiness``): ``model``, ``model_revision``,
``runtime``, ``container``, ``defaults`` (the command's ``{key}`` values; without a ``command`` the
runtime renders the keys of its flag map), ``env`` (``$VAR`` expanded from the controller's
environment), ``command``, ``metadata``, ``benchmark``, the topology keys (``min_nodes``,
``max_nodes``, ``mode``, ``solo_only``, ``cluster_only``), the hooks (``pre_exec``, ``post_exec``,
``post_commands``, ``stop_after_post``), ``builder``/``builder_config``/``build_args``/``mods`` (the
eugr builder), ``executor``/``executor_config``, ``distribution_config`` (each model's revision),
``readiness``, ``runtime_config`` and sparkrun's placement keys (``scheduler``, ``layout``,
``cluster_config``).

Not found in sparkrun's published documentation or code (read at 0.2.40 and its develop-03x
branch, and the 0.3.x documents): ``overrides`` and ``runtime_cache``, which issue #44 names. Their
shape here is this module's assumption, said so where it is read: ``overrides`` is a list of
``{when: {nodes: N}, defaults: {...}, env: {...}, command: ...}``, each over the recipe's own
values for a cluster of N nodes (``tensor_parallel`` N / ``pipeline_parallel`` unless it says);
``runtime_cache`` (any value) asks for the compile caches kept across starts, which sparkinfra
mounts on every rank itself.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from .eugr import UPSTREAM, build_script
from .recipes import Imported, Source, command_lane, image_recipe, lane_env, lane_mods
from .serve_args import serve_tokens

# sparkrun's vLLM flag map (what ``generate_command`` renders from ``defaults`` without a command),
# in its order; the keys that are switches.
FLAG_MAP = {
    "port": "--port", "host": "--host", "tensor_parallel": "-tp", "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len", "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs", "served_model_name": "--served-model-name", "dtype": "--dtype",
    "quantization": "--quantization", "enforce_eager": "--enforce-eager", "enable_prefix_caching":
    "--enable-prefix-caching", "trust_remote_code": "--trust-remote-code", "distributed_executor_backend":
    "--distributed-executor-backend", "pipeline_parallel": "-pp", "data_parallel": "--data-parallel-size",
    "kv_cache_dtype": "--kv-cache-dtype", "otlp_traces_endpoint": "--otlp-traces-endpoint", "api_key": "--api-key",
}
SWITCHES = {"enforce_eager", "enable_prefix_caching", "trust_remote_code", "enable_auto_tool_choice"}
# sparkrun's runtimes that run vLLM, and the launch each is.
RUNTIMES = {"": None, "vllm": None, "vllm-distributed": "mp", "vllm-ray": "ray", "eugr-vllm": "ray"}
READINESS = {"port_timeout_s": 1800, "health_timeout_s": 900, "inference_timeout_s": 1200}  # sparkrun's defaults
INFORMATIONAL = ("runtime_version", "benchmark", "sparkrun_version")
PLACEMENT = ("scheduler", "layout", "cluster_config")
HANDLED = {
    "recipe_version", "name", "description", "model", "model_revision", "runtime", "container", "defaults", "env",
    "command", "metadata", "min_nodes", "max_nodes", "mode", "solo_only", "cluster_only", "pre_exec", "post_exec",
    "post_commands", "stop_after_post", "builder", "builder_config", "build_args", "mods", "executor",
    "executor_config", "distribution_config", "readiness", "runtime_config", "overrides", "runtime_cache",
    *INFORMATIONAL, *PLACEMENT,
}
PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")


def _substitute(text: str, chain: dict[str, Any]) -> str:
    """sparkrun's ``{key}`` substitution: known keys replaced (again, for values naming others),
    unknown ones left as they are."""
    for _ in range(8):
        done = PLACEHOLDER.sub(lambda m: str(chain[m.group(1)]) if m.group(1) in chain else m.group(0), text)
        if done == text:
            break
        text = done
    return text


def _command(source: Source, command: str | None, defaults: dict, model: str, key: str) -> str:
    chain = {**defaults, "model": model}
    if command:
        text = _substitute(str(command), chain)
        left = [n for n in PLACEHOLDER.findall(text) if n not in chain]
        if left:
            source.refuse(key, f"placeholder {{{left[0]}}} has no value in defaults (sparkrun would pass it as it is)")
        if "served_model_name" in defaults and "--served-model-name" not in text:
            text += f" --served-model-name {defaults['served_model_name']}"  # sparkrun appends it
        used = set(PLACEHOLDER.findall(str(command))) | {"served_model_name"}
        for name in defaults:
            if name not in used:
                source.note(f"defaults.{name}", "unused (no {%s} in command)" % name)
        return text
    words = ["vllm", "serve", model]
    for name, flag in FLAG_MAP.items():
        if name in defaults:
            value = defaults[name]
            words += ([flag] if value else []) if name in SWITCHES else [flag, str(value)]
    for name in defaults:
        if name not in FLAG_MAP:
            source.note(f"defaults.{name}", "unused (no command: sparkrun renders only its flag map's keys)")
    source.note("defaults", "the command sparkrun renders from its flag map (no command)")
    return " ".join(words)


def _shm(text: str) -> str | None:
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgKMG]?)[bB]?", str(text).strip())
    if not found:
        return None
    number, unit = float(found.group(1)), found.group(2).lower()
    if number.is_integer():
        return f"{int(number)}{unit}"
    scale = {"g": 1024, "m": 1, "k": 1 / 1024, "": 1 / 2**20}[unit]
    return f"{max(1, round(number * scale))}m"


def _container(source: Source, config: dict) -> dict:
    """The lane's ``container`` of sparkrun's ``executor_config``."""
    out: dict[str, Any] = {}
    for name, value in (config or {}).items():
        key = f"executor_config.{name}"
        if name == "privileged":
            source.note(key, "sparkinfra gives every rank the RDMA devices, IPC_LOCK and memlock instead "
                        "(lane container.rdma)")
        elif name == "gpus":
            out["gpus"] = str(value)
            source.note(key, "lane container.gpus")
        elif name == "ipc":
            out["ipc"] = str(value)
            source.note(key, "lane container.ipc")
        elif name == "shm_size":
            size = _shm(value)
            if size is None:
                source.refuse(key, f"{value!r} is not a size (e.g. 20gb)")
            out["shm_size"] = size
            source.note(key, f"lane container.shm_size {size}")
        elif name == "network":
            if value != "host":
                source.refuse(key, f"network {value}: every rank runs on the host's network (the fabric)")
            source.note(key, "every rank runs on the host's network")
        elif name in ("auto_remove", "restart_policy"):
            source.note(key, "sparkinfra's unit restarts a failed lane; each start removes the old container")
        elif name == "entrypoint" and value in ("", None):
            source.note(key, "sparkinfra runs the lane's command as the container's command")
        else:
            source.refuse_or_drop(key, "an executor setting sparkinfra has no counterpart for")
    return out


def _readiness(source: Source, readiness: dict) -> list[dict]:
    """The lane's warm-up of sparkrun's ``readiness``; its timeouts become the site's
    ``lane_ready_timeout`` (port, health and first token: one bound on a start)."""
    timeouts = dict(READINESS)
    warmup: list[dict] = []
    for name, value in (readiness or {}).items():
        key = f"readiness.{name}"
        if name in READINESS:
            if not isinstance(value, (int, float)) or value <= 0:
                source.refuse(key, f"{value!r}: sparkinfra bounds every start (a number of seconds over 0)")
            timeouts[name] = value
            source.note(key, "part of the site's lane_ready_timeout (port, health and first token: one bound)")
        elif name == "inference":
            source.note(key, "sparkinfra's start is a real completion on every (re)start (lane_ready_timeout)"
                        if value else "no inference check: sparkinfra's start still needs a completion; edit "
                        "the lane's warmup (an embedding model is not a lane sparkinfra serves)")
        elif name == "inference_style":
            if value not in ("auto", "openai-chat-stream-v1"):
                source.refuse(key, f"{value}: sparkinfra checks a lane with chat completions")
            source.note(key, "chat completions")
        elif name == "inference_prompt":
            warmup.append({"name": "readiness", "messages": [{"role": "user", "content": str(value)}], "max_tokens": 64})
            source.note(key, "lane warmup 'readiness' (a chat request of 64 tokens)")
        else:
            source.refuse(key, "not a readiness setting (port_timeout_s, health_timeout_s, inference, "
                          "inference_style, inference_prompt, inference_timeout_s)")
    if any(name in (readiness or {}) for name in READINESS):
        total = int(sum(timeouts.values()))
        source.setting("lane_ready_timeout", str(total), "readiness")
    return warmup


def _distribution(source: Source, config: dict, model: str, drafter: str | None) -> None:
    for part, value in (config or {}).items():
        key = f"distribution_config.{part}"
        if part == "models":
            for i, entry in enumerate((value or {}).get("entries") or []):
                entry = {"name": entry} if isinstance(entry, str) else dict(entry)
                name = str(entry.get("name", "")).replace("{model}", model)
                setting = {model: "model_revision", drafter: "drafter_revision"}.get(name)
                if setting is None:
                    source.refuse(f"{key}.entries.{i}", f"{name}: sparkinfra stages the lane's model and drafter only")
                if entry.get("revision"):
                    source.setting(setting, str(entry["revision"]), f"{key}.entries.{i}.revision")
            source.note(key, "sparkinfra stages the weights on every node itself (stage)")
        elif part in ("containers", "externally_provided"):
            source.note(key, "sparkinfra streams the image to every node itself (stage)")
        else:
            source.refuse(key, "not a distribution setting (models, containers)")


def _image(source: Source, recipe: dict) -> tuple[Any, dict | None]:
    container = str(recipe.get("container") or "")
    builder = str(recipe.get("builder") or "")
    config = dict(recipe.get("builder_config") or {})
    if builder not in ("", "docker-pull", "eugr"):
        source.refuse("builder", f"{builder}: sparkinfra builds with an image recipe (eugr's build-and-copy.sh, or a "
                      "Dockerfile)")
    if builder == "eugr" or recipe.get("build_args"):
        for name in config:
            if name not in ("repo_url", "branch"):
                source.refuse(f"builder_config.{name}", "not an eugr builder setting (repo_url, branch)")
        if config.get("repo_url"):
            source.repository, source.commit = str(config["repo_url"]).removesuffix(".git"), None
            source.ref = str(config.get("branch") or "main")
        elif not source.repository:
            source.repository, source.ref = UPSTREAM, str(config.get("branch") or "main")
        script = build_script(source, recipe.get("build_args") or [], container or "vllm-node")
        image = image_recipe(source, {
            "description": f"{container}, built by eugr's builder from {source.repository} (imported from {source.name})",
            "repository": source.repository, "script": script, "produces": container or "vllm-node",
        }, "builder")
        source.note("builder", f"image recipe images/{source.stem} ({' '.join(script)})")
        return {"recipe": source.stem}, image
    if not container:
        source.note("container", "none: the lane runs the cluster's image")
        return None, None
    source.note("container", f"lane image {container} (the site's lock pins its digest)")
    return container, None


def _lane(recipe: dict, source: Source, defaults: dict, env: dict, command: Any) -> Imported:
    """One lane of ``recipe`` with the values of one cluster size."""
    model = str(recipe["model"])
    source.note("recipe_version", "sparkrun recipe v2")
    for name in recipe:
        key = str(name)
        if key not in HANDLED:
            source.refuse_or_drop(key, "unknown key (sparkrun sweeps it into runtime_config): no sparkinfra counterpart")
        elif key in INFORMATIONAL:
            source.note(key, "informational: not used (sparkinfra measures with its own bench)")
        elif key in PLACEMENT:
            source.refuse_or_drop(key, "sparkrun's placement: the site's inventory places the ranks")
        elif key in ("pre_exec", "post_exec", "post_commands") and recipe[key]:
            why = {"pre_exec": "runs commands in every container before serving: write them as a mod (mods/NAME/"
                   "run.sh), which sparkinfra places, digests and runs before the serve command",
                   "post_exec": "runs commands in the head's container once it serves: a lane's container runs "
                   "vLLM only",
                   "post_commands": "runs arbitrary commands on the controller (a shell): sparkinfra runs none "
                   "from a recipe"}[key]
            source.refuse_or_drop(key, why)
        elif key == "stop_after_post":
            if recipe[key]:
                source.refuse_or_drop(key, "a lane serves until another replaces it")
            source.note(key, "a lane serves until another replaces it")
        elif key == "runtime_config":
            for inner in recipe[key] or {}:
                source.refuse_or_drop(f"{key}.{inner}", "runtime-specific config: no sparkinfra counterpart")
    runtime = str(recipe.get("runtime") or "")
    if runtime not in RUNTIMES:
        source.refuse("runtime", f"{runtime}: sparkinfra serves with vLLM ({', '.join(r for r in RUNTIMES if r)})")
    if str(recipe.get("executor") or "docker") != "docker":
        source.refuse("executor", f"{recipe['executor']}: an executor sparkinfra does not drive (it runs docker on "
                      "each node itself)")
    source.note("runtime", f"launch {RUNTIMES[runtime] or 'as the command says'}") if "runtime" in recipe else None
    source.note("executor", "docker on each node") if "executor" in recipe else None
    if recipe.get("model_revision"):
        source.setting("model_revision", str(recipe["model_revision"]), "model_revision")
    if "runtime_cache" in recipe:
        source.note("runtime_cache", "sparkinfra keeps every rank's compile caches (vLLM, torch.compile, Triton, "
                    "FlashInfer) per image on the node itself (shape assumed: see sparkinfra/lanes/sparkrun.py)")
    metadata = dict(recipe.get("metadata") or {})
    for name in metadata:
        source.note(f"metadata.{name}", "lane description" if name == "description" else "informational: not used")
    image, built = _image(source, recipe)
    lane_env_, nccl = lane_env(source, env, "env", shell="controller")
    mods, mods_from = lane_mods(source, recipe.get("mods") or [], "mods")
    warmup = _readiness(source, recipe.get("readiness") or {})
    text = _command(source, command, defaults, model, "command" if command else "defaults")
    where = "command" if command else "defaults"
    lane = command_lane(source, serve_tokens(text, lambda m: source.refuse(where, m)), where, {
        "description": str(recipe.get("description") or metadata.get("description") or recipe.get("name") or model),
        "model": model,
        "image": image,
        "env": lane_env_,
        "nccl_env": nccl,
        "mods": mods,
        "mods_from": mods_from if mods_from != "project" else None,
        "launch": RUNTIMES.get(runtime),
        "container": _container(source, recipe.get("executor_config") or {}),
        "warmup": warmup,
    })
    low = int(recipe.get("min_nodes") or (2 if recipe.get("cluster_only") or recipe.get("mode") == "cluster" else 1))
    high = recipe.get("max_nodes") or (1 if recipe.get("solo_only") or recipe.get("mode") == "solo" else None)
    if lane.nodes < low or high is not None and lane.nodes > int(high):
        key = next((k for k in ("min_nodes", "max_nodes", "mode", "solo_only", "cluster_only") if k in recipe), "defaults")
        source.refuse(key, f"the lane's {lane.nodes} node(s) are outside the recipe's {low}..{high or 'any'}")
    for key in ("min_nodes", "max_nodes", "mode", "solo_only", "cluster_only"):
        if key in recipe:
            source.note(key, f"checked: the lane's {lane.nodes} node(s)")
    _distribution(source, recipe.get("distribution_config") or {}, model, lane.drafter)
    return Imported(lane, built, dict(source.site), list(source.notes))


def sparkrun_lanes(recipe: dict, source: Source) -> list[Imported]:
    """The lanes of a sparkrun v2 recipe: its own, and one per cluster size its ``overrides`` name
    (``NAME-<N>n``; an override of the recipe's own size changes its own lane)."""
    if not recipe.get("model"):
        source.refuse("model", "required recipe key is missing (sparkrun v2)")
    defaults = dict(recipe.get("defaults") or {})
    env = dict(recipe.get("env") or {})
    overrides = recipe.get("overrides") or []
    if not isinstance(overrides, list):
        source.refuse("overrides", "a list of {when: {nodes: N}, defaults, env, command}")
    sizes: dict[int, tuple[int, dict]] = {}
    for i, entry in enumerate(overrides):
        key = f"overrides.{i}"
        when = (entry or {}).get("when") if isinstance(entry, dict) else None
        nodes = when.get("nodes") if isinstance(when, dict) else None
        if not isinstance(nodes, int) or nodes < 1 or set(when) != {"nodes"}:
            source.refuse(key, "each override is {when: {nodes: N}, ...}: only the node count selects one")
        for name in entry:
            if name not in ("when", "defaults", "env", "command"):
                source.refuse(f"{key}.{name}", "an override changes defaults, env or command")
        if nodes in sizes:
            source.refuse(f"{key}.when.nodes", f"{nodes} nodes: also override {sizes[nodes][0]}")
        sizes[nodes] = (i, entry)
    pp = int(defaults.get("pipeline_parallel", 1))
    own = int(defaults.get("tensor_parallel", 1)) * pp
    out = []
    for nodes in [own, *sorted(n for n in sizes if n != own)]:
        name = source.stem if nodes == own else f"{source.stem}-{nodes}n"
        one = dataclasses.replace(source, stem=name, notes=[], site={})
        values, lane_env_values, command = dict(defaults), dict(env), recipe.get("command")
        if nodes in sizes:
            i, entry = sizes[nodes]
            values.update(entry.get("defaults") or {})
            lane_env_values.update(entry.get("env") or {})
            command = entry.get("command") or command
            if "tensor_parallel" not in (entry.get("defaults") or {}) and nodes != own:
                values["tensor_parallel"] = nodes // int(values.get("pipeline_parallel", 1))
            one.note(f"overrides.{i}", f"lane {name} (a cluster of {nodes} nodes; shape assumed, see "
                     "sparkinfra/lanes/sparkrun.py)")
        out.append(_lane(recipe, one, values, lane_env_values, command))
    return out
