"""
How long a cluster is without an answering lane when a change fails: from the moment the runner
knows it failed (a start that did not get ready, a canary past its tolerance) to the known good
set answering again, against a plain warm start of the same lane, on the simulated pair, in one run.

    python benchmarks/rollback.py          # as root; the bed's pair as it is, else brought up and down
    python benchmarks/rollback.py --quick  # the failed start alone, against the last start the head recorded

Serves the sim lane (its compile caches then warm), times one warm restart of it (the head's unit
restarted until a completion returns tokens, ``lane_ctl wait-ready``), then converges two failing
changes through the bed's engine-hooks mod: an engine that refuses to start (``SPARKBED_ENGINE_FAIL``)
and a slowed decode (``SPARKBED_STEP_DELAY``, failing its canary). Each rollback's own figure is the
runner's ("which serves again (Ns)": journals kept, the lane stopped, the set restored on every node,
started, answering). Prints each, and each over the warm start: what a rollback costs beyond
starting the old lane again. The quick mode restarts nothing to compare with: its figure is over the
last start of the serving plan in the head's restart history (``ready`` after ``N`` s), which is
start to /health, not to a completion. Each change is converged with ``retry_rejected=true``: an earlier run
of this benchmark rejected the same plans.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sparkbed as bed  # noqa: E402
from benchmarks.harness import bed_of, options, pyinfra, recorded_start, serving  # noqa: E402
from sparkinfra.node import paths  # noqa: E402

INVENTORY = "inventory/sim.py"
LANE = "sim"
CHANGES = (
    ("a start that fails (the engine refuses)", 'lane_env={"SPARKBED_ENGINE_FAIL": "1"}'),
    ("a canary that fails (100 ms per engine step)", 'lane_env={"SPARKBED_STEP_DELAY": "0.1"}'),
)
SERVES_AGAIN = re.compile(r"rolled back to known good #\d+, lane \S+ plan \w+, which serves again \((\d+)s\)")


def warm_start() -> float:
    """Seconds from a restart of the head's unit to a completion (every rank, caches warm)."""
    plan = paths.plan_path(LANE)
    started = time.monotonic()
    bed.node_exec("spark-1", "sh", "-c", f"systemctl restart {paths.unit_name(LANE)} && "
                                         f"python3 /usr/local/lib/sparkinfra/node lane_ctl wait-ready {plan} 600")
    return time.monotonic() - started


def main() -> int:
    quick = options(__doc__).quick
    changes = CHANGES[:1] if quick else CHANGES
    with bed_of(2):
        serving(INVENTORY)
        recorded = recorded_start(LANE) if quick else None
        warm = recorded or warm_start()
        print(f"lane {LANE} on the simulated pair: a warm start {warm:.0f} s"
              + (" (the head's history: its last start)" if recorded else ""))
        for what, data in changes:
            said = pyinfra(INVENTORY, "deploys/serve.py", "--data", data, "--data", "retry_rejected=true", check=False)
            found = SERVES_AGAIN.search(said)
            if not found:
                raise SystemExit(f"{what}: no rollback said:\n{said[-3000:]}")
            seconds = int(found[1])
            print(f"{what}: failed -> the known good set answers in {seconds} s; rollback/warm start = "
                  f"{seconds / warm:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
