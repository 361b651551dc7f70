"""
Preflight: every node checked before any change; one line per check, a JSON summary, and the run
stops (non-zero exit, nothing changed) when any check fails.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass

import paramiko

from pyinfra import logger
from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import PyinfraError
from typing_extensions import override

from . import lanes, roce, rules, scripts
from .node import paths
from .lanes.render import RDMA_DEVICES
from .facts.reading import at_once, gathered
from .settings import Cluster, Settings


class PreflightFailed(PyinfraError):
    """A preflight check failed on some node: nothing was changed."""


class PreflightProbe(FactBase):
    """
    Returns what preflight judges of a node, read in one round trip (``scripts/preflight_probe.sh``):
    the GPU nvidia-smi reports, the version dockerd answers (``!missing``, ``!<its error>``), free
    and used bytes under the model folder, the fabric link, the RDMA device nodes, listeners on ports.

    .. code:: python

        {"gpu": "NVIDIA GB10", "docker": "28.3.3", "free": "81604378624", "used": "0",
         "rdma": "rdma_cm uverbs0 uverbs1",
         "link": "3: enp1s0f0np0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 4200 …",
         "hcas": ["rocep1s0f0 enp1s0f0np0 <BROADCAST,MULTICAST,UP,LOWER_UP>", ...],
         "ports": ["8000 pid=12 comm=vllm container=vllm_node"]}
    """

    @override
    def command(self, model_dir: str, interface: str, ports: tuple[int, ...], lane: str = "") -> StringCommand:
        history = paths.history_path(lane) if lane else "-"
        return scripts.command("preflight_probe.sh", model_dir, interface, paths.PROGRAMS, paths.KNOWN_GOOD, history,
                               *(str(int(p)) for p in ports))

    @override
    def process(self, output):
        probe: dict = {"ports": [], "hcas": [], "gens": {}, "widths": {}, "addrs": []}
        for line in output:
            key, _, value = line.partition("=")
            if key == "port":
                probe["ports"].append(value)
            elif key == "hca":
                probe["hcas"].append(value)
            elif key == "addr":
                probe["addrs"].append(value.strip())
            elif key == "gen":
                netdev, _, mode = value.strip().partition(" ")
                probe["gens"][netdev] = mode
            elif key == "platform":
                try:
                    probe["platform"] = json.loads(value)
                except ValueError:
                    probe["platform"] = {}
            elif key == "width":
                device, *widths = value.split()
                probe["widths"][device] = tuple(widths)
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


def known_host_entry(hostname: str, port: int) -> str:
    """How ``ssh_known_hosts_file`` names a host (``[host]:port`` off port 22)."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def offered_key(hostname: str, port: int, key_types: list[str], timeout: float = 5) -> paramiko.PKey:
    """The host key ``hostname`` offers, of one of ``key_types`` (the types known_hosts holds for
    it): the key exchange only, no authentication. Raises OSError or paramiko's SSHException."""
    with socket.create_connection((hostname, port), timeout=timeout) as sock:
        transport = paramiko.Transport(sock)
        try:
            transport.get_security_options().key_types = key_types
            transport.start_client(timeout=timeout)
            return transport.get_remote_server_key()
        finally:
            transport.close()


def unreachable_detail(data, host_name: str) -> str:
    """
    Why the controller could not connect to a node, for preflight's ``ssh`` line: a changed host
    key by name, with how to accept the new one on purpose (never silently); else "not reachable"
    with what the connection said.

    + data: the host's pyinfra data (``ssh_hostname``, ``ssh_port``, ``ssh_known_hosts_file``)
    """
    hostname = str(data.get("ssh_hostname") or host_name)
    port = int(data.get("ssh_port") or 22)
    user = data.get("ssh_user") or ""
    where = f"{user}@{hostname}" if user else hostname
    path = os.path.expanduser(str(data.get("ssh_known_hosts_file") or "~/.ssh/known_hosts"))
    entry = known_host_entry(hostname, port)
    try:
        known = paramiko.HostKeys(path).lookup(entry) if os.path.exists(path) else None
    except (OSError, paramiko.SSHException):
        known = None
    try:
        key = offered_key(hostname, port, list(known.keys()) if known else ["ssh-ed25519"])
    except (OSError, paramiko.SSHException, EOFError) as exc:
        return f"{where} not reachable ({exc or type(exc).__name__})"
    if known and key.get_name() in known and known[key.get_name()] != key:
        return (
            f"{where}: its SSH host key changed ({key.get_name()} {key.fingerprint} is "
            f"not the key {path} holds): if {host_name} was re-installed, compare that fingerprint with "
            f"`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on its console, then accept it: "
            f"ssh-keygen -f {path} -R '{entry}', and run once with --data ssh_strict_host_key_checking=accept-new"
        )
    return f"{where} not reachable (the SSH connection failed after the key exchange: see pyinfra's error above)"


