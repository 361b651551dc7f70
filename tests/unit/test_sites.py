"""
The shipped sites (``inventory/<site>.py`` + ``group_data/<site>.py``): each is read as a converge
reads it with no ``--data`` (settings checked, the lock's pins applied where it has any), serves its
seed's lane, passes ``python -m sparkinfra lanes show`` (exit 0) and the controller's vLLM check;
the pair's other lanes are one ``--data lane=`` away, and seed 002's AWQ lane on the quad is its lane,
model and drafter away. Connects to nothing.
"""

from __future__ import annotations

import pytest

from sparkinfra import lanes
from sparkinfra.cli.lanes import main
from sparkinfra.lanes.images import images_dir
from sparkinfra.run import load_files

# site: (nodes, its lane, the lane's image recipe)
SITES = {
    "pair": (2, "pair-a-balanced", "minimax-m3-b12x"),
    "quad": (4, "quad-nvfp4", "minimax-m3-nvfp4-chthonic"),
    "oct": (8, "oct-awq-eagle3", "m3-awq-pr45744"),
}
# Other lanes of a site, and the data they need.
OTHER = [
    ("pair", ("lane=pair-b-context",)),
    ("pair", ("lane=pair-c-speed",)),
    ("quad", ("lane=quad-awq-eagle3", "model=cyankiwi/MiniMax-M3-AWQ-INT4", "drafter=Inferact/MiniMax-M3-EAGLE3")),
]


def _cluster(site: str, *data: str):
    _, settings = load_files(f"inventory/{site}.py", data)
    [cluster] = settings.clusters.values()
    return cluster


@pytest.fixture(scope="module")
def vllm_verdicts(tmp_path_factory) -> dict[tuple, list[str]]:
    """The controller's vLLM check (what ``refuse_invalid`` runs after ``check_lane``) of every site's
    lane and of the other lanes, in one process (importing vLLM costs seconds): (site, data) -> errors."""
    cases = [(site, ()) for site in SITES] + OTHER
    clusters = [_cluster(site, *data) for site, data in cases]
    found = [lanes.find_lane(cluster.config.lane) for cluster in clusters]
    results = lanes.check_with_vllm([lanes.vllm_request(lane, cluster) for lane, cluster in zip(found, clusters)],
                                    cache=tmp_path_factory.mktemp("vllm-check-cache"))
    return {case: [m for m in lanes.vllm_errors(lane, result) if not m.startswith(lanes.NO_VLLM)]
            for case, lane, result in zip(cases, found, results)}


@pytest.mark.parametrize("site", SITES)
def test_the_site_passes_the_settings_check_and_serves_its_seeds_lane(site):
    nodes, lane, recipe = SITES[site]
    cluster = _cluster(site)
    assert cluster.name == site and len(cluster.nodes) == nodes
    assert [node.rank for node in cluster.nodes] == list(range(nodes))
    assert cluster.config.lane == lane
    found = lanes.find_lane(lane)
    assert found.image.recipe == recipe and lanes.load_recipe(images_dir(found) / recipe).description
    assert lanes.check_lane(found, cluster) == []


@pytest.mark.parametrize("site", SITES)
def test_lanes_show_exits_0_with_no_data(site, capsys):
    assert main(["show", "--inventory", f"inventory/{site}.py"]) == 0
    out = capsys.readouterr().out
    nodes, lane, _ = SITES[site]
    assert out.startswith(f"Lane {lane} on cluster {site} ({nodes} nodes), plan ")
    assert "REFUSED" not in out
    assert f"\nrank {nodes - 1} on " in out


@pytest.mark.parametrize("site", SITES)
def test_the_controllers_vllm_check_accepts_the_sites_lane(site, vllm_verdicts):
    assert vllm_verdicts[(site, ())] == []


@pytest.mark.parametrize("site, data", OTHER, ids=[data[0] for _, data in OTHER])
def test_the_sites_other_lanes_are_data_away(site, data, vllm_verdicts):
    cluster = _cluster(site, *data)
    lane = lanes.find_lane(cluster.config.lane)
    assert lane.name == data[0].split("=", 1)[1]
    assert lanes.check_lane(lane, cluster) == [] and vllm_verdicts[(site, data)] == []


def test_the_lanes_nccl_changes_follow_their_seeds():
    """Seed 001 serves on NCCL's stock protocol (LL and 2 channels lose 5-9 % on M3); seed 004's RoCE
    tuning is its NVFP4 lane's, not every lane's."""
    for name in ("pair-a-balanced", "pair-b-context", "pair-c-speed"):
        lane = lanes.find_lane(name)
        assert lane.nccl_env == {"NCCL_PROTO": None, "NCCL_MAX_NCHANNELS": None}, name
        assert lane.mods_from == "image" and lane.mods, name
    nvfp4 = lanes.find_lane("quad-nvfp4").nccl_env
    assert nvfp4["NCCL_IB_QPS_PER_CONNECTION"] == "8" and nvfp4["NCCL_NET_GDR_LEVEL"] == "LOC"
    for name in ("quad-awq-eagle3", "oct-awq-eagle3"):
        assert lanes.find_lane(name).nccl_env == {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}, name
