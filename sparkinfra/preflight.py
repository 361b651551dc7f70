"""
Preflight: every node checked before any change; one line per check, a JSON summary, and the run
stops (non-zero exit, nothing changed) when any check fails.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass

from pyinfra import logger
from pyinfra.api import FactBase
from pyinfra.api.exceptions import PyinfraError
from typing_extensions import override

from .facts.reading import at_once, gathered
from .settings import Cluster, Settings


class PreflightFailed(PyinfraError):
    """A preflight check failed on some node: nothing was changed."""


class PreflightProbe(FactBase):
    """
    Returns ``key=value`` lines about a node, read in one round trip: the GPU nvidia-smi
    reports, free and used bytes under the model folder, the fabric link, listeners on ports.
    """

    @override
    def command(self, model_dir: str, interface: str, ports: tuple[int, ...]) -> str:
        d, i = shlex.quote(model_dir), shlex.quote(interface)
        lines = [
            "if command -v nvidia-smi >/dev/null 2>&1; then "
            "echo \"gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -n 1)\"; "
            "else echo 'gpu=!missing'; fi",
            f"p={d}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
            "echo \"free=$(df -PB1 \"$p\" | awk 'NR==2 {print $4}')\"",
            f"echo \"used=$(du -sb {d} 2>/dev/null | cut -f1)\"",
            f"echo \"link=$(ip -o link show dev {i} 2>/dev/null | head -n 1)\"",
        ]
        for port in ports:
            lines.append(
                f"ss -Hltnp '( sport = :{int(port)} )' | while read -r l; do "
                "pid=$(echo \"$l\" | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2); "
                "comm=$(echo \"$l\" | grep -o 'users:((\"[^\"]*' | cut -d'\"' -f2); "
                "cid=$(grep -o 'docker[-/][0-9a-f]\\{12,\\}' /proc/$pid/cgroup 2>/dev/null | head -n 1 "
                "| grep -o '[0-9a-f]\\{12,\\}'); "
                "name=; [ -n \"$cid\" ] && name=$(docker inspect -f '{{.Name}}' \"$cid\" 2>/dev/null); "
                f"echo \"port={int(port)} pid=$pid comm=$comm container=${{name#/}}\"; done"
            )
        return "; ".join(lines) + "; true"

    @override
    def process(self, output):
        probe: dict = {"ports": []}
        for line in output:
            key, _, value = line.partition("=")
            if key == "port":
                probe["ports"].append(value)
            else:
                probe[key] = value.strip()
        return probe


@dataclass
class Check:
    host: str
    check: str
    ok: bool
    detail: str


def link_flags(probe: dict | None) -> list[str]:
    """The flags of an ``ip -o link show`` line (``["BROADCAST", "UP", "LOWER_UP"]``)."""
    link = (probe or {}).get("link", "")
    return link.split("<", 1)[1].split(">", 1)[0].split(",") if "<" in link else []


def evaluate(
    cluster: Cluster, host_name: str, probe: dict | None, peers_down: tuple[str, ...] = ()
) -> list[Check]:
    """
    Judge one node's probe (``None``: the node was not reachable over SSH).

    + peers_down: nodes of the cluster whose fabric port is administratively down (prepare
      brings them up): with one of them, no carrier is expected rather than a cable fault
    """
    node = cluster.node(host_name)
    config = cluster.config
    if probe is None:
        return [Check(host_name, "ssh", False, f"{node.ssh_user}@{node.ssh_host} not reachable")]
    checks = [Check(host_name, "ssh", True, f"{node.ssh_user}@{node.ssh_host}")]

    gpu = probe.get("gpu", "")
    if gpu == "!missing":
        checks.append(Check(host_name, "gpu", False, "nvidia-smi not found"))
    else:
        checks.append(Check(host_name, "gpu", "GB10" in gpu, gpu or "nvidia-smi reported no GPU"))

    need = int(config.preflight_free_gb * 1e9)
    free = int(probe.get("free") or 0)
    used = int(probe.get("used") or 0)  # what is already staged counts towards the need
    checks.append(
        Check(
            host_name, "disk", free + used >= need,
            f"{free / 1e9:.1f} GB free + {used / 1e9:.1f} GB staged under {config.model_dir}, "
            f"{need / 1e9:.1f} GB needed",
        )
    )

    link = probe.get("link", "")
    flags = link_flags(probe)
    peers = [p for p in peers_down if p != host_name]
    if not link:
        checks.append(Check(host_name, "fabric", False, f"{cluster.fabric.interface} not present"))
    elif "UP" not in flags:
        checks.append(Check(host_name, "fabric", True, f"{cluster.fabric.interface} present, down (prepare brings it up)"))
    elif ("NO-CARRIER" in flags or "LOWER_UP" not in flags) and peers:
        checks.append(Check(host_name, "fabric", True, f"{cluster.fabric.interface} up, no carrier while {', '.join(peers)} down (prepare brings it up)"))
    elif "NO-CARRIER" in flags or "LOWER_UP" not in flags:
        checks.append(Check(host_name, "fabric", False, f"{cluster.fabric.interface} up but no carrier: cable, peer or switch port down"))
    else:
        checks.append(Check(host_name, "fabric", True, f"{cluster.fabric.interface} up, carrier"))

    if node == cluster.head:
        held = [p for p in probe["ports"] if _listener(p).get("container") != config.container_name]
        ports = ", ".join(str(p) for p in (config.api_port, config.master_port))
        own = sorted({_listener(p)["port"] for p in probe["ports"]} - {_listener(p)["port"] for p in held}, key=int)
        detail = (
            f"{ports} in use: {'; '.join(held)}" if held
            else f"{ports}: {', '.join(own)} held by the lane's own {config.container_name}" if own
            else f"{ports} free"
        )
        checks.append(Check(host_name, "ports", not held, detail))
    return checks


def _listener(line: str) -> dict[str, str]:
    """``8000 pid=12 comm=vllm container=vllm_node`` -> its fields (``port`` for the first)."""
    words = line.split()
    fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    fields["port"] = words[0] if words else ""
    return fields


def required_ports(cluster: Cluster, host_name: str) -> tuple[int, ...]:
    """Ports a node needs free: the API and rendezvous ports on the head."""
    if cluster.node(host_name) == cluster.head:
        return (cluster.config.api_port, cluster.config.master_port)
    return ()


def run(state, settings: Settings) -> list[Check]:
    """
    Check every node of the inventory (once per run: ``run.start(preflight_first=True)``), print
    one line per check and a JSON summary; raise ``PreflightFailed`` if any failed.
    """
    checks: list[Check] = []
    active = {h.name for h in state.inventory.iter_activated_hosts()}
    for cluster in settings.clusters.values():
        probes = {node.name: None for node in cluster.nodes}
        live = [state.inventory.get_host(node.name) for node in cluster.nodes if node.name in active]
        values = at_once([  # every node's probe at once
            (h, gathered, h, PreflightProbe, {
                "model_dir": cluster.config.model_dir,
                "interface": cluster.fabric.interface,
                "ports": required_ports(cluster, h.name),
            })
            for h in live
        ])
        probes.update((h.name, value) for h, value in zip(live, values))
        down = tuple(n for n, p in probes.items() if p and p.get("link") and "UP" not in link_flags(p))
        for node in cluster.nodes:
            checks += evaluate(cluster, node.name, probes[node.name], down)
    for c in checks:
        logger.info(f"    [{c.host}] preflight {'PASS' if c.ok else 'FAIL'} {c.check:<7} {c.detail}")
    failed = [c for c in checks if not c.ok]
    summary = {"passed": len(checks) - len(failed), "failed": [asdict(c) for c in failed]}
    logger.info(f"--> Preflight summary: {json.dumps(summary)}")
    if failed:
        raise PreflightFailed(
            "preflight failed, nothing changed: "
            + "; ".join(f"{c.host} {c.check}: {c.detail}" for c in failed)
        )
    return checks
