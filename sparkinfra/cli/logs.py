"""
Every rank's lane journal, merged in time order. Read-only, over the inventory's SSH.

    python -m sparkinfra logs inventory/pair.py [--rank N ...] [--since WHEN] [--lines N]
                                                [--grep REGEX] [--follow] [--lane LANE]

Each line: the time, the node and its rank, the journal's message (the lane's runner and its
container: vLLM's own lines). ``--since`` takes what journalctl's does (``'10 min ago'``, ``today``,
``'2026-12-06 10:00'``); ``--lines`` the last N entries of each rank (default 100, without
``--since``); ``--grep`` a Python regular expression, matched on the node; ``--follow`` keeps
printing new lines, all ranks merged, until interrupted. A node that cannot be reached is named
on stderr and the others are shown (exit 1 at the end).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from datetime import datetime

from pyinfra.api import QuoteString, StringCommand

from .. import remote, scripts
from ..node import paths
from ..run import InventorySettingsError
from ..settings import lane_problem

FOLLOW_EVERY = 1.0  # seconds between two reads of every rank's journal with --follow
FOLLOW_LAG = 2.0  # seconds --follow holds an entry, so entries of all ranks print in time order


def read_journal(host, query: dict) -> tuple[list[tuple[int, str]], str, str]:
    """(entries ``(microseconds, message)``, the cursor after them, an error) of one node."""
    command = StringCommand("python3", "-c", QuoteString(scripts.text("lane_journal.py")),
                            QuoteString(json.dumps(query)))
    ok, stdout, stderr = remote.run(host, command, timeout=120)
    entries, cursor = [], query.get("after", "")
    for line in stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if "cursor" in item:
            cursor = item["cursor"] or cursor
        else:
            entries.append((item["t"], item["m"]))
    return entries, cursor, "" if ok else (stderr or stdout).strip()[-300:]


def line(at: int, node: str, rank: int, message: str, width: int) -> str:
    """One journal entry for a person: a message of several lines (a traceback; a progress bar's
    carriage returns) gets the prefix on each of them, so every printed line says where it is from."""
    stamp = datetime.fromtimestamp(at / 1e6).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    parts = [part for part in re.split(r"\r\n|\r|\n", message) if part.strip()] or [""]
    return "\n".join(f"{stamp} {node.ljust(width)} rank {rank} | {part}" for part in parts)


def merged(batches: list[tuple[str, int, list[tuple[int, str]]]]) -> list[tuple[int, str, int, str]]:
    """Every node's entries as one list in time order (stable: a node's own order is kept)."""
    rows = [(at, node, rank, text) for node, rank, entries in batches for at, text in entries]
    return sorted(rows, key=lambda row: row[0])


def next_query(query: dict, cursor: str, first: bool, began: int) -> dict:
    """The query of a node's read: the first as asked, then after its cursor; a node whose journal
    held no entry of the lane (no cursor) is read again from when the command began."""
    if first:
        return query
    if cursor:
        return {**query, "after": cursor}
    return {**query, "since": f"@{began}", "lines": None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkinfra logs", description=__doc__.split("\n\n")[0])
    parser.add_argument("inventory")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cluster", help="one cluster of the inventory (default: the first)")
    parser.add_argument("--lane", help="another lane's journal (default: the lane the settings name)")
    parser.add_argument("--rank", type=int, action="append", help="only this rank (repeat for several)")
    parser.add_argument("--since", help="journalctl's --since: '10 min ago', today, '2026-12-06 10:00'")
    parser.add_argument("--lines", type=int, default=None, help="the last N entries of each rank (default 100)")
    parser.add_argument("--grep", help="only messages matching this Python regular expression")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until interrupted")
    args = parser.parse_args(argv)
    if args.grep:
        try:
            re.compile(args.grep)
        except re.error as exc:
            parser.error(f"--grep: {exc}")
    try:
        inventory, settings = remote.settings_of(args.inventory, args.data)
        cluster = remote.clusters_of(settings, args.cluster)[0]
    except InventorySettingsError as exc:
        print(f"sparkinfra logs: {exc}", file=sys.stderr)
        return 2
    lane = args.lane or cluster.config.lane
    if not lane:
        print(f"sparkinfra logs: cluster {cluster.name} names no lane (settings: lane); give --lane", file=sys.stderr)
        return 2
    if problem := lane_problem(lane):
        print(f"sparkinfra logs: --lane: {problem}", file=sys.stderr)
        return 2
    nodes = [n for n in cluster.nodes if not args.rank or n.rank in args.rank]
    if not nodes:
        print(f"sparkinfra logs: cluster {cluster.name} has no rank {args.rank}", file=sys.stderr)
        return 2
    (reached,) = remote.connect(inventory, [cluster])
    failed = False
    for node in nodes:
        if node.name in reached.unreachable:
            print(f"{node.name} (rank {node.rank}) not reached: {reached.unreachable[node.name]}", file=sys.stderr)
            failed = True
    nodes = [n for n in nodes if n.name in reached.hosts]
    width = max((len(n.name) for n in nodes), default=0)
    query = {"unit": paths.unit_name(lane), "grep": args.grep or "", "since": args.since or "",
             "lines": args.lines if args.lines is not None else (None if args.since else 100)}
    cursors = {n.name: "" for n in nodes}
    began, first = int(time.time()), True
    held = Held()
    if args.follow:  # a stop asked for (^C, kill) still prints what is held
        signal.signal(signal.SIGTERM, interrupted)
    try:
        while True:
            calls = [(read_journal, (reached.hosts[n.name], next_query(query, cursors[n.name], first, began)))
                     for n in nodes]
            first = False
            batches = []
            for node, (entries, cursor, error) in zip(nodes, remote.at_once(calls)):
                if error:
                    print(f"{node.name} (rank {node.rank}): {error}", file=sys.stderr)
                    failed = True
                cursors[node.name] = cursor
                batches.append((node.name, node.rank, entries))
            rows = merged(batches)
            if not args.follow:
                show(rows, width)
                break
            show(held.ready(rows, time.monotonic()), width)
            time.sleep(FOLLOW_EVERY)
    except KeyboardInterrupt:
        show(held.ready([], float("inf")), width)
    return 1 if failed else 0


def interrupted(signum, frame):
    raise KeyboardInterrupt


def show(rows: list[tuple[int, str, int, str]], width: int) -> None:
    for at, name, rank, text in rows:
        print(line(at, name, rank, text, width), flush=True)


class Held:
    """``--follow``'s entries, each held ``FOLLOW_LAG`` seconds after it arrived: a rank's line that
    reached its journal a moment after another rank's later one still prints in time order."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, int, str]] = []
        self.arrived: list[float] = []

    def ready(self, rows: list[tuple[int, str, int, str]], now: float) -> list[tuple[int, str, int, str]]:
        """Add ``rows`` (arrived ``now``); the held rows to print now, in time order: every row up to
        the latest one held for ``FOLLOW_LAG`` (``now`` infinite: every row)."""
        self.rows += rows
        self.arrived += [now] * len(rows)
        due = [row[0] for row, at in zip(self.rows, self.arrived) if at <= now - FOLLOW_LAG or now == float("inf")]
        if not due:
            return []
        cut = max(due)
        out = sorted((row for row in self.rows if row[0] <= cut), key=lambda row: row[0])
        kept = [(row, at) for row, at in zip(self.rows, self.arrived) if row[0] > cut]
        self.rows, self.arrived = [row for row, _ in kept], [at for _, at in kept]
        return out
