"""
Return a cluster to one of its known good sets, by hand, over the inventory's SSH.

    python -m sparkinfra rollback inventory/pair.py [--to N] [--cluster NAME] [--data key=value ...]

The head puts set N (default: the newest set of another plan than the one running, never a plan a
rollback turned away; ``status`` lists them, with when and why each was promoted) back on every
node, starts it and waits until it answers (``lane_ctl rollback``), keeping every rank's journal of
what it left. The plan it left is marked
rejected: the next converge with the same settings refuses, saying the site and the cluster differ
(``--data retry_rejected=true`` starts it once more). Exit 0 when the set serves.
"""

from __future__ import annotations

import argparse
import json
import sys

from .. import remote, serving
from ..run import InventorySettingsError

WHY = "was rolled back by hand"


def target(status: dict, number: int | None) -> tuple[dict | None, str]:
    """(the known good set to return to, or None, and why not) from the head's lane status: set
    ``number``, else the head's own choice (``rollback_to``: never the running plan, nor a rejected one)."""
    known = status.get("known") or []
    running = (status.get("lane"), status.get("started"))
    if number is None:
        found = next((m for m in known if m["number"] == status.get("rollback_to")), None)
        return found, "" if found else "no known good set of another plan than the running one (nor a rejected one)"
    found = next((m for m in known if m["number"] == number), None)
    if found is None:
        kept = ", ".join(f"#{m['number']}" for m in known) or "none"
        return None, f"no known good set #{number} on the head (kept: {kept})"
    if (found["lane"], found["digest"]) == running and status.get("unit") == "active":
        return None, f"known good #{number} (lane {found['lane']} plan {found['digest']}) is what runs now"
    return found, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkinfra rollback", description=__doc__.split("\n\n")[0])
    parser.add_argument("inventory")
    parser.add_argument("--to", type=int, metavar="N", help="the known good set's number (default: the one before)")
    parser.add_argument("--cluster", help="which cluster of the inventory (default: its only one)")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        inventory, settings = remote.settings_of(args.inventory, args.data)
        clusters = remote.clusters_of(settings, args.cluster)
    except InventorySettingsError as exc:
        print(f"rollback: {exc}", file=sys.stderr)
        return 2
    if len(clusters) > 1:
        print(f"rollback: the inventory has clusters {', '.join(c.name for c in clusters)}: name one with --cluster",
              file=sys.stderr)
        return 2
    cluster = clusters[0]
    lane = cluster.config.lane
    if not lane:
        print(f"rollback: cluster {cluster.name} serves no lane (settings: lane)", file=sys.stderr)
        return 2
    [reached] = remote.connect(inventory, [cluster])
    head = reached.hosts.get(cluster.head.name)
    if head is None:
        print(f"rollback: head {cluster.head.name}: {reached.unreachable.get(cluster.head.name)}", file=sys.stderr)
        return 1
    ok, out, err = remote.run(head, serving.runner(lane, "status"), timeout=120)
    try:
        status = json.loads(out or "{}")
    except ValueError:
        status = {}
    if not ok or not status:
        print(f"rollback: lane {lane} is not placed on {cluster.head.name} ({err.strip()[-200:] or 'no status'})",
              file=sys.stderr)
        return 1
    found, why_not = target(status, args.to)
    if found is None:
        print(f"rollback: {why_not}", file=sys.stderr)
        return 1
    print(f"[{cluster.name}] lane {lane} (plan {status.get('started')}) -> known good #{found['number']}: "
          f"lane {found['lane']} plan {found['digest']}, image {found['image']}, promoted: {found['why']}", flush=True)
    timeout = cluster.config.lane_ready_timeout
    command = serving.runner(lane, "rollback", str(timeout), WHY, str(found["number"]))
    ok, out, err = remote.run(head, command, timeout=timeout * 2 + 600)
    for line in (out + err).splitlines():  # the start's phases, then what serves and where the logs are
        print(f"[{cluster.head.name}] {line}", flush=True)
    return 0 if ok else 1
