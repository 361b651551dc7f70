"""
What runs on a node (stdlib only: a DGX OS node has python3 and nothing else), as one package
placed by one operation (``operations.node.programs_present``) at ``paths.PROGRAMS``, each program
run as ``python3 PROGRAMS PROGRAM ARGS...`` (``__main__``), bind-mounted read-only at
``paths.CONTAINER_PROGRAMS`` into the containers that run one of them. The controller imports the
same modules: ``paths`` (every path the tool owns on a node), ``plan`` (the runner's typed plan)
and ``docker`` (the one ``docker run`` builder).
"""

from pathlib import Path

DIR = Path(__file__).resolve().parent


def files() -> list[Path]:
    """Every file of the package, as ``operations.node.programs_present`` places them."""
    return sorted(f for f in DIR.rglob("*") if f.is_file() and "__pycache__" not in f.parts)
