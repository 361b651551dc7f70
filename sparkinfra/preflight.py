"""
Preflight: every node checked before any change; one line per check, a JSON summary, and the run
stops (non-zero exit, nothing changed) when any check fails.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from pyinfra import logger
from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import PyinfraError
from typing_extensions import override

from . import lanes, scripts
from .lanes.render import RDMA_DEVICES
from .facts.reading import at_once, gathered
from .settings import Cluster, Settings


class PreflightFailed(PyinfraError):
    """A preflight check failed on some node: nothing was changed."""


class PreflightProbe(FactBase):
    """
    Returns what preflight judges of a node, read in one round trip (``scripts/preflight_probe.sh``):
    the GPU nvidia-smi reports, free and used bytes under the model folder, the fabric link, the
    RDMA device nodes, listeners on ports.

    .. code:: python

        {"gpu": "NVIDIA GB10", "free": "81604378624", "used": "0", "rdma": "rdma_cm uverbs0 uverbs1",
         "link": "3: enp1s0f0np0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 4200 …",
         "ports": ["8000 pid=12 comm=vllm container=vllm_node"]}
    """

    @override
    def command(self, model_dir: str, interface: str, ports: tuple[int, ...]) -> StringCommand:
        return scripts.command("preflight_probe.sh", model_dir, interface, *(str(int(p)) for p in ports))

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
    cluster: Cluster, host_name: str, probe: dict | None, peers_down: tuple[str, ...] = (),
    lane: lanes.Lane | None = None,
) -> list[Check]:
    """
    Judge one node's probe (``None``: the node was not reachable over SSH).

    + peers_down: nodes of the cluster whose fabric port is administratively down (prepare
      brings them up): with one of them, no carrier is expected rather than a cable fault
    + lane: the cluster's lane, if any: its container gets the node's RDMA devices (``rdma``)
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

    if lane is not None:
        checks.append(rdma_check(host_name, probe, lane))

    if node == cluster.head:
        held = [p for p in probe["ports"] if _listener(p).get("container") != config.container_name]
        ports = ", ".join(str(p) for p in required_ports(cluster, host_name, lane))
        own = sorted({_listener(p)["port"] for p in probe["ports"]} - {_listener(p)["port"] for p in held}, key=int)
        detail = (
            f"{ports} in use: {'; '.join(held)}" if held
            else f"{ports}: {', '.join(own)} held by the lane's own {config.container_name}" if own
            else f"{ports} free"
        )
        checks.append(Check(host_name, "ports", not held, detail))
    return checks


def rdma_check(host_name: str, probe: dict, lane: lanes.Lane) -> Check:
    """The node has the verbs devices the lane's container is given (NCCL opens them over the
    fabric); a lane that opts out (``container.rdma: false``) says so."""
    if not lane.container.rdma:
        return Check(host_name, "rdma", True, f"not used: lane {lane.name} says container.rdma: false")
    found = (probe.get("rdma") or "").split()
    if not any(d.startswith("uverbs") for d in found):
        return Check(host_name, "rdma", False,
                     f"no uverbs device in {RDMA_DEVICES} ({' '.join(found) or 'empty'}): the RDMA driver is not "
                     f"loaded, lane {lane.name}'s NCCL could not open the HCA in its container")
    if "rdma_cm" not in found:
        return Check(host_name, "rdma", False, f"no rdma_cm in {RDMA_DEVICES} (the rdma_ucm module is not loaded): "
                                               f"lane {lane.name}'s NCCL could not connect over RoCE")
    return Check(host_name, "rdma", True,
                 f"{' '.join(sorted(found))} in {RDMA_DEVICES}, given to lane {lane.name}'s container")


def _listener(line: str) -> dict[str, str]:
    """``8000 pid=12 comm=vllm container=vllm_node`` -> its fields (``port`` for the first)."""
    words = line.split()
    fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    fields["port"] = words[0] if words else ""
    return fields


def required_ports(cluster: Cluster, host_name: str, lane: lanes.Lane | None = None) -> tuple[int, ...]:
    """Ports a node needs free: on the head, the API and rendezvous ports (the lane's own, where it
    sets them) and a Ray lane's GCS port."""
    if cluster.node(host_name) != cluster.head:
        return ()
    if lane is None:
        return (cluster.config.api_port, cluster.config.master_port)
    return tuple(lanes.effective_ports(lane, cluster).values())


def run(state, settings: Settings) -> list[Check]:
    """
    Check every node of the inventory (once per run: ``run.start(preflight_first=True)``), print
    one line per check and a JSON summary; raise ``PreflightFailed`` if any failed.
    """
    checks: list[Check] = []
    active = {h.name for h in state.inventory.iter_activated_hosts()}
    for cluster in settings.clusters.values():
        lane = lanes.find_lane(cluster.config.lane) if cluster.config.lane else None
        probes = {node.name: None for node in cluster.nodes}
        live = [state.inventory.get_host(node.name) for node in cluster.nodes if node.name in active]
        values = at_once([  # every node's probe at once
            (h, gathered, h, PreflightProbe, {
                "model_dir": cluster.config.model_dir,
                "interface": cluster.fabric.interface,
                "ports": required_ports(cluster, h.name, lane),
            })
            for h in live
        ])
        probes.update((h.name, value) for h, value in zip(live, values))
        down = tuple(n for n, p in probes.items() if p and p.get("link") and "UP" not in link_flags(p))
        for node in cluster.nodes:
            checks += evaluate(cluster, node.name, probes[node.name], down, lane)
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
