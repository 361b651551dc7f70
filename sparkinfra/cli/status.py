"""
Is the cluster serving what its settings name? Read-only, over the inventory's SSH.

    python -m sparkinfra status inventory/pair.py [--data key=value ...] [--cluster NAME] [--json]

Per cluster: the lane its settings name and the plan digest they render; per node: its rank, the
lane unit's state, the container's start, the image ID (against the head's), the snapshots
(against the head's manifests), the fabric port (link, MTU, address), the RoCE GID index of its
NCCL env and the NCCL version its lane's log reported; the API's ``/health`` and the latency of a
one-token completion; the lane's last starts and stops with their reasons (the head's runner
records them). Exit 0 when every cluster serves what its settings name, 1 with the reasons
otherwise, 2 when the command or its settings are wrong.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from ipaddress import IPv4Interface
from pathlib import Path

from pyinfra.api import QuoteString, StringCommand

from .. import lanes, nccl_log, preflight, remote, roce, rules, scripts, serving, transfer
from ..api_key import where as key_where
from ..cluster_lane import cluster_lane
from ..node import paths
from ..run import InventorySettingsError
from ..settings import Cluster, Fabric
from . import chat

HISTORY_SHOWN = 5  # the lane's last events a status shows


@dataclass
class Expected:
    """What a cluster's settings name: its lane (None: none), the plan digest, the lane's image and API port."""

    lane: lanes.Lane | None
    digest: str = ""
    image: str = ""
    api_port: int = 0
    served_name: str = ""


def expected(cluster: Cluster) -> Expected:
    on = cluster_lane(cluster)
    if on is None:
        return Expected(None)
    return Expected(on.lane, on.digest, on.image, on.api_port, on.served_name)


def node_query(cluster: Cluster, lane_name: str, image: str, head: bool = False) -> str:
    """The argument of ``scripts/node_report.py`` for a node of ``cluster`` (``head``: its head)."""
    config = cluster.config
    repos = [transfer.repo_dir(config.model_dir, repo) for repo, _ in transfer.models(cluster)]
    files = {"unit": "", "plan": "", "started": "", "history": "", "rejected": ""}
    if lane_name:
        files = {"unit": paths.unit_name(lane_name), "plan": paths.plan_path(lane_name),
                 "started": f"{paths.MARKS_DIR}/{lane_name}.started",
                 "history": paths.history_path(lane_name), "rejected": paths.rejected_path(lane_name)}
    return json.dumps({
        "lane": files, "known_good": paths.KNOWN_GOOD, "container": config.container_name, "image": image,
        "interface": cluster.fabric.interface, "nccl_env": paths.NCCL_ENV_FILE, "repos": repos,
        "pin": config.nccl_library, "pin_record": paths.NCCL_PIN_RECORD, "identity_script": paths.NCCL_IDENTITY,
        # preflight's probe (the node rules' facts, what changed beneath the lanes): its text, its arguments
        "probe": base64.b64encode(scripts.text("preflight_probe.sh").encode()).decode(),
        "probe_args": [config.model_dir, cluster.fabric.interface, paths.PROGRAMS, paths.KNOWN_GOOD,
                       paths.history_path(lane_name) if lane_name and head else "-"],
        "snapshot_tool": base64.b64encode(transfer.tool_source().encode()).decode() if repos else "",
    })


def node_report(host, query: str) -> dict:
    """One node's ``scripts/node_report.py`` answer (``{"error": ...}`` when it did not answer)."""
    command = StringCommand("python3", "-c", QuoteString(scripts.text("node_report.py")), QuoteString(query))
    ok, stdout, stderr = remote.run(host, command, timeout=60)
    if not ok:
        return {"error": (stderr or stdout).strip()[-300:] or "node_report.py failed"}
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"node_report.py said: {stdout.strip()[-300:]}"}


