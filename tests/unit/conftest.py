"""Fixtures the unit tests share."""

import pytest
from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state

from sparkinfra import remote
from spark_cluster import DRAFTER_REVISION, MODEL_REVISION, SIM_REVISION, load_cluster


@pytest.fixture
def nothing_connects(monkeypatch):
    """The operator's tools may not reach any node here: ``remote.connect`` fails the test."""

    def connect(*args):
        raise AssertionError("connected")

    monkeypatch.setattr(remote, "connect", connect)


@pytest.fixture(autouse=True)
def pyinfra_context_as_it_was():
    """pyinfra's context (state, host, config) as before each test: its ``use`` restores nothing
    when its body raises, so a test whose operation raised left the next tests a fake state."""
    contexts = (ctx_state, ctx_host, ctx_config, ctx_inventory)
    before = [c.get() for c in contexts]
    yield
    for c, value in zip(contexts, before):
        c.set(value)



@pytest.fixture(scope="session")
def cluster_of(tmp_path_factory):
    """A cluster (built as a run builds it) for a lane: its size, its model and drafter staged."""
    root = tmp_path_factory.mktemp("lane-clusters")
    made = {}

    def make(lane, nodes: int | None = None):
        count = nodes or lane.nodes
        sim = lane.model.startswith("sparkbed/")
        key = (count, sim, lane.model if not sim else "", lane.drafter or "")
        if key not in made:
            name = "sim" if sim else {2: "pair", 4: "quad", 8: "oct"}.get(count, f"c{count}")
            subnet = "10.213.1" if sim else "192.168.192"
            hosts = None if (name == "pair") else [
                (f"spark-{i + 1}", {"rank": i, "fabric_ip": f"{subnet}.{i + 1}"}) for i in range(count)
            ]
            group = {
                "cluster": name,
                "fabric_subnet": f"{subnet}.0/24",
                "model": "sparkbed/tiny-llama" if sim else lane.model,
                "model_revision": SIM_REVISION if sim else MODEL_REVISION,
                "drafter": lane.drafter or "",
                "drafter_revision": DRAFTER_REVISION,
            }
            made[key] = load_cluster(root, group, hosts, name)
        return made[key]

    return make
