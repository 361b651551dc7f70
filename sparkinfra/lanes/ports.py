"""
The ports a lane opens on each node, the process behind each and from where it may be reached
(``opened``: what ``lanes show`` prints), and the ports the host firewall keeps to the fabric subnet
(``firewalled``, plus each node's ephemeral range: ``operations.firewall.fabric_only_ports``).

What binds where (read in the sources of vLLM 0.32, torch 2.x and Ray 2.60):

- torch.distributed's TCPStore (the master port, rank 0's rendezvous) listens on every address; its
  host is only what the other ranks connect to.
- vLLM's message queues between ranks (ZMQ, ``shm_broadcast.MessageQueue``) bind
  ``tcp://<VLLM_HOST_IP>:0``; NCCL's and gloo's bootstrap sockets bind the address of
  ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME``: the fabric's, on ports the kernel picks.
- Ray's GCS, raylet, object manager, agents and workers listen on every address (gRPC on 0.0.0.0;
  ``--node-ip-address`` is only the address Ray advertises); the GCS on ``--port``, the client
  server on 10001, the workers on ``--min-worker-port``..``--max-worker-port`` (pinned in the
  command), everything else on a port the kernel picks, unless a flag names one.

So a rule by port and source, not a bind, is what keeps them from the management LAN: the named
ports and Ray's ranges, plus the kernel's ephemeral range (``net.ipv4.ip_local_port_range``), where
every port picked by the kernel lies. A site's own services on other ports are never matched.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import Cluster
from .checks import effective_ports
from .schema import Lane

RAY_CLIENT_PORT = 10001  # ray start --head: the Ray client server (with ray[client]), Ray's default
RAY_WORKER_PORTS = (10002, 19999)  # --min-worker-port/--max-worker-port (Ray's defaults, pinned)
EPHEMERAL = "ephemeral"  # the node's net.ipv4.ip_local_port_range, read there


@dataclass(frozen=True)
class Opened:
    """A port (or range) a lane opens on a node: the process behind it and from where it may be reached."""

    ports: str  # "29501", "10002-19999", or EPHEMERAL
    process: str
    reach: str


def firewalled(lane: Lane, cluster: Cluster) -> tuple[tuple[int, int], ...]:
    """The ports (first, last) the firewall keeps to the fabric subnet on every node of ``lane``,
    besides the node's ephemeral range: a multi-node mp lane's rendezvous (torch's store), a Ray
    lane's GCS, client server and worker ports."""
    if lane.launch == "ray":
        return merged([(lane.ray_port, lane.ray_port), (RAY_CLIENT_PORT, RAY_CLIENT_PORT), RAY_WORKER_PORTS])
    master = effective_ports(lane, cluster)["master_port"]
    return ((master, master),) if lane.nodes > 1 else ()


def left_open(api_port: int, ssh_port: int | None = None) -> tuple[int, ...]:
    """The ports the firewall never matches, whatever its ranges hold: SSH (22 and the port pyinfra
    reaches the node on) and the API."""
    return tuple(sorted({22, ssh_port or 22, api_port}))


def merged(ranges) -> tuple[tuple[int, int], ...]:
    """``ranges`` of (first, last) sorted, overlapping and adjacent ones made one (nftables refuses
    overlapping elements in an interval set)."""
    out: list[list[int]] = []
    for first, last in sorted(tuple(r) for r in ranges):
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return tuple((first, last) for first, last in out)


def opened(lane: Lane, cluster: Cluster, rank: int) -> list[Opened]:
    """Every port ``lane`` opens on the node of ``rank``, its process, and from where it may be reached."""
    config = cluster.config
    ports = effective_ports(lane, cluster)
    node = next(n for n in cluster.nodes if n.rank == rank)
    guarded = (f"the fabric subnet {cluster.fabric.subnet} only (firewall: table inet sparkinfra)"
               if config.firewall else "every address (firewall: false: the site's own firewall must keep it to the fabric)")
    bound = f"the fabric subnet only (bound to {node.fabric_ip}; the firewall too)" if config.firewall else \
        f"the fabric subnet only (bound to {node.fabric_ip})"
    out = []
    if rank == 0:
        key = "no key: api_open" if config.api_open else "the API key guards it"
        out.append(Opened(str(ports["api_port"]), "vLLM's API server (--host 0.0.0.0)", f"anyone who reaches the node ({key})"))
    if lane.launch == "ray":
        if rank == 0:
            out += [Opened(str(lane.ray_port), "Ray's GCS (ray start --head --port; every address)", guarded),
                    Opened(str(RAY_CLIENT_PORT), "Ray's client server (every address)", guarded)]
        out += [Opened("{}-{}".format(*RAY_WORKER_PORTS), "Ray's workers (--min-worker-port/--max-worker-port)", guarded),
                Opened(EPHEMERAL, "Ray's raylet, object manager, agents, metrics (every address); vLLM's message "
                       "queues, NCCL's and gloo's bootstrap (the fabric address)", guarded)]
        return out
    if rank == 0 and lane.nodes > 1:
        out.append(Opened(str(ports["master_port"]), "torch.distributed's store, the ranks' rendezvous "
                          "(--master-port; every address)", guarded))
    out.append(Opened(EPHEMERAL, "vLLM's message queues (ZMQ, bound to VLLM_HOST_IP), NCCL's and gloo's "
                      "bootstrap (the fabric interface's address)", bound))
    return out