def api_state(cluster: Cluster, want: Expected) -> dict:
    """From the controller, as a client: the head's ``/health`` and one one-token completion."""
    base = f"http://{cluster.head.ssh_host}:{want.api_port}"
    found = {"url": base, "health": None, "completion": None, "seconds": None, "key": key_where(cluster, Path.cwd()),
             "wedge_bound": serving.wedge_bound(cluster.config)}  # what the head's watch allows a wedged lane
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=10) as response:
            found["health"] = response.status
    except urllib.error.HTTPError as exc:
        found["health"] = exc.code
    except (urllib.error.URLError, OSError) as exc:
        found["health"] = f"no answer ({getattr(exc, 'reason', exc)})"
        return found
    config = cluster.config
    key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
    began = time.monotonic()
    wait = config.lane_liveness_timeout  # as long as the head's own watch waits, never longer
    try:
        reply = chat.chat(f"{base}/v1/chat/completions", want.served_name, "ping", 1, key, timeout=wait)
        found["seconds"] = round(time.monotonic() - began, 3)
        found["completion"] = "ok" if reply.get("usage", {}).get("completion_tokens") else "no tokens"
    except urllib.error.HTTPError as exc:
        found["completion"] = f"HTTP {exc.code}"
    except TimeoutError:
        found["seconds"] = round(time.monotonic() - began, 3)
        found["completion"] = (f"wedged: no token in {wait}s while /health answers (the head's watch restarts "
                               f"the lane within {serving.wedge_bound(config)}s of it)")
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        found["completion"] = f"failed ({exc})"
    return found


def node_view(node, report: dict, head: dict, want: Expected, fabric: Fabric | None = None) -> dict:
    """What ``status`` shows of one node."""
    if "unreachable" in report or "error" in report:
        return {"name": node.name, "rank": node.rank, "reached": False,
                "why": report.get("unreachable") or report.get("error")}
    unit, box, fab = report["unit"], report["container"], report["fabric"]
    version = nccl_log.parse("\n".join(report["nccl_lines"])).version
    drift = preflight.PreflightProbe().process(report.get("probe") or []).get("platform") or {}
    heads_manifests = head.get("manifests") or {}
    return {
        "name": node.name, "rank": node.rank, "reached": True,
        "unit": f"{unit['active']}/{unit['sub']}" if unit.get("loaded") else "absent",
        "unit_since": unit.get("since"),
        "plan": (report["plan"] or {}).get("digest"),
        "started": (report["started"] or {}).get("digest"),
        "container": {"running": box["running"], "since": box["started_at"]} if box else None,
        "docker": report.get("docker", True),  # whether the Docker daemon answers
        "image_id": report["image_id"],
        "image_matches_head": bool(report["image_id"]) and report["image_id"] == head.get("image_id"),
        "snapshots_match_head": {
            repo.rsplit("/", 1)[-1]: digest is not None and digest == heads_manifests.get(repo)
            for repo, digest in report["manifests"].items()
        },
        "fabric": fab,
        "gid_index": report["gid_index"],
        **(twins(node, report, fabric) if fabric else {"twins": [], "twin_problems": []}),
        "nccl_version": version,
        "pin": report.get("pin") or {},
        "live_nccl": report.get("live_nccl"),
        "other_lanes": report["other_units"],
        # what changed beneath the lanes since the newest known good set (a kernel, a driver...)
        "drift": drift.get("changes") or [],
        "drift_since": (drift.get("known") or {}).get("number"),
    }


def twins(node, report: dict, cluster_fabric: Fabric) -> dict:
    """The fabric port's twins on a node as status shows them: each HCA with its netdev, MTU, state
    and the GID row NCCL uses there, and what is wrong with them (the rule prepare and verify apply)."""
    links = report.get("rdma") or []
    found = {"twins": [], "twin_problems": []}
    port = roce.port_of(cluster_fabric, links)
    tables = {link["device"]: link["gids"] for link in links}
    index = report.get("gid_index") or ""
    by_device = {link["device"]: link for link in links}
    for device, netdev in port.hcas:
        rows = tables.get(device) or []
        row = str(roce.used_row(rows, netdev, index))
        link = (by_device.get(device) or {}).get("link") or {}
        found["twins"].append({"device": device, "netdev": netdev, "row": row, "mtu": link.get("mtu"),
                               "operstate": link.get("operstate"), "addresses": link.get("addresses", [])})
    problems = list(port.problems)
    if report.get("nccl_hcas") is not None and report["nccl_hcas"] != ",".join(port.devices):
        problems.append(f"NCCL_IB_HCA is {report['nccl_hcas']}, the port's HCAs are {','.join(port.devices)}")
    problems += roce.index_problems(port, tables, str(node.fabric_ip), index)
    for twin in (t for t in found["twins"] if t["netdev"] != port.interface):  # the fabric's own: problems()
        if twin["operstate"] != "up" or twin["mtu"] != cluster_fabric.mtu:
            problems.append(f"{twin['netdev']} ({twin['device']}) is {twin['operstate']}, MTU {twin['mtu']} "
                            f"(the settings: up, MTU {cluster_fabric.mtu})")
        inside = [a for a in twin["addresses"] if IPv4Interface(a).ip in cluster_fabric.subnet]
        if inside:
            problems.append(f"twin {twin['netdev']} holds {', '.join(inside)} of the fabric subnet {cluster_fabric.subnet}")
    found["twin_problems"] = problems
    return found


