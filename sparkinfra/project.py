"""
Where the project's own data is: ``templates/``, ``lanes/``, ``images/`` and ``mods/`` live at the
project's root, beside the package (the layout of a checkout and of ``pip install -e .``). Every
module finds them here, never by counting ``Path(__file__).parents``.

.. code:: python

    from sparkinfra import project

    project.ROOT / "templates"  # project.TEMPLATES, project.LANES

The root is, in order: ``$SPARKINFRA_ROOT``; the folder above the package; the current folder or
the nearest one above it. Each must hold a ``pyproject.toml`` whose project is ``sparkinfra``; a
non-editable install (its package alone in site-packages) runs from a checkout, or names one in
``$SPARKINFRA_ROOT``.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

ENV = "SPARKINFRA_ROOT"
NAME = "sparkinfra"
PACKAGE = Path(__file__).resolve().parent


class ProjectNotFound(RuntimeError):
    """No project root where ``find_root`` looks (its message says where it looked)."""


def is_root(folder: Path) -> bool:
    """Whether ``folder`` holds the pyproject.toml of sparkinfra."""
    try:
        with open(folder / "pyproject.toml", "rb") as handle:
            return tomllib.load(handle).get("project", {}).get("name") == NAME
    except (OSError, tomllib.TOMLDecodeError):
        return False


def find_root(environ: dict[str, str] | None = None, cwd: Path | None = None, package: Path = PACKAGE) -> Path:
    """
    The project's root (see the module's doc).

    + environ: the environment (default ``os.environ``); cwd: the current folder (default
      ``Path.cwd()``); package: the package's folder

    Raises ``ProjectNotFound`` naming each place tried.
    """
    environ = os.environ if environ is None else environ
    named = environ.get(ENV)
    if named:
        if is_root(Path(named)):
            return Path(named).resolve()
        raise ProjectNotFound(f"${ENV} is {named}: no sparkinfra pyproject.toml there")
    if is_root(package.parent):
        return package.parent
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if is_root(folder):
            return folder
    raise ProjectNotFound(
        f"no sparkinfra project beside the package ({package.parent}) nor in {here} or above it: run from "
        f"a checkout, or set ${ENV} to one (it holds templates/, lanes/, images/, mods/)"
    )


ROOT = find_root()
TEMPLATES = ROOT / "templates"
LANES = ROOT / "lanes"