def evaluate(
    cluster: Cluster, host_name: str, probe: dict | None, peers_down: tuple[str, ...] = (),
    lane: lanes.Lane | None = None, unreachable: str = "", twins_down: tuple[str, ...] = (),
) -> list[Check]:
    """
    Judge one node's probe (``None``: the node was not reachable over SSH, ``unreachable`` says why).

    + peers_down: nodes of the cluster whose fabric port is administratively down (prepare
      brings them up): with one of them, no carrier is expected rather than a cable fault
    + lane: the cluster's lane, if any: its container gets the node's RDMA devices (``rdma``)
    + twins_down: nodes whose fabric port's twin is administratively down (no carrier is expected)
    """
    node = cluster.node(host_name)
    config = cluster.config
    if probe is None:
        return [Check(host_name, "ssh", False, unreachable or f"{node.ssh_user}@{node.ssh_host} not reachable")]
    checks = [Check(host_name, "ssh", True, f"{node.ssh_user}@{node.ssh_host}")]

    gpu = probe.get("gpu", "")
    if gpu == "!missing":
        checks.append(Check(host_name, "gpu", False, "nvidia-smi not found"))
    else:
        checks.append(Check(host_name, "gpu", "GB10" in gpu, gpu or "nvidia-smi reported no GPU"))
    checks.append(docker_check(host_name, probe))

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
        checks.append(Check(host_name, "fabric", True,
                            f"{cluster.fabric.interface} up, no carrier while {', '.join(peers)} down (prepare brings it up)"))
    elif "NO-CARRIER" in flags or "LOWER_UP" not in flags:
        checks.append(Check(host_name, "fabric", False,
                            f"{cluster.fabric.interface} up but no carrier: cable, peer or switch port down"))
    else:
        checks.append(Check(host_name, "fabric", True, f"{cluster.fabric.interface} up, carrier"))

    checks.append(twins_check(cluster, host_name, probe, twins_down))
    if lane is not None:
        checks.append(rdma_check(host_name, probe, lane))
    port, _, _ = port_flags(cluster, probe)
    drift = drift_check(host_name, probe)
    if drift:
        checks.append(drift)
    for rule, said in node_rules(cluster, probe, lane):
        checks.append(Check(host_name, f"rule {rule.id}", rule.severity == "warn", said))
    if lane is not None and node == cluster.head:  # the lane's warnings (its refusals stopped the run before)
        for rule, said in rules.tripped(lane, cluster):
            if rule.severity == "warn":
                checks.append(Check(host_name, f"rule {rule.id}", True, said))

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


def docker_check(host_name: str, probe: dict) -> Check:
    """dockerd answers on the node: every deploy after preflight asks it (image IDs, the lane's
    containers), and a daemon that does not answer must not read as a missing image."""
    docker = probe.get("docker", "")
    if docker == "!missing":
        return Check(host_name, "docker", False, "docker not found")
    if not docker or docker.startswith("!"):
        return Check(host_name, "docker", False, f"dockerd does not answer: {docker[1:] or 'no version reported'}")
    return Check(host_name, "docker", True, f"dockerd {docker} answers")


def node_rules(cluster: Cluster, probe: dict, lane: lanes.Lane | None = None) -> list[tuple[rules.Rule, str]]:
    """The node rules a node's ``probe`` trips (its fabric port as prepare reads it), each with what it says."""
    return rules.node_tripped(rules.node_facts(port_flags(cluster, probe)[0], probe, cluster, lane))


def reported_rules(cluster: Cluster, answers: dict[str, dict], lane: lanes.Lane | None) -> list[tuple[str, str, bool]]:
    """(node, what it says, whether it refuses) of each node rule tripped by the probe lines each
    node's ``status`` report carries (``answers``: node name -> report)."""
    return [(name, said, rule.severity == "refuse") for name, answer in answers.items() if answer.get("probe")
            for rule, said in node_rules(cluster, PreflightProbe().process(answer["probe"]), lane)]


def drift_check(host_name: str, probe: dict) -> Check | None:
    """What changed beneath the lanes since the newest known good set (the probe's ``platform``):
    said, not refused (the node rules below judge what changed); None when nothing did."""
    platform = probe.get("platform") or {}
    known, changed = platform.get("known") or {}, platform.get("changes") or []
    if not changed:
        return None
    return Check(host_name, "drift", True, f"since known good #{known.get('number')} (lane {known.get('lane')}): "
                 f"{'; '.join(changed)}; the node rules run again on what it is now")


