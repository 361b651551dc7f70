"""
``python -m sparkinfra status`` against a no-op converge of the serving pair, measured in one run.

    python benchmarks/status.py            # as root; the bed's pair as it is, else brought up and down
    python benchmarks/status.py --quick    # one round

Serves lane ``sim`` on the pair (``deploys/serve.py``), then times, alternated over three rounds,
``status`` (every node's report, the API's health and one one-token completion) and a no-op
``deploys/serve.py`` (what an operator would otherwise run to learn whether anything differs).
Prints each round and the median ratio: the target is well under 1.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import BIN, bed_of, controller, options  # noqa: E402

ROUNDS = 3


def timed(*args: str) -> float:
    """Seconds one controller command took (in the bed's management namespace); it must succeed."""
    started = time.monotonic()
    done = controller(*args)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return time.monotonic() - started


def main() -> int:
    quick = options(__doc__).quick
    status = (sys.executable, "-m", "sparkinfra", "status", "inventory/sim.py")
    no_op = (str(BIN / "pyinfra"), "-y", "inventory/sim.py", "deploys/serve.py")
    with bed_of(2):
        timed(*no_op)  # serving (a no-op where it serves)
        if not quick:
            timed(*no_op)  # warm: the next ones are no-ops
        rounds = [(timed(*status), timed(*no_op)) for _ in range(1 if quick else ROUNDS)]
    for i, (s, c) in enumerate(rounds, 1):
        print(f"round {i}: status {s:5.2f} s, no-op serve converge {c:5.2f} s, ratio {s / c:.2f}")
    ratio = statistics.median(s / c for s, c in rounds)
    print(f"status / no-op converge = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
