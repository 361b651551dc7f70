"""
What every benchmark shares: its ``--quick`` switch (the smallest run that goes through every
step: CI runs it so no benchmark rots, its figures say nothing), the bed it needs (the running one
used as it is when it has that size and shape, else brought up, and then down at the end), and
pyinfra and the project's CLI run in the bed's management namespace.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sparkbed as bed  # noqa: E402
from sparkinfra.node import paths  # noqa: E402

BIN = Path(sys.executable).parent


def options(doc: str | None) -> argparse.Namespace:
    """The benchmark's command line: ``--quick``."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="the smallest run through every step (CI's check that it still runs; no figure to quote)")
    return parser.parse_args()


@contextmanager
def bed_of(count: int = 2, shape: str = bed.DEFAULT_SHAPE) -> Iterator[None]:
    """The bed with ``count`` nodes of ``shape`` for the block: the running one as it is, else one
    brought up for it and taken down after."""
    brought = bed.ensure(count, shape)
    try:
        yield
    finally:
        if brought:
            bed.down()


def controller(*args: str) -> subprocess.CompletedProcess:
    """A command in the bed's management namespace, from the project root; its output captured."""
    return subprocess.run(["ip", "netns", "exec", bed.MGMT_NS, *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=bed.controller_env())


def pyinfra(*args: str, check: bool = True) -> str:
    """``pyinfra -y ARGS`` in the management namespace: its output; a failure stops the benchmark
    with the output's end unless ``check`` is off."""
    done = controller(str(BIN / "pyinfra"), "-y", *args)
    if check and done.returncode != 0:
        raise SystemExit(f"pyinfra {' '.join(args)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout + done.stderr


def serving(inventory: str = "inventory/sim.py") -> None:
    """The inventory's lane serving (its settings' lane; a converge that finds it serving changes nothing)."""
    pyinfra(inventory, "deploys/serve.py")


def containers_run(node: str = "spark-2") -> bool:
    """Whether a container runs on ``node`` (on the bed: a lane's, which holds its image's layers)."""
    return bool(bed.node_exec(node, "docker", "ps", "-q", check=False).stdout.strip())


def recorded_start(lane: str) -> float | None:
    """Seconds the head recorded for ``lane``'s last start to get ready (its restart history's last
    ``ready``, start to /health): what a quick mode compares with instead of starting the lane again."""
    listed = bed.node_exec("spark-1", "cat", paths.history_path(lane), check=False).stdout.splitlines()
    ready = [json.loads(line) for line in listed if '"ready"' in line]
    return float(ready[-1]["seconds"]) if ready and ready[-1].get("seconds") else None