def problems(cluster: Cluster, want: Expected, nodes: list[dict], api: dict | None) -> list[str]:
    """Why ``cluster`` does not serve what its settings name (empty: it does)."""
    found = []
    for node in nodes:
        where = f"{node['name']} (rank {node['rank']})"
        if not node["reached"]:
            found.append(f"{where} not reached: {node['why']}")
            continue
        found += [f"{where}: another lane's unit runs ({other})" for other in node["other_lanes"]]
        if not node.get("docker", True):  # nothing about images or containers can be told then
            found.append(f"{where}: the Docker daemon does not answer (systemctl status docker): no lane "
                         "container can run, no image can be read")
            continue
        if want.lane is None:
            continue
        unit = paths.unit_name(want.lane.name)
        if node["unit"] == "absent":
            found.append(f"{where}: {unit} is not installed (a converge places it)")
            continue
        if not node["unit"].startswith("active/"):
            found.append(f"{where}: {unit} is {node['unit']}")
        if node["plan"] != want.digest:
            found.append(f"{where}: its plan is {node['plan'] or 'missing'}, the settings render {want.digest} "
                         "(a converge places it)")
        elif node["unit"].startswith("active/") and node["started"] != want.digest:
            found.append(f"{where}: the lane runs plan {node['started'] or '(unknown)'}, not {want.digest} "
                         "(a converge restarts it)")
        if not (node["container"] or {}).get("running") and node["unit"].startswith("active/"):
            found.append(f"{where}: its container {cluster.config.container_name} is not running")
        if node["rank"] and not node["image_matches_head"]:
            found.append(f"{where}: image {want.image} is {node['image_id'] or 'missing'}, not the head's")
        for repo, same in node["snapshots_match_head"].items():
            if node["rank"] and not same:
                found.append(f"{where}: snapshot {repo} does not match the head's manifest")
        pin = cluster.config.nccl_version
        if node["nccl_version"] and node["nccl_version"] != pin:
            found.append(f"{where}: NCCL {node['nccl_version']} started, the pin is {pin}")
        found += [f"{where}: {problem}" for problem in node["twin_problems"]]
        head_pin = next((n.get("pin", {}).get("sha256") for n in nodes if n["rank"] == 0 and n["reached"]), None)
        mine = node["pin"].get("sha256")
        if not mine:
            found.append(f"{where}: no pinned NCCL at {cluster.config.nccl_library} (a converge places it)")
        elif head_pin and mine != head_pin:
            found.append(f"{where}: {cluster.config.nccl_library} is another build than the head's "
                         f"(sha256 {mine[:12]}, the head's {head_pin[:12]})")
        live = node.get("live_nccl")
        if live and "error" in live:
            found.append(f"{where}: which libnccl its vLLM mapped could not be read ({live['error']})")
        elif live:
            record = node["pin"].get("record") or {}
            found += [f"{where}: {problem}" for problem in nccl_log.live_problems(live, {
                "path": cluster.config.nccl_library, "sha256": mine, "build_id": record.get("build_id")})]
        fab = node["fabric"]
        if not fab.get("present"):
            found.append(f"{where}: no fabric port {cluster.fabric.interface}")
        elif fab.get("operstate") != "up" or fab.get("mtu") != cluster.fabric.mtu:
            found.append(f"{where}: fabric {cluster.fabric.interface} is {fab.get('operstate')}, MTU {fab.get('mtu')} "
                         f"(the settings: up, MTU {cluster.fabric.mtu})")
    if want.lane is not None and api is not None:
        if api["health"] != 200:
            found.append(f"API {api['url']}: /health {api['health']}")
        elif api["completion"] != "ok":
            found.append(f"API {api['url']}: a one-token completion {api['completion']}")
    return found


