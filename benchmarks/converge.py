"""
No-op converge time of the simulated pair and of eight simulated nodes, measured in one run.

    python benchmarks/converge.py            # as root; the 8-node bed (site2's shape) as it is, else brought up and down
    python benchmarks/converge.py --quick    # the bed's pair (inventory/sim.py) alone, one round of 2 runs

Converges ``deploys/prepare.py`` + ``deploys/stage.py`` (one pyinfra run) once on all 8 nodes, then
times no-op runs of the same deploys on the first two of them (``inventory/sim8_pair.py``: the same
shape and settings) and on the 8 nodes (``inventory/sim8.py``): two rounds of 5 runs each,
alternated, the median of each size.
Targets: pair <= 3 s, 8 nodes <= 1.3x the pair. All nodes and the controller share this machine's
cores, so each figure comes with how busy they were and the CPU seconds pyinfra itself and the
rest (the nodes' sshd, sudo and facts) used: a run that keeps them all busy measures the machine,
not the tool's parallelism. Then the commands each node ran in one more no-op run (from
pyinfra's debug log): the same per node on 2 and on 8 nodes.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sparkbed as bed  # noqa: E402
from benchmarks.harness import bed_of, options  # noqa: E402

DEPLOYS = ("deploys/prepare.py", "deploys/stage.py")
PAIR_DATA = ("--data", "lane=")  # the bed pair's group data names a lane; this measures prepare + stage
ROUNDS = 2


class Run(NamedTuple):
    """One no-op pyinfra run."""

    wall: float  # seconds
    busy: float  # share of this machine's CPUs busy meanwhile
    controller: float  # CPU seconds of pyinfra itself
    nodes: float  # CPU seconds of everything else meanwhile: the nodes' sshd, sudo and facts


def converge(inventory: str, *extra: str) -> Run:
    """One pyinfra run of both deploys, with what it cost this machine's CPUs."""
    busy0, total0 = _cpu_ticks()
    own0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    _pyinfra(inventory, *extra)
    wall = time.monotonic() - started
    own1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy1, total1 = _cpu_ticks()
    controller = own1.ru_utime - own0.ru_utime + own1.ru_stime - own0.ru_stime
    busy_seconds = (busy1 - busy0) / os.sysconf("SC_CLK_TCK")
    return Run(wall, (busy1 - busy0) / max(total1 - total0, 1), controller, max(busy_seconds - controller, 0.0))


def _pyinfra(inventory: str, *extra: str) -> str:
    """One pyinfra run of both deploys (one connection and one fact pass per host): its output."""
    return subprocess.run(
        ["ip", "netns", "exec", bed.MGMT_NS, str(Path(sys.executable).parent / "pyinfra"), "-y",
         inventory, *DEPLOYS, *extra],
        cwd=ROOT, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL, env=bed.controller_env(),
    ).stdout


def commands_per_host(inventory: str, *extra: str) -> dict[str, int]:
    """Commands each host ran in one (untimed) no-op run, counted from pyinfra's debug log: what
    a node costs, whatever the cluster's size."""
    log = _pyinfra(inventory, *extra, "--debug")
    return dict(sorted(Counter(re.findall(r"Running command on (\S+):", log)).items()))


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all this machine's CPUs, from /proc/stat."""
    user, nice, system, idle, iowait, irq, softirq = (int(v) for v in Path("/proc/stat").read_text().split()[1:8])
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait


def timed(inventory: str, *extra: str, runs: int = 5) -> list[Run]:
    """``runs`` no-op runs, after one untimed run (the pair and the 8 nodes give the head a
    different known_hosts and SSH config: switching rewrites them)."""
    converge(inventory, *extra)
    return [converge(inventory, *extra) for _ in range(runs)]


def median(runs: list[Run]) -> Run:
    """The run of median wall time."""
    return sorted(runs)[len(runs) // 2]


def main() -> int:
    if options(__doc__).quick:
        with bed_of(2):
            converge("inventory/sim.py", *PAIR_DATA)  # the first run may change things
            pair = timed("inventory/sim.py", *PAIR_DATA, runs=2)
            commands = commands_per_host("inventory/sim.py", *PAIR_DATA)
        run = median(pair)
        print(f"no-op converge (prepare + stage), pair (quick): {run.wall:.2f} s ({run.busy:.0%} busy)")
        print(f"commands per node, pair: {' '.join(f'{h} {n}' for h, n in commands.items())}")
        return 0
    with bed_of(8, "site2"):
        converge("inventory/sim8.py")  # the first, changing run
        pairs, octs = [], []
        for _ in range(ROUNDS):  # alternated: this machine's speed drifts over a minute
            pairs.append(timed("inventory/sim8_pair.py"))
            pair_commands = commands_per_host("inventory/sim8_pair.py")  # still warm: a no-op
            octs.append(timed("inventory/sim8.py"))
            oct_commands = commands_per_host("inventory/sim8.py")
    pair, oct_ = median([r for block in pairs for r in block]), median([r for block in octs for r in block])
    cpus = os.cpu_count()
    for label, run in (("pair:   ", pair), ("8 nodes:", oct_)):
        print(f"no-op converge (prepare + stage), {label} {run.wall:6.2f} s  ({run.busy:4.0%} of {cpus} CPUs busy;"
              f" pyinfra {run.controller:.2f} CPU-s, nodes {run.nodes:.2f} CPU-s)")
    print(f"commands per node, pair:    {' '.join(f'{h} {n}' for h, n in pair_commands.items())}")
    print(f"commands per node, 8 nodes: {' '.join(f'{h} {n}' for h, n in oct_commands.items())}")
    rounds = " ".join(f"{median(o).wall / median(p).wall:.2f}" for p, o in zip(pairs, octs))
    print(f"8 nodes / pair = {oct_.wall / pair.wall:.2f}  (each round: {rounds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
