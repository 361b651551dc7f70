"""
Every benchmark's quick mode (``benchmarks/*.py --quick``) on the bed as the lane modules leave it
(the pair serving lane sim): each uses the running bed as it is, brings up nothing, and ends with
its figure's line. None of them can rot unnoticed; their figures here say nothing (a quick run,
two shared cores), docs/benchmarks.md quotes the full runs. Staging's goes last: it tears the lane
down (its container holds the image's layers on the worker), as the published module after this
one does anyway.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FIGURES = {
    "status": r"^status / no-op converge = \d+\.\d\d$",
    "warm_start": r"^median: cold [\d.]+ s, warm [\d.]+ s; warm/cold = \d+\.\d\d$",
    "rollback": r"^a start that fails \(the engine refuses\): failed -> the known good set answers in \d+ s; "
                r"rollback/warm start = \d+\.\d\d$",
    "converge": r"^no-op converge \(prepare \+ stage\), pair \(quick\): \d+\.\d\d s",
    "staging": r"^staging/ceiling = \d+\.\d\d \(each round: \d+\.\d\d\)$",
}


@pytest.mark.parametrize("name", list(FIGURES))
def test_a_benchmarks_quick_mode_runs_on_the_bed_as_it_is(bed, name):
    bed.ensure(2)  # the pair, serving lane sim (the lane modules before this one)
    done = subprocess.run([sys.executable, f"benchmarks/{name}.py", "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    print(done.stdout)
    assert done.returncode == 0, output[-3000:]
    assert re.search(FIGURES[name], done.stdout, re.M), output[-3000:]
    assert "already up: used as they are" in output, output[-3000:]  # nothing brought up, nothing taken down
