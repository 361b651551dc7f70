"""Golden files the unit tests compare with: ``SPARKINFRA_REGOLD=1`` rewrites them (then read the diff)."""

from __future__ import annotations

import os
from pathlib import Path


def golden(path: Path, text: str) -> None:
    """``text`` equals the golden file ``path`` (written first under ``SPARKINFRA_REGOLD=1``)."""
    if os.environ.get("SPARKINFRA_REGOLD"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"no golden file {path} (SPARKINFRA_REGOLD=1 writes it)"
    assert text == path.read_text(encoding="utf-8"), f"differs from {path}"
