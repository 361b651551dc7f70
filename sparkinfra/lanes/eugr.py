"""
An eugr/spark-vllm-docker recipe (v1) imported as a lane: its ``vllm serve`` command line read into
settings, its mods (a ``mod-group.yaml`` group expanded from a local checkout) by reference to its
repository, its ``build_args`` (``build-and-copy.sh``'s options: ``--vllm-ref``, ``--apply-vllm-pr``...)
into an image recipe that builds ``container`` from that repository.

The format, as eugr's ``recipes/README.md`` and ``build-and-copy.sh --help`` publish it: ``name``,
``recipe_version``, ``description``, ``model``, ``container``, ``command`` (``str.format`` with
``defaults``: ``{{``/``}}`` are literal braces), ``defaults``, ``env`` (expanded by the launching
shell), ``mods`` (``mods/NAME``), ``build_args``, ``cluster_only``, ``solo_only``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from .recipes import (  # noqa: F401 (env_reference, ENV_REFERENCES: this format's, kept here by name)
    ENV_REFERENCES,
    Imported,
    Source,
    command_lane,
    env_reference,
    image_recipe,
    lane_env,
    lane_mods,
    read_source,

)
from .serve_args import serve_tokens

from .schema import Lane

RECIPE_KEYS = {
    "name", "recipe_version", "description", "model", "container", "command", "defaults", "env", "mods",
    "build_args", "cluster_only", "solo_only",
}
UPSTREAM = "https://github.com/eugr/spark-vllm-docker"
BUILD_SCRIPT = "./build-and-copy.sh"
# build-and-copy.sh's options (its --help): those that take a value, those that do not, and those a
# site's image recipe cannot take, with why.
_BUILD_VALUE = {"--gpu-arch", "--vllm-ref", "--flashinfer-ref", "-j", "--build-jobs", "--apply-vllm-pr",
                "--apply-flashinfer-pr", "--network"}
_BUILD_FLAGS = {"--rebuild-flashinfer", "--rebuild-vllm", "--force-flashinfer-download", "--force-vllm-download",
                "--force-download", "--copy-parallel", "--tf5", "--pre-tf", "--pre-transformers", "--exp-mxfp4",
                "--experimental-mxfp4", "--full-log", "--use-wheels", "--cleanup"}
_BUILD_REFUSED = {
    "-t": "the image's tag is the recipe's `container`", "--tag": "the image's tag is the recipe's `container`",
    "-c": "sparkinfra streams the image to the workers itself", "--copy-to": "sparkinfra streams the image itself",
    "--copy-to-host": "sparkinfra streams the image itself", "--copy-to-hosts": "sparkinfra streams the image itself",
    "-u": "sparkinfra reaches the nodes as the inventory says", "--user": "sparkinfra reaches the nodes itself",
    "--no-build": "an image recipe builds", "--config": "the cluster is the site's inventory",
    "--setup": "the cluster is the site's inventory",
}


def build_script(source: Source, build_args: list, container: str) -> list[str]:
    """``build-and-copy.sh -t CONTAINER`` with a recipe's ``build_args`` (each item one or more
    words), each option checked against the script's own; what each says goes to the account."""
    words = []
    for i, item in enumerate(build_args or []):
        words += [(i, w) for w in shlex.split(str(item))]
    script = [BUILD_SCRIPT, "-t", container]
    k = 0
    while k < len(words):
        i, word = words[k]
        key = f"build_args.{i}"
        if word in _BUILD_REFUSED:
            source.refuse(key, f"{word}: {_BUILD_REFUSED[word]}")
        if word in _BUILD_VALUE:
            if k + 1 >= len(words) or words[k + 1][1].startswith("-"):
                source.refuse(key, f"{word} needs a value")
            value = words[k + 1][1]
            what = {"--vllm-ref": f"vLLM at ref {value}", "--apply-vllm-pr": f"vLLM PR #{value} applied"}
            source.note(key, f"image recipe script: {word} {value}" + (f" ({what[word]})" if word in what else ""))
            script += [word, value]
            k += 2
        elif word in _BUILD_FLAGS:
            source.note(key, f"image recipe script: {word}")
            script.append(word)
            k += 1
        else:
            source.refuse(key, f"{word}: not an option of {BUILD_SCRIPT} (its --help)")
    return script


