"""
    python -m sparkinfra lanes import FILE|URL [--repo CHECKOUT] [--drop KEY] [--write]
                                                    # an eugr, sparkrun or spark-pulse recipe -> lanes
    python -m sparkinfra lanes export LANE --format eugr|sparkrun   # a lane as a recipe to share
    python -m sparkinfra lanes show [LANE] --inventory inventory/pair.py [--data key=value ...]
                                                    # each rank's docker run, env files, revisions
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from .. import lock, rules
from ..run import load_files
from ..settings import SettingsError
from ..lanes.checks import check_lane
from ..lanes.export import FORMATS, export_lane
from ..lanes.imports import import_recipe
from ..lanes.recipes import Imported
from ..lanes.render import lane_yaml
from ..lanes.schema import LaneError, find_lane
from .show import show


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkinfra lanes", description="sparkinfra lanes")
    commands = parser.add_subparsers(dest="command", required=True)
    imported = commands.add_parser("import", help="the lanes of an eugr, sparkrun or spark-pulse recipe")
    imported.add_argument("file", help="the recipe: a YAML file, or an http(s) URL (a GitHub file: its ref is locked)")
    imported.add_argument("--repo", metavar="CHECKOUT", help="a local checkout of the recipe's repository: its mods and "
                          "mod groups expanded, its HEAD the image recipe's commit")
    imported.add_argument("--drop", action="append", default=[], metavar="KEY",
                          help="import without this refused key (named in the account)")
    imported.add_argument("--write", action="store_true", help="write lanes/NAME.yaml (and images/NAME/recipe.yaml) "
                          "here instead of printing them")
    exported = commands.add_parser("export", help="print a lane as an eugr or sparkrun recipe")
    exported.add_argument("lane", help="the lane")
    exported.add_argument("--format", required=True, choices=FORMATS)
    shown = commands.add_parser("show", help="print what each rank of a lane will run, connecting to nothing")
    shown.add_argument("lane", nargs="?", help="the lane (default: each cluster's lane setting)")
    shown.add_argument("--inventory", required=True, help="pyinfra inventory file, e.g. inventory/pair.py")
    shown.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help="override data, as pyinfra's --data")
    args = parser.parse_args(argv)
    try:
        if args.command == "show":
            return _show(args.inventory, args.data, args.lane)
        if args.command == "export":
            sys.stdout.write(export_lane(find_lane(args.lane), args.format))
            return 0
        lanes = import_recipe(args.file, args.repo, tuple(args.drop))
    except (LaneError, SettingsError, lock.LockError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    files = [(f"lanes/{each.lane.name}.yaml", lane_yaml(each.lane)) for each in lanes]
    files += [(f"images/{each.lane.name}/recipe.yaml", yaml.safe_dump(each.image, sort_keys=False, width=100))
              for each in lanes if each.image]
    for each in lanes:
        print(_account(args.file, each), file=sys.stderr)
    if args.write:
        for relative, text in files:
            (Path.cwd() / relative).parent.mkdir(parents=True, exist_ok=True)
            (Path.cwd() / relative).write_text(text, encoding="utf-8")
            print(f"wrote {relative}", file=sys.stderr)
        return 0
    sys.stdout.write("---\n".join(f"# Imported from {args.file}; save as {relative}\n{text}" for relative, text in files))
    return 0


def _account(location: str, imported: Imported) -> str:
    """What each recipe key became in lane ``imported``, and the site settings it needs."""
    lines = [f"# lane {imported.lane.name}, from {location}:"]
    lines += [f"#   {note}" for note in imported.notes]
    if imported.site:
        lines.append("# site settings (group data, or pyinfra's --data):")
        lines += [f"#   --data {key}={value}" for key, value in imported.site.items()]
    return "\n".join(lines)


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
