"""
    python -m sparkinfra lanes import RECIPE.yaml   # an eugr/spark-vllm-docker recipe -> lane YAML
    python -m sparkinfra lanes show [LANE] --inventory inventory/pair.py [--data key=value ...]
                                                    # each rank's docker run, env files, revisions
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import lock, rules
from ..run import load_files
from ..settings import SettingsError
from ..lanes.checks import check_lane
from ..lanes.eugr import import_eugr
from ..lanes.render import lane_yaml
from ..lanes.schema import LaneError, find_lane
from .show import show


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkinfra lanes", description="sparkinfra lanes")
    commands = parser.add_subparsers(dest="command", required=True)
    imported = commands.add_parser("import", help="print the lane of an eugr/spark-vllm-docker recipe")
    imported.add_argument("file", help="the recipe's YAML file")
    shown = commands.add_parser("show", help="print what each rank of a lane will run, connecting to nothing")
    shown.add_argument("lane", nargs="?", help="the lane (default: each cluster's lane setting)")
    shown.add_argument("--inventory", required=True, help="pyinfra inventory file, e.g. inventory/pair.py")
    shown.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help="override data, as pyinfra's --data")
    args = parser.parse_args(argv)
    try:
        if args.command == "show":
            return _show(args.inventory, args.data, args.lane)
        lane = import_eugr(args.file)
    except (LaneError, SettingsError, lock.LockError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(f"# Imported from {args.file}; save as lanes/{lane.name}.yaml\n{lane_yaml(lane)}")
    return 0


def _show(inventory: str, data: list[str], name: str | None) -> int:
    _, settings = load_files(inventory, data, pin=False)  # the site's references, as it names them
    clusters = [c for c in settings.clusters.values() if name or c.config.lane]
    if not clusters:
        print(f"error: no cluster of {inventory} names a lane (give one: show LANE)", file=sys.stderr)
        return 1
    refused = False
    for i, cluster in enumerate(clusters):
        lane = find_lane(name or cluster.config.lane)
        path, refs, entries = lock.site_lock(cluster, lane, inventory, Path.cwd())
        cluster = lock.apply(cluster, lock.pins(refs, entries), path)
        problems = check_lane(lane, cluster) + rules.refusals(lane, cluster)
        refused = refused or bool(problems)
        said = lock.reference_lines(refs, entries, path, inventory)
        sys.stdout.write(("\n" if i else "") + show(lane, cluster, problems, said))
    return 1 if refused else 0
