"""
A lane's start with its compile caches empty (cold) against one with them kept (warm), on the
simulated pair, measured in one run.

    python benchmarks/warm_start.py          # as root; the bed's pair as it is, else brought up and down
    python benchmarks/warm_start.py --quick  # one cold start, against the last start the head recorded

Serves the sim lane once, then times starts of the whole lane (the head's unit started: the container
checks, every rank, until a completion returns tokens, ``lane_ctl wait-ready``): cold with
``/var/cache/sparkinfra/compile/sim`` removed on both nodes first, warm right after, alternated for
``ROUNDS`` rounds. Prints each start, the medians and warm/cold, then what each cache kind holds on
each node: a kind that stays empty is one this build does not fill (vLLM's CPU build with the sim
lane's ``enforce_eager`` and ``TORCH_COMPILE_DISABLE`` compiles nothing; Triton, FlashInfer and CUDA
have no CPU path), so on the bed the figure is what vLLM's own cache saves (its model inspections, measured at
warm/cold 0.75 on 2026-12-05), not a compile. On a Spark the same caches hold seed 004's 15-18
minutes of compilation.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sparkbed as bed  # noqa: E402
from benchmarks.harness import bed_of, options, recorded_start, serving  # noqa: E402
from sparkinfra.node import paths  # noqa: E402

INVENTORY = "inventory/sim.py"
LANE = "sim"
NODES = ("spark-1", "spark-2")
ROUNDS = 2


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _on(node: str, command: str) -> str:
    return bed.node_exec(node, "sh", "-c", command).stdout


def start(cold: bool) -> float:
    """Seconds from the head's unit started to a completion, the lane stopped first."""
    unit, plan = paths.unit_name(LANE), paths.plan_path(LANE)
    _on("spark-1", f"systemctl stop {unit}")
    if cold:
        for node in NODES:
            _on(node, f"rm -rf {paths.COMPILE_CACHE}/{LANE}")
    started = time.monotonic()
    _on("spark-1", f"systemctl start {unit} && python3 /usr/local/lib/sparkinfra/node lane_ctl wait-ready {plan} 600")
    return time.monotonic() - started


def cache_sizes(node: str) -> dict[str, int]:
    """Bytes each compile cache kind holds on ``node`` (every image of the lane)."""
    sizes = {}
    for kind in paths.COMPILE_CACHES:
        out = _on(node, f"find {paths.COMPILE_CACHE}/{LANE}/*/{kind} -type f -printf '%s\\n' 2>/dev/null "
                        "| awk '{s += $1} END {print s + 0}'")
        sizes[kind] = int(out.split()[-1])
    return sizes


def main() -> int:
    quick = options(__doc__).quick
    rounds = 1 if quick else ROUNDS
    with bed_of(2):
        serving(INVENTORY)
        # The quick mode (CI) starts the lane once, cold: its warm figure is the serving lane's last
        # start as the head's history recorded it (start to /health), read before that cold start.
        recorded = recorded_start(LANE) if quick else None
        cold, warm = [], []
        for _ in range(rounds):
            cold.append(start(cold=True))
            warm.append(recorded or start(cold=False))
        print(f"lane {LANE} on the simulated pair, {rounds} rounds, cold then warm:")
        for i, (c, w) in enumerate(zip(cold, warm), 1):
            print(f"  round {i}: cold {c:6.1f} s   warm {w:6.1f} s")
        c, w = statistics.median(cold), statistics.median(warm)
        print(f"median: cold {c:.1f} s, warm {w:.1f} s; warm/cold = {w / c:.2f}")
        for node in NODES:
            sizes = cache_sizes(node)
            held = ", ".join(f"{k} {_size(v)}" for k, v in sizes.items() if v) or "nothing"
            empty = ", ".join(k for k, v in sizes.items() if not v)
            print(f"{node}: the caches hold {held}" + (f"; this build fills no {empty} cache" if empty else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
