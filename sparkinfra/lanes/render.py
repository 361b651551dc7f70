"""
A lane rendered for one rank: the ``vllm serve`` arguments, the environment with its placeholders
filled, the container's options.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from ..settings import Cluster, serve_settings
from .checks import effective_ports
from .images import lane_image
from .ports import RAY_WORKER_PORTS
from .schema import PLACEHOLDER_RE, Lane, LaneError, lane_source


@dataclass
class Launch:
    """What one rank's container runs."""

    rank: int
    command: list[str]  # after the image name in ``docker run``: entry point and arguments
    serve_args: list[str]  # the ``vllm serve`` arguments, model first; empty for a Ray worker
    env: dict[str, str]  # the lane's environment, placeholders filled
    api: bool  # this rank serves the API (rank 0)
    image: str  # the lane's image, else the cluster's


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def serve_flags(settings: dict[str, Any]) -> list[str]:
    """
    ``vllm serve`` flags of settings keyed by flag name, in key order: true -> ``--x``, false ->
    ``--no-x``, a mapping -> one JSON argument, a list -> ``--x a b`` (vLLM's ``nargs="+"``).
    """
    args: list[str] = []
    for key in sorted(settings):
        value = settings[key]
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, list):
            args += [flag, *(_text(v) for v in value)]
        else:
            args += [flag, _text(value)]
    return args


def _fill(value: str, values: dict[str, str]) -> str:
    return PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), value)


def utilization(lane: Lane, cluster: Cluster, gmu: float | None = None) -> float:
    """The GPU memory utilization ``lane`` starts with on ``cluster``: ``gmu`` (a tuning trial's), else
    the cluster's setting, else the lane's."""
    given = (gmu, cluster.config.gpu_memory_utilization, lane.gpu_memory_utilization)
    return next(value for value in given if value is not None)