def eugr_lanes(recipe: dict, source: Source) -> list[Imported]:
    """The lane (one) of an eugr v1 recipe read as ``recipe`` from ``source``."""
    for key in recipe:
        if key not in RECIPE_KEYS:
            source.refuse(str(key), "unknown recipe key (eugr recipe v1)")
    for key in ("name", "recipe_version", "container", "command"):
        if key not in recipe:
            source.refuse(key, "required recipe key is missing")
    if str(recipe["recipe_version"]) != "1":
        source.refuse("recipe_version", f"version {recipe['recipe_version']!r}: only version 1 recipes can be imported")
    source.note("recipe_version", "eugr/spark-vllm-docker recipe v1")
    defaults = dict(recipe.get("defaults") or {})
    try:
        command = str(recipe["command"]).format(**defaults)
    except KeyError as exc:
        source.refuse("command", f"placeholder {{{exc.args[0]}}} has no value in defaults")
    except (IndexError, ValueError) as exc:
        source.refuse("command", f"cannot fill placeholders: {exc}")
    for name in defaults:
        if "{" + str(name) + "}" not in str(recipe["command"]):
            source.note(f"defaults.{name}", "unused (no {%s} in command: eugr's launcher uses it nowhere else)" % name)
    source.note("description" if recipe.get("description") else "name", "lane description")
    if recipe.get("description"):
        source.note("name", "informational: the lane is named after the file")
    env, nccl = lane_env(source, recipe.get("env") or {}, "env", shell="node")
    mods, mods_from = lane_mods(source, recipe.get("mods") or [], "mods")
    container = str(recipe["container"])
    image: dict | None = None
    if recipe.get("build_args") or source.repository:
        if not source.repository:
            source.repository, source.ref = UPSTREAM, "main"
            source.note("container", f"repository not known (a file, no --repo): eugr's upstream {UPSTREAM} at "
                        "main assumed (give --repo CHECKOUT for a fork)")
        script = build_script(source, recipe.get("build_args") or [], container)
        image = image_recipe(source, {
            "description": f"{container}, built by {BUILD_SCRIPT} of {source.repository} (imported from {source.name})",
            "repository": source.repository, "script": script, "produces": container,
        }, "container")
        source.note("container", f"image recipe images/{source.stem} ({source.repository} at "
                    f"{source.commit or source.ref}, {' '.join(script)}, produces {container}); lane image "
                    f"{{recipe: {source.stem}}}")
    else:
        source.note("container", f"lane image {container} (the site's lock pins its digest)")
    lane = command_lane(source, serve_tokens(command, lambda m: source.refuse("command", m)), "command", {
        "description": str(recipe.get("description") or recipe["name"]),
        "model": recipe.get("model"),
        "image": {"recipe": source.stem} if image else container,
        "env": env,
        "nccl_env": nccl,
        "mods": mods,
        "mods_from": mods_from if mods_from != "project" else None,
    })
    if recipe.get("solo_only") and lane.nodes != 1:
        source.refuse("solo_only", f"a solo recipe with {lane.nodes} GPUs")
    if recipe.get("cluster_only") and lane.nodes == 1:
        source.refuse("cluster_only", "a cluster recipe on one GPU")
    for key in ("solo_only", "cluster_only"):
        if key in recipe:
            source.note(key, f"checked: the lane's {lane.nodes} node(s)")
    return [Imported(lane, image, dict(source.site), list(source.notes))]


def import_eugr(path: str | Path) -> Lane:
    """
    A lane from an eugr/spark-vllm-docker recipe file (v1: name, recipe_version, container, command,
    defaults, env, mods...). The lane is named after the recipe file.

    Refused (``LaneError`` naming the file and key): command placeholders without a default, an env
    value expanding a variable ``ENV_REFERENCES`` does not map (``$HF_TOKEN`` becomes the site's
    ``hf_token_env``), and flags sparkinfra sets per rank or from the cluster's settings.
    ``imports.import_recipe`` reads every format, a URL, and a checkout's mods.
    """
    recipe, source = read_source(str(path))
    return eugr_lanes(recipe, source)[0].lane
