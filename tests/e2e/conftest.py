"""
The end-to-end layer: real deploys against the simulated cluster (``sparkbed``).

The bed comes up once per session (2 nodes; a test may ask for more) and goes down at the end,
which also asserts it left nothing behind. Set ``SPARKINFRA_BED_KEEP=1`` to leave it up.
Every controller command (pyinfra, the verify suite) runs in the bed's management namespace.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import sparkbed as simbed

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@dataclass
class Converge:
    """A pyinfra run's outcome, from its ``--json`` results."""

    returncode: int
    results: dict | None
    stderr: str
    changed: dict[str, list[str]] = field(default_factory=dict)  # host -> names of ops that changed

    @property
    def changes(self) -> dict[str, int]:
        return {host: len(ops) for host, ops in self.changed.items()}

    def changed_hosts(self) -> set[str]:
        return {host for host, ops in self.changed.items() if ops}


@dataclass
class Verify:
    returncode: int
    output: str

    @property
    def failed(self) -> list[str]:
        return re.findall(r"^FAILED (\S+)", self.output, re.M)

    def failed_on(self, host: str) -> list[str]:
        return [t for t in self.failed if f"[{host}" in t or f"{host}]" in t or f"->{host}" in t]


class Bed:
    def __init__(self) -> None:
        self.size, self.shape = 0, simbed.DEFAULT_SHAPE

    def ensure(self, nodes: int) -> None:
        """A bed of this size (the seeds' shape), as earlier tests left it."""
        if self.size != nodes or self.shape != simbed.DEFAULT_SHAPE:
            self.fresh(nodes)

    def fresh(self, nodes: int, shape: str = simbed.DEFAULT_SHAPE) -> None:
        """A newly booted bed of this size and shape (``sparkbed.SHAPES``): bare nodes, nothing converged yet."""
        simbed.up(nodes, shape)
        self.size, self.shape = nodes, shape

    def controller(self, *args: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
        """Run a command in the management namespace, from the project root."""
        return subprocess.run(
            ["ip", "netns", "exec", simbed.MGMT_NS, *args],
            cwd=ROOT, text=True, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
            env=simbed.controller_env(), **kwargs,
        )

    def converge_in_background(self, inventory: str, deploy: str, *data: str) -> subprocess.Popen:
        """Start a converge and return at once (for faults that strike mid-run)."""
        args = [str(BIN / "pyinfra"), "-y", inventory, deploy]
        for item in data:
            args += ["--data", item]
        return subprocess.Popen(
            ["ip", "netns", "exec", simbed.MGMT_NS, *args], cwd=ROOT, env=simbed.controller_env(),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def commands(self, inventory: str, *args: str) -> dict[str, Counter]:
        """Each host's commands in one pyinfra run (``args``: deploys, then options), each with
        how often it ran, read from pyinfra's debug log."""
        run = self.controller(str(BIN / "pyinfra"), "-y", "--debug", inventory, *args)
        assert run.returncode == 0, run.stderr[-3000:]
        ran: dict[str, Counter] = {}
        for entry in re.split(r"\n(?=\s*\[[\w.]+\] )", run.stdout + "\n" + run.stderr):
            found = re.match(r"\s*\[pyinfra\.connectors\.ssh\] Running command on (\S+): (.*)", entry, re.S)
            if found:
                ran.setdefault(found.group(1), Counter())[found.group(2)] += 1
        return ran

    def converge(self, inventory: str, deploy: str, *data: str, check: bool = True, limit: str = "") -> Converge:
        """``deploy`` with ``--data`` items ``data`` (``limit``: hosts for pyinfra's ``--limit``, comma-separated)."""
        args = [str(BIN / "pyinfra"), "-y", "--json", inventory, deploy]
        for item in data:
            args += ["--data", item]
        for name in filter(None, limit.split(",")):  # pyinfra: one --limit per host
            args += ["--limit", name]
        proc = self.controller(*args)
        try:
            results = json.loads(proc.stdout)["results"]
        except (ValueError, KeyError, TypeError):
            results = None
        run = Converge(proc.returncode, results, proc.stderr)
        for op in (results or {}).get("operations", []):
            for host in op["success"]:
                run.changed.setdefault(host, []).append(op["name"])
            for host in op["no_change"]:
                run.changed.setdefault(host, [])
        if check:
            errors = [(op["name"], op["error"]) for op in (results or {}).get("operations", []) if op["error"]]
            assert proc.returncode == 0 and results is not None and not errors, (
                f"pyinfra {deploy} failed (rc {proc.returncode}): {errors}\n{proc.stderr[-4000:]}"
            )
        return run

    def verify(self, inventory: str, *args: str) -> Verify:
        proc = self.controller(
            str(BIN / "pytest"), "tests/verify", "--inventory", inventory, "-q", "-rf",
            "-p", "no:cacheprovider", *args,
        )
        return Verify(proc.returncode, proc.stdout + proc.stderr)

    def node(self, name: str, command: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        """Run a shell command inside a node, as root (the fault injector's hand); ``input``: its stdin."""
        return simbed.node_exec(name, "sh", "-c", command, check=check, input=input)

    def fabric_rx(self, name: str) -> int:
        """Bytes a node has received on its fabric port (what a transfer to it moved)."""
        return int(self.node(name, "cat /sys/class/net/enp1s0f0np0/statistics/rx_bytes").stdout)

    def reboot(self, name: str) -> None:
        simbed.reboot(name)


def _leftovers() -> list[str]:
    """What a torn-down bed must not leave: processes, namespaces, mounts, cgroups, routes."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith(simbed.PREFIX)]
    found += [f"mount {m}" for m in simbed._bed_mounts()]
    found += [f"pid {p}" for p in simbed._our_pids()]
    found += [f"cgroup {root / simbed.PREFIX}" for root in simbed.CGROUP_ROOTS if (root / simbed.PREFIX).exists()]
    routes = subprocess.run(["ip", "route", "show", "type", "unreachable"], capture_output=True, text=True).stdout
    found += [f"route {r}" for r in routes.splitlines() if str(simbed.SUBNET) in r]
    return found


@pytest.fixture(scope="session")
def bed():
    if os.geteuid() != 0:
        pytest.fail("the e2e layer needs root: it builds the simulated cluster (namespaces, nspawn)")
    the_bed = Bed()
    the_bed.ensure(2)
    yield the_bed
    if os.environ.get("SPARKINFRA_BED_KEEP") == "1":
        return
    simbed.down()
    leftovers = _leftovers()
    assert not leftovers, f"the bed left these behind: {leftovers}"


@pytest.fixture
def pair(bed):
    """The simulated pair (inventory/sim.py)."""
    bed.ensure(2)
    return bed
