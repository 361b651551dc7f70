"""
No-op converge time of the simulated pair and of eight simulated nodes, measured in one run.

    python benchmarks/converge.py            # as root; brings an 8-node bed up (and down at the end)

Converges ``deploys/prepare.py`` + ``deploys/stage.py`` (one pyinfra run) once on all 8 nodes, then
times no-op runs (median of 3) of the same deploys on the pair (``inventory/sim.py``: spark-1, spark-2) and on the 8
nodes (``inventory/sim8.py``). Targets: pair <= 3 s, 8 nodes <= 1.3x the pair. All nodes share this
machine's cores: compare the two figures with each other.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkinfra import bed  # noqa: E402

DEPLOYS = ("deploys/prepare.py", "deploys/stage.py")
PAIR_DATA = ("--data", "lane=")  # the pair's group data names a lane; this measures prepare + stage


def converge(inventory: str, *extra: str) -> float:
    started = time.monotonic()
    subprocess.run(  # one pyinfra run of both deploys: one connection and one fact pass per host
        ["ip", "netns", "exec", bed.MGMT_NS, str(Path(sys.executable).parent / "pyinfra"), "-y",
         inventory, *DEPLOYS, *extra],
        cwd=ROOT, check=True, capture_output=True, stdin=subprocess.DEVNULL, env=bed.controller_env(),
    )
    return time.monotonic() - started


def main() -> int:
    bed.up(8)
    try:
        converge("inventory/sim8.py")  # the first, changing run
        converge("inventory/sim.py", *PAIR_DATA)
        pair = statistics.median(converge("inventory/sim.py", *PAIR_DATA) for _ in range(3))
        oct_ = statistics.median(converge("inventory/sim8.py") for _ in range(3))
    finally:
        bed.down()
    print(f"no-op converge (prepare + stage), pair:    {pair:6.2f} s")
    print(f"no-op converge (prepare + stage), 8 nodes: {oct_:6.2f} s")
    print(f"8 nodes / pair = {oct_ / pair:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
