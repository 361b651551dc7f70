"""
One node's state for ``python -m sparkinfra status`` (read-only; stdlib only; run as root with
the node's python3, sent as ``python3 -c TEXT QUERY``): one JSON object on stdout.

    node_report.py QUERY

QUERY is a JSON object: ``lane`` (its unit, plan, started mark and history paths), ``container``,
``image`` (the lane's image reference), ``interface`` (the fabric port), ``nccl_env`` (the NCCL
env file), ``repos`` (the snapshots' folders), ``snapshot_tool`` (its text, base64: the
manifests are read as the stage writes them), ``pin`` and ``pin_record`` (the pinned NCCL and its
identity record), ``identity_script`` (``nccl_identity.py`` on the node: which libnccl the
container's vLLM processes mapped) and ``probe`` (preflight's probe script, base64) with its
``probe_args``: its lines are the node rules' facts and what changed beneath the lanes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

INFINIBAND = "/sys/class/infiniband"
NCCL_LINE = re.compile(r"NCCL (?:INFO )?(?:NCCL version|NET/|Using network|NCCL_IB_GID_INDEX)")


def sh(*args: str, timeout: float = 20) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def unit(name: str) -> dict:
    """The unit's state, when it entered it (epoch seconds) and its invocation (for its journal)."""
    shown = sh("systemctl", "show", name, "-p", "LoadState,ActiveState,SubState,UnitFileState,"
               "ActiveEnterTimestampMonotonic,InvocationID,NRestarts")
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    since = int(props.get("ActiveEnterTimestampMonotonic") or 0)
    return {
        "loaded": props.get("LoadState", "not-found") == "loaded",
        "active": props.get("ActiveState", "unknown"),
        "sub": props.get("SubState", ""),
        "enabled": props.get("UnitFileState", ""),
        "since": round(wall_clock(since / 1e6)) if since else None,
        "invocation": props.get("InvocationID", ""),
        "restarts": int(props.get("NRestarts") or 0),
    }


def wall_clock(monotonic: float) -> float:
    """A CLOCK_MONOTONIC time (systemd's *TimestampMonotonic) as epoch seconds."""
    return time.time() - (time.monotonic() - monotonic)


def container(name: str) -> dict | None:
    shown = sh("docker", "inspect", "-f", "{{.State.Running}} {{.State.StartedAt}} {{.Image}}", name)
    if not shown:
        return None
    running, started, image = (shown.split() + ["", "", ""])[:3]
    return {"running": running == "true", "started_at": started, "image": image}


def fabric(interface: str) -> dict:
    base = f"/sys/class/net/{interface}"
    if not os.path.isdir(base):
        return {"present": False}
    addresses = sh("ip", "-4", "-o", "addr", "show", "dev", interface)
    return {
        "present": True,
        "operstate": read(f"{base}/operstate").strip(),
        "carrier": read(f"{base}/carrier").strip() == "1",
        "mtu": int(read(f"{base}/mtu").strip() or 0),
        "addresses": re.findall(r"inet (\S+)", addresses),
    }


def rdma() -> list[dict]:
    """Every RDMA device port as ibdev2netdev reads it (its PCI function's netdev), with its GID
    table's populated rows and its netdev's state: what status applies the twin rule to."""
    root = INFINIBAND
    found = []
    for device in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        try:
            netdev = sorted(os.listdir(f"{root}/{device}/device/net"))[0]
        except (OSError, IndexError):
            netdev = ""
        ports = f"{root}/{device}/ports"
        for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
            rows = []
            gids = f"{ports}/{port}/gids"
            for index in sorted((int(i) for i in os.listdir(gids) if i.isdigit()) if os.path.isdir(gids) else []):
                gid = read(f"{gids}/{index}").strip()
                kind = read(f"{ports}/{port}/gid_attrs/types/{index}").strip()
                if kind and gid and set(gid) - {"0", ":"}:
                    rows.append({"index": index, "gid": gid, "type": kind,
                                 "ndev": read(f"{ports}/{port}/gid_attrs/ndevs/{index}").strip()})
            state = read(f"{ports}/{port}/state").strip()
            found.append({"device": device, "port": int(port), "netdev": netdev,
                          "state": state.split(":", 1)[-1].strip() or "missing", "gids": rows,
                          "link": fabric(netdev) if netdev else {"present": False}})
    return found


def pin(query: dict) -> dict:
    """The pinned NCCL's sha256 and its identity record (None where missing)."""
    path, digest = query.get("pin", ""), None
    if path and os.path.isfile(path):
        hashed = hashlib.sha256()
        with open(path, "rb") as library:
            for chunk in iter(lambda: library.read(1 << 20), b""):
                hashed.update(chunk)
        digest = hashed.hexdigest()
    try:
        record = json.loads(read(query.get("pin_record", ""))) if query.get("pin_record") else None
    except ValueError:
        record = None
    return {"sha256": digest, "record": record}


