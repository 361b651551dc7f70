"""
    python -m sparkinfra lock INVENTORY [--update NAME|all] [--data key=value ...]

Resolve on this machine (the controller) what each cluster's lock lacks, or what ``--update``
names, write the lock, and print each pin made and the lock's diff (``sparkinfra.lock``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..lanes.schema import LaneError, display
from ..lock import LockError, cluster_lane, describe, missing, resolve_here, site_lock, token_hints, write
from ..run import load_files
from ..settings import Cluster, SettingsError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparkinfra lock",
        description="Resolve what the network decides for each cluster of an inventory and write its lock "
        "(group_data/<cluster>.lock.yaml): what it lacks, or what --update names.",
    )
    parser.add_argument("inventory")
    parser.add_argument("--update", action="append", default=[], metavar="NAME",
                        help="re-resolve this entry even if it is locked (model, drafter, nccl, recipe/NAME...; "
                        "'all': every one); repeatable")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help="as pyinfra's --data")
    args = parser.parse_args(argv)
    try:
        _, settings = load_files(args.inventory, args.data, pin=False)
    except (SettingsError, LockError, LaneError) as exc:  # each names its file and key
        print(f"sparkinfra lock: {exc}", file=sys.stderr)
        return 2
    status = 0
    for cluster in settings.clusters.values():
        try:
            status = max(status, lock_cluster(cluster, args.inventory, set(args.update)))
        except (LockError, LaneError) as exc:
            print(f"sparkinfra lock: {exc}", file=sys.stderr)
            status = 2
    return status


def lock_cluster(cluster: Cluster, inventory_file: str, update: set[str]) -> int:
    """``main``'s work for one cluster: resolve here, write, print the pins made and the diff."""
    cwd = Path.cwd()
    path, refs, entries = site_lock(cluster, cluster_lane(cluster, cwd), inventory_file, cwd)
    unknown = sorted(update - {r.name for r in refs} - {"all"})
    if unknown:
        print(f"{cluster.name}: --update {', '.join(unknown)}: no such reference "
              f"(this cluster's: {', '.join(r.name for r in refs) or 'none'})", file=sys.stderr)
        return 2
    wanted = missing(refs, entries, update)
    if not wanted:
        print(f"{cluster.name}: {display(path)} pins every reference ({len(refs)}); nothing resolved")
        return 0
    config = cluster.config
    token = os.environ.get(config.hf_token_env, "")
    made, failed = resolve_here(wanted, token)
    failed = token_hints(failed, config.hf_token_env, token)
    for name, entry in made.items():
        before = entries.get(name)
        moved = "" if before is None else (" (unchanged)" if before.pin == entry.pin else f" (was {before.pin})")
        print(f"{cluster.name}: pinned {describe(name, entry)}{moved}")
    diff = write(path, cluster.name, {**entries, **made})
    print(diff or f"{cluster.name}: {display(path)} unchanged")
    for problem in failed:
        print(f"{cluster.name}: not resolved here: {problem}", file=sys.stderr)
    return 1 if failed else 0
