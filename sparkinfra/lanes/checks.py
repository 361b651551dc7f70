"""
A lane against a cluster: what keeps it from serving there (nodes, GPUs, models, mods, ports).
"""

from __future__ import annotations

from pathlib import Path

from ..settings import Cluster
from .images import lane_image
from .mods import ModsNotFetched, lane_mods
from .schema import Lane, LaneError, find_lane, lane_source



def effective_ports(lane: Lane, cluster: Cluster) -> dict[str, int]:
    """The ports a lane uses on the head: the lane's, else the cluster's settings."""
    config = cluster.config
    ports = {
        "api_port": lane.api_port or config.api_port,
        "master_port": lane.master_port or config.master_port,
    }
    if lane.launch == "ray":
        ports["ray_port"] = lane.ray_port
    return ports


def check_lane(lane: Lane, cluster: Cluster) -> list[str]:
    """What keeps ``lane`` from serving on ``cluster`` (empty: nothing). Each message names the lane's
    file and the cluster's setting."""
    where = lane_source(lane)
    config = cluster.config
    problems = []
    count = len(cluster.nodes)
    if lane.nodes != count:
        problems.append(f"{where}: nodes is {lane.nodes}, but cluster {cluster.name} has {count} node(s)")
    gpus = lane.tensor_parallel * lane.pipeline_parallel
    if gpus != count:
        problems.append(
            f"{where}: tensor_parallel × pipeline_parallel is {gpus}, but cluster {cluster.name} has {count} "
            f"GPU(s) (one GB10 per node)"
        )
    if lane.model != config.model:
        problems.append(
            f"{where}: model {lane.model!r} is not the setting model of cluster {cluster.name} "
            f"({config.model!r}): that is what is staged on the nodes"
        )
    if lane.drafter and lane.drafter != config.drafter:
        staged = repr(config.drafter) if config.drafter else "none"
        problems.append(
            f"{where}: drafter {lane.drafter!r} is not the setting drafter of cluster {cluster.name} ({staged})"
        )
    if lane.image is not None and not isinstance(lane.image, str):
        try:
            lane_image(lane, config.image)
        except LaneError as exc:
            problems.append(f"{where}: image recipe {lane.image.recipe!r}: {exc}")
    try:
        lane_mods(lane, dict(cluster.pins))
    except ModsNotFetched:
        pass  # the build repository's mods: checked once the converge has fetched them
    except LaneError as exc:
        problems.append(str(exc))
    ports = effective_ports(lane, cluster)
    ports_seen: dict[int, str] = {}
    for key, port in ports.items():
        if port in ports_seen:
            problems.append(f"{where}: {key} {port} is also the {ports_seen[port]} (lane or cluster setting)")
        ports_seen.setdefault(port, key)
    if config.stage_port in ports_seen:
        problems.append(
            f"{where}: {ports_seen[config.stage_port]} {config.stage_port} is the cluster's setting stage_port"
        )
    return problems


def lane_problems(cluster: Cluster, project: str | Path | None = None) -> list[str]:
    """What keeps the cluster's lane setting from serving on it: a missing or bad file, or ``check_lane``."""
    try:
        return check_lane(find_lane(cluster.config.lane, project=project), cluster)
    except LaneError as exc:
        return [str(exc)]
