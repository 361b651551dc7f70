"""
What a node runs beneath a lane (stdlib only): the kernel's release, the GPU driver, each RDMA
device's firmware and the Docker daemon's version. A known good set records it (``lane_known.keep``)
so that ``status`` and the next converge can say what changed under a lane that worked: an
unattended OS upgrade, a new driver, a flashed firmware.

    python3 PROGRAMS platform_facts [KNOWN_GOOD_DIR]   # {"now": {...}, "known": {"number": N, ...} or null}
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

INFINIBAND = Path("/sys/class/infiniband")
FIELDS = ("kernel", "driver", "firmware", "docker")


def _out(*args: str) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip().splitlines()[0].strip() if done.returncode == 0 and done.stdout.strip() else ""


def read() -> dict[str, str]:
    """This node's platform now: each of ``FIELDS`` ("" where it cannot be read)."""
    firmware = []
    for device in sorted(INFINIBAND.glob("*")) if INFINIBAND.is_dir() else []:
        try:
            firmware.append(f"{device.name} {(device / 'fw_ver').read_text().strip()}")
        except OSError:
            continue
    return {
        "kernel": _out("uname", "-r"),
        "driver": _out("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"),
        "firmware": ", ".join(firmware),
        "docker": _out("docker", "version", "--format", "{{.Server.Version}}"),
    }


def newest_known(folder: str) -> dict | None:
    """The newest known good set's number and the platform it recorded (None: no set, or one from
    before sets recorded it)."""
    found = []
    for meta in Path(folder).glob("*/meta.json"):
        try:
            entry = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and isinstance(entry.get("number"), int) and isinstance(entry.get("platform"), dict):
            found.append(entry)
    if not found:
        return None
    newest = max(found, key=lambda e: e["number"])
    return {"number": newest["number"], "lane": newest.get("lane"), **newest["platform"]}


def changes(known: dict | None, now: dict) -> list[str]:
    """What changed since ``known`` (``newest_known``): "kernel A -> B" each."""
    if not known:
        return []
    return [f"{field} {known.get(field) or '-'} -> {now.get(field) or '-'}" for field in FIELDS
            if field in known and known.get(field) != now.get(field)]


if __name__ == "__main__":
    now = read()
    known = newest_known(sys.argv[1]) if len(sys.argv) > 1 else None
    print(json.dumps({"now": now, "known": known, "changes": changes(known, now)}))
