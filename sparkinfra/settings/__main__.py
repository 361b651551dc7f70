"""
The settings page, generated from the model.

    python -m sparkinfra.settings --docs > docs/settings.md
"""

from __future__ import annotations

import argparse
import sys

from .docs import settings_page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkinfra.settings", description=__doc__.strip().splitlines()[0])
    parser.add_argument("--docs", action="store_true", required=True, help="print docs/settings.md")
    parser.parse_args(argv)
    sys.stdout.write(settings_page())
    return 0


if __name__ == "__main__":
    sys.exit(main())
