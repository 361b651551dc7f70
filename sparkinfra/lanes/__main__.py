"""
    python -m sparkinfra.lanes import RECIPE.yaml   # an eugr/spark-vllm-docker recipe -> lane YAML
"""

from __future__ import annotations

import argparse
import sys

from .eugr import import_eugr
from .render import lane_yaml
from .schema import LaneError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkinfra.lanes", description="sparkinfra lanes")
    commands = parser.add_subparsers(dest="command", required=True)
    imported = commands.add_parser("import", help="print the lane of an eugr/spark-vllm-docker recipe")
    imported.add_argument("file", help="the recipe's YAML file")
    args = parser.parse_args(argv)
    try:
        lane = import_eugr(args.file)
    except LaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(f"# Imported from {args.file}; save as lanes/{lane.name}.yaml\n{lane_yaml(lane)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
