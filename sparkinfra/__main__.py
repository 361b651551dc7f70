"""``python -m sparkinfra VIEW ...``: the command-line views (``sparkinfra.cli``)."""

import sys

from .cli import main

sys.exit(main())
