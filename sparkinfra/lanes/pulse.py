"""
A spark-pulse recipe (its format v2) imported as a lane: the engine-neutral ``params`` and the
``engines.vllm`` block rendered as spark-pulse's vLLM engine renders them.

The format, as spark-pulse publishes it (kharkevich-engineering-lab/spark-pulse:
``spark_pulse/schemas/recipe-v2.schema.json``, the vLLM engine ``spark_pulse/engines/vllm.py`` and
its spec ``spark_pulse/engines/defaults/vllm.yaml``): ``recipe_version`` "2", ``name``, ``model``,
``description``, ``engine``, ``constraints`` (``solo_only``, ``cluster_only``, ``min_nodes``),
``params`` (``port``, ``host``, ``tensor_parallel``, ``pipeline_parallel``,
``gpu_memory_utilization``, ``max_model_len``, ``max_num_batched_tokens``, ``max_num_seqs``; other
keys only fill placeholders), ``engines`` (per engine: ``image``, ``mods``, ``env``, ``args``,
``command``) and ``command`` (a full template, pinned to ``engine``). Without a command, vLLM's is
``vllm serve MODEL`` + the params of its flag map + ``engines.vllm.args`` (``str.format`` with the
params); spark-pulse runs several nodes without Ray (it strips ``--distributed-executor-backend``),
so the lane launches ``mp``.
"""

from __future__ import annotations

from .recipes import Imported, Source, command_lane, lane_env, lane_mods
from .serve_args import serve_tokens

# spark-pulse's vLLM param_flags, in its render order.
PARAM_FLAGS = {
    "host": "--host", "port": "--port", "tensor_parallel": "--tensor-parallel-size",
    "pipeline_parallel": "--pipeline-parallel-size", "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len", "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
}
KEYS = {"recipe_version", "name", "model", "description", "engine", "constraints", "params", "engines", "command"}
BLOCK_KEYS = {"image", "mods", "env", "args", "command"}


def _format(source: Source, template: str, params: dict, key: str) -> str:
    try:
        return " ".join(line.strip().rstrip("\\").strip() for line in str(template).splitlines()).format(**params)
    except KeyError as exc:
        source.refuse(key, f"placeholder {{{exc.args[0]}}} has no value in params")
    except (IndexError, ValueError) as exc:
        source.refuse(key, f"cannot fill placeholders: {exc}")


def pulse_lanes(recipe: dict, source: Source) -> list[Imported]:
    """The lane (one) of a spark-pulse v2 recipe."""
    for key in ("recipe_version", "name", "model"):
        if key not in recipe:
            source.refuse(key, "required recipe key is missing (spark-pulse recipe v2)")
    source.note("recipe_version", "spark-pulse recipe v2")
    for key in recipe:
        if key not in KEYS:
            source.refuse_or_drop(str(key), "not a spark-pulse v2 key: no sparkinfra counterpart")
    engine = str(recipe.get("engine") or "vllm")
    engines = dict(recipe.get("engines") or {})
    if recipe.get("command") and engine != "vllm":
        source.refuse("engine", f"{engine}: the recipe's command is {engine}'s; sparkinfra serves with vLLM")
    if engines and "vllm" not in engines:
        source.refuse("engines", f"only {', '.join(sorted(engines))}: sparkinfra serves with vLLM")
    if engine != "vllm" and not engines:
        source.refuse("engine", f"{engine}: sparkinfra serves with vLLM")
    source.note("engine", "vLLM") if "engine" in recipe else None
    for name in engines:
        if name != "vllm":
            source.note(f"engines.{name}", f"not vLLM's: {name}'s launch, not used")
    block = dict(engines.get("vllm") or {})
    for name in block:
        if name not in BLOCK_KEYS:
            source.refuse_or_drop(f"engines.vllm.{name}", "not an engine block key (image, mods, env, args, command)")
    params = dict(recipe.get("params") or {})
    model = str(recipe["model"])
    command = block.get("command") or recipe.get("command")
    key = "engines.vllm.command" if block.get("command") else "command"
    if command:
        text = _format(source, command, params, key)
        used = set()
    else:
        words = ["vllm", "serve", model]
        for name, flag in PARAM_FLAGS.items():
            if params.get(name) not in (None, ""):
                words += [flag, str(params[name])]
        args = block.get("args")
        args = " ".join(str(a) for a in args) if isinstance(args, list) else str(args or "")
        key = "engines.vllm.args" if args else "params"
        text = " ".join(words) + (" " + _format(source, args, params, key) if args else "")
        used = set(PARAM_FLAGS)
    for name in params:
        if name not in used and "{" + str(name) + "}" not in str(command or block.get("args") or ""):
            source.note(f"params.{name}", "unused (not a vLLM flag of spark-pulse's, in no placeholder)")
    env, nccl = lane_env(source, block.get("env") or {}, "engines.vllm.env", shell="node")
    mods, mods_from = lane_mods(source, block.get("mods") or [], "engines.vllm.mods")
    image = block.get("image")
    source.note("engines.vllm.image", f"lane image {image}") if image else source.note(
        "engines", "no image: the lane runs the cluster's image (spark-pulse's is its engine's own)")
    tokens = serve_tokens(text, lambda m: source.refuse(key, m))
    if "--distributed-executor-backend" in " ".join(tokens):
        source.note(key, "--distributed-executor-backend removed: spark-pulse runs several nodes without Ray (mp)")
        at = next(i for i, t in enumerate(tokens) if t.startswith("--distributed-executor-backend"))
        del tokens[at:at + (1 if "=" in tokens[at] else 2)]
    lane = command_lane(source, tokens, key, {
        "description": str(recipe.get("description") or recipe["name"]).strip(),
        "model": model,
        "image": str(image) if image else None,
        "env": env,
        "nccl_env": nccl,
        "mods": mods,
        "mods_from": mods_from if mods_from != "project" else None,
        "launch": "mp",
    })
    constraints = dict(recipe.get("constraints") or {})
    for name, value in constraints.items():
        at = f"constraints.{name}"
        wrong = {"solo_only": bool(value) and lane.nodes != 1, "cluster_only": bool(value) and lane.nodes == 1,
                 "min_nodes": isinstance(value, int) and lane.nodes < value}.get(name)
        if wrong is None:
            source.refuse(at, "not a constraint (solo_only, cluster_only, min_nodes)")
        if wrong:
            source.refuse(at, f"{value!r} does not fit the lane's {lane.nodes} node(s)")
        source.note(at, f"checked: the lane's {lane.nodes} node(s)")
    return [Imported(lane, None, dict(source.site), list(source.notes))]