def port_flags(cluster: Cluster, probe: dict | None) -> tuple[roce.Port, list[str], list[str]]:
    """The node's fabric port as prepare will read it (``roce.port_of`` over the probe's ``hca``
    lines), with the link flags of the fabric interface and of its twin."""
    hcas = [line.split(" ", 2) for line in (probe or {}).get("hcas", [])]
    links = [{"device": h[0], "port": cluster.fabric.rdma_port, "netdev": h[1] if h[1] != "-" else "", "state": ""}
             for h in hcas if len(h) >= 2]
    flags = {h[1]: h[2].strip("<>").split(",") if len(h) > 2 else [] for h in hcas if len(h) >= 2}
    port = roce.port_of(cluster.fabric, links)
    return port, flags.get(cluster.fabric.interface, []), flags.get(port.twin or "", [])


def twins_check(cluster: Cluster, host_name: str, probe: dict, twins_down: tuple[str, ...] = ()) -> Check:
    """The fabric port's RDMA devices, as prepare will read them: the fabric interface's and its
    twin's (a GB10's port is two PCIe functions; one alone carries half its 200G). A twin whose link
    is up without a carrier while the fabric interface has one is refused, unless a peer's twin is
    down (prepare brings it up).

    + twins_down: nodes of the cluster whose twin is administratively down
    """
    port, mine, twin = port_flags(cluster, probe)
    if port.problems:
        return Check(host_name, "twins", False, "; ".join(port.problems))
    said = " and ".join(f"{netdev} ({device})" for device, netdev in port.hcas)
    if not port.twin:
        why = "fabric_twin_interface = none" if cluster.fabric.twin == "none" else \
            f"no netdev named as {cluster.fabric.interface} in another PCI domain"
        return Check(host_name, "twins", True, f"{said} alone ({why}): one HCA, half a GB10 port's bandwidth")
    if "LOWER_UP" in mine and "UP" in twin and "LOWER_UP" not in twin:
        peers = [p for p in twins_down if p != host_name]
        if peers:
            return Check(host_name, "twins", True, f"{said}; {port.twin} has no carrier while the twin of "
                                                   f"{', '.join(peers)} is down (prepare brings it up)")
        return Check(host_name, "twins", False, f"{said}: the twin {port.twin} is up without a carrier while "
                                                f"{cluster.fabric.interface} has one (its PCIe function or firmware)")
    return Check(host_name, "twins", True, said)


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


def run(state, settings: Settings, in_run: set[str]) -> list[Check]:
    """
    Check every node of the clusters in the run (once per run: ``run.start(preflight_first=True)``),
    print one line per check and a JSON summary; raise ``PreflightFailed`` if any failed.

    + in_run: names of the hosts the run operates on (``run.in_run``): a cluster ``--limit``
      leaves out is not checked (``run.whole_clusters``: a run has all of a cluster's nodes, or none)
    """
    checks: list[Check] = []
    active = {h.name for h in state.inventory.iter_activated_hosts()}
    for cluster in settings.clusters.values():
        if not any(node.name in in_run for node in cluster.nodes):
            continue
        lane = lanes.find_lane(cluster.config.lane) if cluster.config.lane else None
        probes = {node.name: None for node in cluster.nodes}
        live = [state.inventory.get_host(node.name) for node in cluster.nodes if node.name in active]
        values = at_once([  # every node's probe at once
            (h, gathered, h, PreflightProbe, {
                "model_dir": cluster.config.model_dir,
                "interface": cluster.fabric.interface,
                "ports": required_ports(cluster, h.name, lane),
                "lane": lane.name if lane and cluster.node(h.name) == cluster.head else "",  # its starts' history
            })
            for h in live
        ])
        probes.update((h.name, value) for h, value in zip(live, values))
        down = tuple(n for n, p in probes.items() if p and p.get("link") and "UP" not in link_flags(p))
        ports = {n: port_flags(cluster, p) for n, p in probes.items() if p}
        twins_down = tuple(n for n, (port, _, twin) in ports.items() if port.twin and "UP" not in twin)
        for node in cluster.nodes:
            why = "" if probes[node.name] else unreachable_detail(state.inventory.get_host(node.name).data, node.name)
            checks += evaluate(cluster, node.name, probes[node.name], down, lane, why, twins_down)
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