def live(query: dict, box: dict | None) -> dict | None:
    """Which libnccl each vLLM process of the running container mapped (nccl_identity.py --live)."""
    script = query.get("identity_script", "")
    if not box or not box.get("running") or not script or not os.path.isfile(script):
        return None
    try:
        with open(script, "rb") as source:
            done = subprocess.run(["docker", "exec", "-i", query["container"], "python3", "-", "--live", "--match",
                                   "vllm"], stdin=source, capture_output=True, text=True, timeout=60, check=False)
        return json.loads(done.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)[-200:]}


def env_value(path: str, key: str) -> str | None:
    for line in read(path).splitlines():
        if line.startswith(f"{key}="):
            return line.split("=", 1)[1].strip().strip('"')
    return None


def manifests(repos: list[str], tool_b64: str) -> dict:
    """Each snapshot's manifest digest as the stage records it (None: no snapshot)."""
    if not repos:
        return {}
    tool: dict = {"__name__": "snapshot_tool"}
    exec(compile(base64.b64decode(tool_b64).decode(), "snapshot_tool.py", "exec"), tool)  # noqa: S102
    found = {}
    for repo in repos:
        try:
            state = tool["manifest"](repo) if os.path.isdir(repo) else {}
        except (OSError, ValueError) as exc:
            state = {"error": str(exc)}
        found[repo] = state.get("digest") if state.get("exists") and not state.get("stale") else None
    return found


def history(path: str, count: int = 10) -> list[dict]:
    events = []
    for line in read(path).splitlines()[-count:]:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def rejected(path: str) -> dict | None:
    """The head's mark of the lane's plan a rollback turned away (None: none)."""
    try:
        found = json.loads(read(path)) if path else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def known_good(folder: str) -> list[dict]:
    """The known good sets kept in ``folder`` (``<n>/meta.json`` each), oldest first, each with the
    size of its image on this node (None: the image is gone, a rollback to the set cannot start)."""
    found = []
    for meta in Path(folder).glob("*/meta.json") if folder else []:
        try:
            entry = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and isinstance(entry.get("number"), int):
            kept = {k: entry.get(k) for k in ("number", "lane", "digest", "image", "at", "why", "canary")}
            size = sh("docker", "image", "inspect", "-f", "{{.Size}}", entry["image_id"]) if entry.get("image_id") else ""
            found.append({**kept, "image_id": entry.get("image_id"), "image_bytes": int(size) if size.isdigit() else None})
    return sorted(found, key=lambda e: e["number"])


def nccl_lines(invocation: str) -> list[str]:
    """NCCL's start-up lines in the lane's journal of its current start."""
    if not invocation:
        return []
    log = sh("journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat", "--no-pager", timeout=30)
    return [line for line in log.splitlines() if NCCL_LINE.search(line)][-40:]


def report(query: dict) -> dict:
    lane = query["lane"]
    plan_text = read(lane["plan"])
    try:
        plan = json.loads(plan_text) if plan_text else None
    except ValueError:
        plan = None
    started = read(lane["started"])
    try:
        started = json.loads(started) if started else {}
    except ValueError:
        started = {}
    state = unit(lane["unit"]) if lane["unit"] else {"loaded": False}
    image_id = sh("docker", "image", "inspect", "-f", "{{.Id}}", query["image"]) if query.get("image") else ""
    box = container(query["container"])
    return {
        "unit": state,
        "other_units": sorted(u for u in sh("systemctl", "list-units", "--plain", "--no-legend", "--state=active",
                                            "sparkinfra-lane-*.service").split() if u.endswith(".service")
                              and u != lane["unit"]),
        "plan": {"digest": plan.get("digest"), "rank": plan.get("rank")} if plan else None,
        "started": {"digest": started.get("digest"), "at": started.get("at")} if started else None,
        "container": box,
        "image_id": image_id or None,
        "manifests": manifests(query.get("repos", []), query.get("snapshot_tool", "")),
        "fabric": fabric(query["interface"]),
        "gid_index": env_value(query["nccl_env"], "NCCL_IB_GID_INDEX"),
        "nccl_hcas": env_value(query["nccl_env"], "NCCL_IB_HCA"),
        "rdma": rdma(),
        "pin": pin(query),
        "live_nccl": live(query, box),
        "nccl_lines": nccl_lines(state.get("invocation", "")),
        "history": history(lane["history"]) if lane.get("history") else [],
        "known_good": known_good(query.get("known_good", "")),
        "rejected": rejected(lane.get("rejected", "")),
        "docker": bool(sh("docker", "version", "-f", "{{.Server.Version}}")),
        "probe": probe(query.get("probe", ""), query.get("probe_args", [])),
    }


def probe(text_b64: str, args: list[str]) -> list[str]:
    """The lines of preflight's probe (sent as its text) run here with ``args``."""
    if not text_b64:
        return []
    return sh("sh", "-c", base64.b64decode(text_b64).decode(), "preflight_probe.sh", *args, timeout=90).splitlines()


if __name__ == "__main__":
    print(json.dumps(report(json.loads(sys.argv[1]))))
