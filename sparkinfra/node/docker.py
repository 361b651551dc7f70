"""
The one ``docker run`` builder: a rank's container as ``lane_ctl`` starts it and as
``lanes show`` prints it, and the throwaway containers of the same options. Stdlib only.
"""

from __future__ import annotations

from .plan import CompileCache, RunnerPlan


def run(name: str, options: list[str], image: str, command: list[str] = (), *, detach: bool = False,
        stdin: bool = False, entrypoint: str = "") -> list[str]:
    """``docker run --rm --name NAME OPTIONS IMAGE COMMAND`` (``-d`` instead of ``--rm``: detached,
    kept; ``-i``: stdin attached; ``--entrypoint`` before the options)."""
    return ["docker", "run", *(["-d"] if detach else ["--rm"]), *(["-i"] if stdin else []), "--name", name,
            *(["--entrypoint", entrypoint] if entrypoint else []), *options, image, *command]


def pin_mounts(pin: str, copies: list[str]) -> list[str]:
    """The pinned NCCL mounted read-only over each other ``libnccl.so*`` copy of the container."""
    return [x for path in copies for x in ("-v", f"{pin}:{path}:ro")] if pin else []


def cache_key(image_id: str) -> str:
    """The short image ID (``sha256:`` dropped, 12 hex) a lane's compile caches are kept under."""
    return image_id.removeprefix("sha256:")[:12] or "unknown"


def cache_folders(spec: CompileCache | None, image: str) -> dict[str, str]:
    """Each compile cache of the short image ID ``image``: its folder on the node, by its path in
    the container (``<root>/<image>/<kind>``)."""
    return {path: f"{spec.root}/{image}/{kind}" for kind, path in spec.mounts.items()} if spec else {}


def cache_mounts(p: RunnerPlan, image: str) -> list[str]:
    """Mounts of the lane's compile caches for the short image ID ``image``, each at its default
    path in the container."""
    return [x for path, folder in cache_folders(p.compile_cache, image).items() for x in ("-v", f"{folder}:{path}")]


def rank_options(p: RunnerPlan, copies: list[str]) -> list[str]:
    """The rank's options: the plan's, then the pin over each of ``copies`` (``LD_PRELOAD`` reaches
    only what loads by name)."""
    return [*p.docker_options, *pin_mounts(p.nccl_pin, copies)]


def rank_run(p: RunnerPlan, copies: list[str], image: str) -> list[str]:
    """The rank's container: the plan's options, the pin over each of ``copies``, the compile caches
    of the short image ID ``image``, the image and the lane's command."""
    return run(p.container, [*rank_options(p, copies), *cache_mounts(p, image)], p.image, p.command)


def check_run(p: RunnerPlan, purpose: str, options: list[str], *args: str) -> list[str]:
    """``container_check ARGS`` of the node programs (mounted read-only) in a throwaway container
    ``<container>-<purpose>`` of ``options`` and the rank's image."""
    c = p.container_check
    return run(f"{p.container}-{purpose}", [*options, "-v", f"{c.programs}:{c.mount}:ro"], p.image,
               [c.mount, "container_check", *args], entrypoint="python3")
