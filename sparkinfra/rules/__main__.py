"""
``python -m sparkinfra.rules``: every known-bad state the tool checks (``rules/``), with what it
checks, its remedy and where the field met it.
"""

from __future__ import annotations

import sys

from . import RuleError, listing, load


def main() -> int:
    try:
        rules = load()
    except RuleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(rules)} rules (rules/*.yaml): a lane rule is checked before any connection (a refusal stops "
          "the converge; lanes show prints both kinds), a node rule by preflight on each node (a refusal fails "
          "it, a warning is printed)\n")
    sys.stdout.write(listing(rules))
    return 0


if __name__ == "__main__":
    sys.exit(main())
