"""
Lanes: the serving recipes as validated data (``lanes/<name>.yaml``), rendered per rank into the
command of a node's container, and checked by vLLM's own argument parser.

A lane says what a cluster serves and how: the model (and drafter), the parallel layout, the
``vllm serve`` settings, its environment, the container's options, the warm-up requests and the
lines rank 0's start-up log must show. The cluster's settings say where: nodes, fabric addresses,
ports, image and the pinned revisions. ``launch`` joins both for one rank.

    python -m sparkinfra lanes import FILE|URL       # an eugr, sparkrun or spark-pulse recipe -> lanes
    python -m sparkinfra lanes export LANE --format eugr|sparkrun   # a lane as a recipe

An error names the file, the key and (when known) the line.
"""


from .checks import check_lane, effective_ports, lane_problems
from .eugr import import_eugr
from .export import export_lane
from .images import Image, Recipe, lane_image, load_recipe
from .imports import import_recipe
from .mods import Mod, ModsNotFetched, lane_mods, mod_digest, mod_files
from .render import Launch, container_options, lane_yaml, launch, serve_flags, utilization
from .schema import (
    CHECK_CACHE,
    CHECK_SCRIPT,
    LANES_DIR,
    NO_VLLM,
    PLACEHOLDERS,
    RESERVED,
    Container,
    Lane,
    LaneError,
    display,
    find_lane,
    lane_dirs,
    lane_source,
    load_lane,
    mods_dir,
)
from .vllm import (
    check_with_vllm,
    refuse_invalid,
    validate_with_vllm,
    vllm_errors,
    vllm_request,
)

__all__ = [
    "CHECK_CACHE", "CHECK_SCRIPT", "LANES_DIR", "NO_VLLM", "PLACEHOLDERS", "RESERVED", "Container", "Image", "Lane",
    "LaneError", "Launch", "display", "check_lane", "display", "check_with_vllm", "container_options", "effective_ports",
    "export_lane", "find_lane",
    "import_eugr", "import_recipe", "lane_dirs", "lane_image", "load_recipe", "Recipe", "lane_problems", "lane_source",
    "lane_yaml", "launch", "load_lane", "mods_dir", "Mod", "ModsNotFetched", "lane_mods", "mod_digest", "mod_files",
    "refuse_invalid", "serve_flags", "utilization", "validate_with_vllm", "vllm_errors", "vllm_request",
]
