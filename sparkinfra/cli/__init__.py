"""
The command-line views: each reads the inventory and settings as the deploys do, then prints (no
domain module imports these). One entry, ``python -m sparkinfra VIEW ...`` (or the ``sparkinfra``
command ``pip install`` makes):

    python -m sparkinfra lanes show [LANE] --inventory inventory/pair.py   # each rank's docker run
    python -m sparkinfra lanes import FILE|URL           # an eugr, sparkrun or spark-pulse recipe -> lanes
    python -m sparkinfra lanes export LANE --format eugr # a lane as a recipe to share (eugr|sparkrun)
    python -m sparkinfra status inventory/pair.py        # what it serves, per node
    python -m sparkinfra logs inventory/pair.py --follow # every rank's lane journal, merged
    python -m sparkinfra chat inventory/pair.py "Hello"  # one chat completion
    python -m sparkinfra lock inventory/pair.py [--update NAME]  # the site's lock, resolved here
    python -m sparkinfra bench --compare A B             # how bench run B differs from run A
    python -m sparkinfra rollback inventory/pair.py [--to N]  # back to a known good set, by hand

``python -m sparkinfra VIEW --help`` lists a view's options.
"""

from __future__ import annotations

import sys

from . import bench, chat, lanes, lock, logs, rollback, status

VIEWS = {"lanes": lanes.main, "status": status.main, "logs": logs.main, "chat": chat.main, "lock": lock.main,
         "bench": bench.main, "rollback": rollback.main}


def main(argv: list[str] | None = None) -> int:
    """Run the view ``argv[0]`` names with the rest of ``argv`` (default: the command line's)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if not args or args[0] not in VIEWS:
        said = f"no view {args[0]!r}" if args else "no view given"
        print(f"sparkinfra: {said} (one of: {', '.join(VIEWS)})\n\n{__doc__.strip()}", file=sys.stderr)
        return 2
    return VIEWS[args[0]](args[1:])
