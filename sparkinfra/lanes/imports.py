"""
A published recipe imported as lanes, whichever of the three formats it is: eugr/spark-vllm-docker
v1 (``eugr``), sparkrun v2 (``sparkrun``) or spark-pulse v2 (``pulse``). The format is told by the
recipe's keys, not its ``recipe_version`` alone (both v2s say "2"): spark-pulse's ``params``,
``engines``, ``engine`` or ``constraints``; sparkrun's keys of its own (``runtime``, ``metadata``,
``executor_config``, hooks...) or a version "2" without them; else eugr's v1.

    import_recipe("recipes/x.yaml", repo="../spark-vllm-docker")  # its mods from the checkout
    import_recipe("https://raw.githubusercontent.com/O/R/BRANCH/recipes/x.yaml")  # the lock pins BRANCH
"""

from __future__ import annotations

from .eugr import eugr_lanes
from .pulse import pulse_lanes
from .recipes import Imported, read_source
from .sparkrun import HANDLED as SPARKRUN_KEYS
from .sparkrun import sparkrun_lanes

PULSE_ONLY = {"params", "engines", "engine", "constraints"}
EUGR_KEYS = {"name", "recipe_version", "description", "model", "container", "command", "defaults", "env", "mods",
             "build_args", "cluster_only", "solo_only"}
FORMATS = {"eugr": eugr_lanes, "sparkrun": sparkrun_lanes, "pulse": pulse_lanes}


def recipe_format(recipe: dict) -> str:
    """``eugr``, ``sparkrun`` or ``pulse``: which format ``recipe``'s keys are."""
    keys = set(map(str, recipe))
    if keys & PULSE_ONLY:
        return "pulse"
    if str(recipe.get("recipe_version", "1")) == "2" or keys & (SPARKRUN_KEYS - EUGR_KEYS):
        return "sparkrun"
    return "eugr"


def import_recipe(location: str, repo: str | None = None, drop: tuple[str, ...] = ()) -> list[Imported]:
    """
    The lanes of the recipe at ``location`` (a file, or an http(s)/file URL), each with the image
    recipe it builds (if any), the site settings it needs and the account of every key.

    + repo: a local checkout of the recipe's repository (its ``mods/`` and ``mod-group.yaml``
      expanded, its HEAD the image recipe's commit)
    + drop: recipe keys whose refusal the user accepts (named in the account, not imported)

    Raises ``LaneError`` naming the file (or URL) and the key.
    """
    recipe, source = read_source(location, repo, drop)
    return FORMATS[recipe_format(recipe)](recipe, source)