def cluster_status(reached: remote.Reached) -> dict:
    """One cluster's status (what ``--json`` prints for it)."""
    cluster = reached.cluster
    want = expected(cluster)
    queries = {head: node_query(cluster, want.lane.name if want.lane else "", want.image or cluster.config.image, head)
               for head in (False, True)}
    hosts = list(reached.hosts.items())
    answers = dict(zip([name for name, _ in hosts], remote.at_once([
        (node_report, (h, queries[name == cluster.head.name])) for name, h in hosts])))
    answers.update({name: {"unreachable": why} for name, why in reached.unreachable.items()})
    head = answers.get(cluster.head.name, {})
    nodes = [node_view(node, answers[node.name], head, want, cluster.fabric) for node in cluster.nodes]
    api = api_state(cluster, want) if want.lane else None
    found = problems(cluster, want, nodes, api)
    tripped = preflight.reported_rules(cluster, answers, want.lane)
    found += [f"{name}: {said} (the next converge's preflight refuses it)" for name, said, refuse in tripped if refuse]
    locked = {cluster.pin("model"), cluster.pin("drafter")} - {None}
    return {
        "cluster": cluster.name, "lane": want.lane.name if want.lane else None, "digest": want.digest or None,
        "serving": not found and want.lane is not None, "ok": not found, "problems": found,
        "api": api, "nodes": nodes, "history": (head.get("history") or [])[-HISTORY_SHOWN:],
        "known_good": head.get("known_good") or [],  # the head's sets, oldest first (each node keeps the same)
        "rejected": head.get("rejected"),  # the lane's plan a rollback turned away (a converge refuses it)
        # what is staged and served: each model at the commit the site's data or its lock pins
        "models": [{"repo": repo, "revision": revision, "locked": revision in locked}
                   for repo, revision in transfer.models(cluster)],
        "lock": cluster.lock_file or None,
        "warnings": (rules.warnings(want.lane, cluster) if want.lane else [])  # the lane's rules, each node's
        + [f"{name}: {said}" for name, said, refuse in tripped if not refuse],
    }


def gid_cell(node: dict) -> str:
    """Each twin's HCA with the GID row NCCL uses there (``rocep1s0f0:3 roceP2p1s0f0:3``)."""
    if not node.get("twins"):
        return node["gid_index"] or "-"
    return " ".join(f"{twin['device']}:{twin['row']}" for twin in node["twins"])


def nccl_cell(node: dict) -> str:
    """The NCCL version the lane's log says it started (a GPU lane's) and the pin's sha256 on the node."""
    pin = (node.get("pin") or {}).get("sha256")
    return " ".join(part for part in (node["nccl_version"], f"pin {pin[:12]}" if pin else "") if part) or "-"


def when(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) if epoch else "-"


def kept_disk(status: dict) -> str:
    """What the known good sets cost on disk beyond what serves: the images only they name."""
    serving = {n.get("image_id") for n in status["nodes"] if n.get("rank") == 0}
    extra = {k["image_id"]: k["image_bytes"] for k in status["known_good"]
             if k.get("image_id") and k["image_id"] not in serving and k.get("image_bytes")}
    if not extra:
        return "the sets name no image besides the one serving"
    return (f"the sets keep {len(extra)} image(s) besides the one serving: {sum(extra.values()) / 2**30:.1f} GiB "
            f"on every node (known_good_keep bounds how many sets stay)")