def launch(lane: Lane, cluster: Cluster, rank: int, gmu: float | None = None) -> Launch:
    """
    The container command of ``rank`` for ``lane`` on ``cluster``.

    + gmu: GPU memory utilization replacing the lane's and the cluster's (a tuning trial's)

    The cluster's settings that reach ``vllm serve`` (``settings.serve_settings``) go to every rank
    that runs it; the cluster's GMU replaces the lane's.

    mp: every rank runs ``vllm serve`` with ``--nnodes/--node-rank/--master-addr/--master-port``;
    rank 0 serves the API, the others run ``--headless``. ray: workers run ``ray start --block``,
    the head starts Ray and then ``vllm serve ... --distributed-executor-backend ray``.
    """
    node = next((n for n in cluster.nodes if n.rank == rank), None)
    if node is None:
        raise LaneError(f"{lane_source(lane)}: cluster {cluster.name} has no rank {rank}")
    config = cluster.config
    site = serve_settings(config)  # the flags of the cluster's settings: reserved, so never in lane.serve
    site.pop("gpu_memory_utilization", None)  # rendered first, over the lane's
    gpu_memory = utilization(lane, cluster, gmu)
    if not 0 < gpu_memory <= 1:
        raise LaneError(f"{lane_source(lane)}: gpu_memory_utilization override {gpu_memory} is not in (0, 1]")
    head = str(cluster.head.fabric_ip)
    ports = effective_ports(lane, cluster)
    env = {
        key: _fill(value, {"rank": str(rank), "fabric_ip": str(node.fabric_ip), "head_ip": head})
        for key, value in lane.env.items()
    }
    env.update(config.lane_env)  # the cluster's own (e.g. a tuned VLLM_CPU_KVCACHE_SPACE)
    # vLLM's API process gives its engine 600 s by default, less than a warm two-node load of a 428B
    # model: the tool's own bound on a start (lane_ready_timeout) is vLLM's unless the lane sets one.
    env = {"VLLM_ENGINE_READY_TIMEOUT_S": str(config.lane_ready_timeout), **env}
    if lane.launch == "ray":
        # Ray forwards every rank's lines to the head's log, but folds lines that differ only in
        # numbers ("world_size=2 rank=1" into rank 0's): the start-up checks read each rank's own.
        env = {"RAY_DEDUP_LOGS": "0", **env}
    image = lane_image(lane, config.image, dict(cluster.pins)).ref

    store = f"--object-store-memory={int(lane.ray_object_store_gb * 2**30)}"
    # Ray's workers listen on every address: on the range the firewall names (lanes.ports).
    workers = [f"--min-worker-port={RAY_WORKER_PORTS[0]}", f"--max-worker-port={RAY_WORKER_PORTS[1]}"]
    if lane.launch == "ray" and rank > 0:
        # The runner starts workers before the head: each waits for the head's GCS port, then joins.
        join = shlex.join([
            "ray", "start", "--block", f"--address={head}:{lane.ray_port}",
            f"--node-ip-address={node.fabric_ip}", store, *workers, "--disable-usage-stats",
        ])
        wait = f"until (: > /dev/tcp/{head}/{lane.ray_port}) 2>/dev/null; do sleep 1; done"
        command = ["bash", "-c", f"{wait}; exec {join}"]
        return Launch(rank=rank, command=command, serve_args=[], env=env, api=False, image=image)

    args = [
        lane.model,
        "--revision", config.model_revision,
        "--served-model-name", lane.served_name,
        "--tensor-parallel-size", str(lane.tensor_parallel),
        "--pipeline-parallel-size", str(lane.pipeline_parallel),
    ]
    if lane.launch == "mp" and lane.nodes > 1:
        args += [
            "--nnodes", str(lane.nodes), "--node-rank", str(rank),
            "--master-addr", head, "--master-port", str(ports["master_port"]),
        ]
    if lane.launch == "ray":
        args += ["--distributed-executor-backend", "ray"]
    args += ["--gpu-memory-utilization", str(gpu_memory)]
    settings = {**lane.serve, **site}
    if lane.speculative is not None:
        speculative = dict(lane.speculative)
        if lane.drafter:
            speculative.update(model=lane.drafter, revision=config.drafter_revision)
        settings["speculative_config"] = speculative
    args += serve_flags(settings)
    args += ["--host", "0.0.0.0", "--port", str(ports["api_port"])] if rank == 0 else ["--headless"]

    command = [*lane.container.entrypoint, *args]
    if lane.launch == "ray":
        start = shlex.join([
            "ray", "start", "--head", f"--port={lane.ray_port}", f"--node-ip-address={head}", store, *workers,
            "--include-dashboard=false", "--disable-usage-stats",
        ])
        command = ["bash", "-c", f"{start} && exec {shlex.join(command)}"]
    return Launch(rank=rank, command=command, serve_args=args, env=env, api=rank == 0, image=image)


# Docker adds every device node under the folder (uverbs*, rdma_cm, umad*: whatever the node's
# driver made), as vLLM's own run_cluster.sh example and sparkrun pass it; a
# Spark serves one cluster, so no device is kept from another tenant. preflight checks the node
# has its verbs devices before anything starts.
RDMA_DEVICES = "/dev/infiniband"


def container_options(lane: Lane) -> list[str]:
    """``docker run`` options of the lane's container (not name, network, env: the deploy adds them)."""
    c = lane.container
    options: list[str] = []
    if c.gpus is not None:
        options += ["--gpus", c.gpus]
    if c.rdma:
        options += ["--device", RDMA_DEVICES, "--cap-add", "IPC_LOCK"]
    if c.shm_size is not None:
        options += ["--shm-size", c.shm_size]
    options += ["--ipc", c.ipc]
    ulimits = {"memlock": "-1"} if c.rdma else {}  # registered RDMA buffers are pinned memory
    ulimits.update(c.ulimits)
    for name in sorted(ulimits):
        options += ["--ulimit", f"{name}={ulimits[name]}"]
    for mount in c.mounts:
        options += ["-v", mount]
    return options + list(c.extra_args)


def lane_yaml(lane: Lane) -> str:
    """The lane as YAML, in field order, without the keys left at their defaults."""
    data = lane.model_dump(mode="json", exclude_defaults=True)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
