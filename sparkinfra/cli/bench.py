"""
python -m sparkinfra bench --compare results/<cluster>/<lane>/<A> results/<cluster>/<lane>/<B>
"""

from __future__ import annotations

import argparse
import sys

from ..bench.report import compare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkinfra bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--compare", nargs=2, metavar=("A", "B"), required=True,
        help="two results/<cluster>/<lane>/<timestamp> folders: print how B differs from A",
    )
    args = parser.parse_args(argv)
    try:
        print(compare(*args.compare), end="")
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    return 0
