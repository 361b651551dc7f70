"""
The lane on its cluster (``cluster_lane``): one value, built once, holding what its consumers used to
derive each on its own (served name, ports, image, GMU, mods, every rank's plan, the digest).
"""

from __future__ import annotations

import pytest

from sparkinfra import lanes, serving
from sparkinfra.cluster_lane import cluster_lane
from sparkinfra.run import load_files
from spark_cluster import load_cluster

NO_LOCK = "lock_file=tests/unit/fixtures/none.lock.yaml"  # not the bed's lock


@pytest.fixture(scope="module")
def sim():
    _, settings = load_files("inventory/sim.py", [NO_LOCK])
    [cluster] = settings.clusters.values()
    return cluster


def test_the_value_is_what_each_consumer_derived(sim):
    on = cluster_lane(sim)
    lane = lanes.find_lane(sim.config.lane)
    plans = serving.rank_plans(lane, sim)
    assert on.lane == lane and on.plans == tuple(plans) and on.digest == plans[0].digest
    assert on.served_name == (lane.served_model_name or lane.model) == plans[0].served_model_name
    assert (on.api_port, on.master_port) == tuple(lanes.effective_ports(lane, sim)[k] for k in ("api_port", "master_port"))
    assert on.image == lanes.lane_image(lane, sim.config.image, dict(sim.pins)).ref
    assert on.api_url == f"http://{sim.head.ssh_host}:{on.api_port}"
    assert on.gmu == lane.gpu_memory_utilization
    assert [on.plan(node.name).rank for node in sim.nodes] == [0, 1]


def test_the_clusters_gmu_is_the_values_and_every_ranks(tmp_path):
    _, settings = load_files("inventory/sim.py", [NO_LOCK, "gpu_memory_utilization=0.61"])
    [cluster] = settings.clusters.values()
    on = cluster_lane(cluster)
    assert on.gmu == 0.61
    for plan in on.plans:
        command = list(plan.command)
        assert command[command.index("--gpu-memory-utilization") + 1] == "0.61"


def test_a_given_lane_and_none(sim, tmp_path):
    other = lanes.find_lane("sim-b")
    assert cluster_lane(sim, other).lane == other
    assert cluster_lane(load_cluster(tmp_path)) is None  # its settings name no lane
