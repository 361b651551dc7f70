"""
One value for "this lane on this cluster": what every consumer of a cluster's lane reads (the lane's
steps, ``lanes show``, the bench, the tuning, ``status``, ``chat``), built once by ``cluster_lane``
from the settings and the lane, never re-derived beside it.

.. code:: python

    here = cluster_lane(cluster)      # None: the cluster names no lane
    here.served_name, here.api_port, here.digest, here.plan(host.name)
"""

from __future__ import annotations

from dataclasses import dataclass

from . import lanes, serving
from .lanes import Lane, Mod
from .settings import Cluster


@dataclass(frozen=True)
class ClusterLane:
    """A lane on a cluster, as its settings render it."""

    cluster: Cluster
    lane: Lane
    served_name: str  # the model's name in the API: the lane's served_model_name, else its model
    api_port: int  # the lane's, else the cluster's
    master_port: int  # torch.distributed's rendezvous on the head: the lane's, else the cluster's
    image: str  # the lane's image reference, as the lock pins it (else the cluster's image)
    gmu: float  # the GPU memory utilization it starts with: the cluster's setting, else the lane's
    mods: tuple[Mod, ...]  # its mods, groups expanded, in the order each rank applies them
    plans: tuple[serving.RankPlan, ...]  # every rank's, by rank
    digest: str  # one hash of every rank's plan: any change restarts the lane

    def plan(self, node_name: str) -> serving.RankPlan:
        """The plan of node ``node_name``'s rank."""
        return next(p for p in self.plans if p.node.name == node_name)

    @property
    def api_url(self) -> str:
        """The head's API, as the controller reaches it."""
        return f"http://{self.cluster.head.ssh_host}:{self.api_port}"


def cluster_lane(cluster: Cluster, lane: Lane | None = None) -> ClusterLane | None:
    """
    ``lane`` (by default the one the cluster's settings name) on ``cluster``; None when the settings
    name none and none is given. Raises ``LaneError`` for a lane that cannot be found or rendered,
    ``ModsNotFetched`` for a build repository's mods not fetched yet.
    """
    if lane is None:
        if not cluster.config.lane:
            return None
        lane = lanes.find_lane(cluster.config.lane)
    plans = tuple(serving.rank_plans(lane, cluster))
    ports = lanes.effective_ports(lane, cluster)
    return ClusterLane(
        cluster=cluster,
        lane=lane,
        served_name=lane.served_name,
        api_port=ports["api_port"],
        master_port=ports["master_port"],
        image=plans[0].image,
        gmu=lanes.utilization(lane, cluster),
        mods=tuple(lanes.lane_mods(lane, dict(cluster.pins))),
        plans=plans,
        digest=plans[0].digest,
    )