def text(status: dict) -> str:
    """``status`` for a person to read."""
    lines = []
    state = "serving" if status["serving"] else "no lane named (settings: lane)" if not status["lane"] else \
        "NOT serving what its settings name"
    lane = f"lane {status['lane']}, plan {status['digest']}" if status["lane"] else "no lane"
    lines.append(f"cluster {status['cluster']}: {lane}: {state}")
    if status.get("models"):
        said = [f"{m['repo']}@{m['revision']}" + (" (the lock's pin)" if m["locked"] else "") for m in status["models"]]
        lines.append("  models: " + ", ".join(said))
    api = status["api"]
    if api:
        latency = f", a one-token completion in {api['seconds']:.2f}s" if api["seconds"] is not None else \
            f", completion: {api['completion']}" if api["completion"] else ""
        bound = f"; a wedged engine is restarted within {api['wedge_bound']}s" if api.get("wedge_bound") else ""
        lines.append(f"  API {api['url']}: /health {api['health']}{latency}{bound}" + (f"; its key: {api['key']}"
                                                                                     if api.get("key") else ""))
    rows = [("node", "rank", "unit", "container up since", "image", "snapshots", "fabric", "GID", "NCCL")]
    for node in status["nodes"]:
        if not node["reached"]:
            rows.append((node["name"], str(node["rank"]), "not reached", "", "", "", "", "", ""))
            continue
        fab = node["fabric"]
        fabric = (f"{fab['operstate']} {fab['mtu']} {','.join(fab['addresses']) or 'no address'}"
                  if fab.get("present") else "absent")
        snaps = node["snapshots_match_head"]
        rows.append((
            node["name"], str(node["rank"]), node["unit"],
            (node["container"] or {}).get("since", "-")[:19].replace("T", " ") if node["container"] else "-",
            (node["image_id"][7:19] if node["image_id"] else "missing" if node.get("docker", True) else "no dockerd")
            + ("" if node["rank"] == 0 or node["image_matches_head"] else " ≠head"),
            "-" if not snaps else "match" if all(snaps.values()) else "DIFFER",
            fabric, gid_cell(node), nccl_cell(node),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if status["history"]:
        lines.append("  last starts and stops:")
        for event in status["history"]:
            extra = f" after {event['seconds']:.0f}s" if event.get("seconds") is not None else ""
            lines.append(f"    {when(event.get('at'))}  {event.get('event', '?'):5}  {event.get('why', '')}{extra}")
    if status.get("known_good"):
        lines.append("  known good (kept on every node to return to, newest last):")
        for kept in status["known_good"]:
            size = kept.get("image_bytes")
            disk = "" if "image_bytes" not in kept else f" ({size / 2**30:.1f} GiB)" if size is not None else \
                " (MISSING on the head: a rollback to it cannot start)"
            lines.append(f"    #{kept['number']}  {when(kept.get('at'))}  lane {kept['lane']}, plan {kept['digest']}, "
                         f"image {kept['image']}{disk}: {kept.get('why', '')}")
        lines.append(f"    {kept_disk(status)}")
    for node in (n for n in status["nodes"] if n.get("drift")):
        lines.append(f"  {node['name']} changed since known good #{node['drift_since']}: {'; '.join(node['drift'])} "
                     "(the next converge's preflight runs the node rules on it)")
    for warning in status.get("warnings") or []:
        lines.append(f"  warning: {warning}")
    rejected = status.get("rejected")
    if rejected:
        lines.append(f"  rejected: plan {rejected.get('digest')}, {when(rejected.get('at'))}: {rejected.get('why', '')} "
                     f"(a converge refuses it; --data retry_rejected=true starts it once more)")
    for problem in status["problems"]:
        lines.append(f"  - {problem}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkinfra status", description=__doc__.split("\n\n")[0])
    parser.add_argument("inventory")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cluster", help="one cluster of the inventory (default: every one)")
    parser.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    args = parser.parse_args(argv)
    try:
        inventory, settings = remote.settings_of(args.inventory, args.data)
        clusters = remote.clusters_of(settings, args.cluster)
    except (InventorySettingsError, lanes.LaneError) as exc:
        print(f"sparkinfra status: {exc}", file=sys.stderr)
        return 2
    statuses = [cluster_status(reached) for reached in remote.connect(inventory, clusters)]
    ok = all(s["ok"] for s in statuses)
    if args.json:
        print(json.dumps({"ok": ok, "clusters": statuses}, indent=2, sort_keys=True))
    else:
        print("\n".join(text(s) for s in statuses))
    return 0 if ok else 1
