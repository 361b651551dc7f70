"""
Scale (runs last): two pairs in one inventory, each cluster its own head and ports, converge in one
run; on those four nodes behind the switch, a pulled cable fails preflight on that node only; eight
nodes serve (no lane: serving stays on the pair, 2 cores) and verify (``make test-eight``: CI keeps
the bed at 2 and 4 nodes).
"""

import re

import pytest

import sparkbed as simbed

DEPLOYS = ("deploys/prepare.py", "deploys/stage.py")

# Four nodes (and the pulled cable on them): `make test-all`, not CI's `make test` (its 20 minutes).
pytestmark = pytest.mark.long


def test_two_pairs_in_one_inventory_converge_in_one_run(bed):
    bed.fresh(4)
    inventory, hosts = "inventory/sim_pairs.py", {f"spark-{i}" for i in range(1, 5)}
    prepared = bed.converge(inventory, "deploys/prepare.py")
    assert prepared.changed_hosts() == hosts, prepared.changed
    staged = bed.converge(inventory, "deploys/stage.py")  # each head serves its own pair
    assert {"spark-1", "spark-3"} <= staged.changed_hosts(), staged.changed
    for worker in ("spark-2", "spark-4"):  # a worker changes by its pull alone (none if it had the model)
        assert all("is pulled from the head" in op for op in staged.changed[worker]), staged.changed
    for deploy in DEPLOYS:
        again = bed.converge(inventory, deploy)
        assert again.changes == {h: 0 for h in hosts}, (deploy, again.changed)
    result = bed.verify(inventory)
    assert result.returncode == 0, result.output[-3000:]
    # Each pair's head meshes only with its own worker.
    assert "10.213.1.2" in bed.node("spark-1", "cat /root/.ssh/config").stdout
    assert "10.213.1.4" not in bed.node("spark-1", "cat /root/.ssh/config").stdout
    assert "10.213.1.4" in bed.node("spark-3", "cat /root/.ssh/config").stdout


def test_pulled_cable_fails_preflight_on_that_node(bed):
    bed.ensure(4)  # the four nodes behind the switch, as the test before left them
    simbed.cable("spark-3", plugged=False)
    try:
        run = bed.converge("inventory/sim4.py", "deploys/preflight.py", check=False)
    finally:
        simbed.cable("spark-3", plugged=True)
    assert run.returncode != 0
    assert "[spark-3] preflight FAIL fabric  enp1s0f0np0 up but no carrier" in run.stderr, run.stderr[-2000:]
    assert "[spark-2] preflight PASS fabric" in run.stderr


@pytest.mark.eight_nodes  # not in `make test` (CI keeps the bed at 2 and 4 nodes): `make test-eight`
def test_eight_nodes_of_another_sites_naming_serve_and_verify(bed):
    """Eight nodes whose fabric port, HCAs and users are not the seeds' (inventory/sim8.py)."""
    bed.fresh(8, shape="site2")
    inventory, hosts = "inventory/sim8.py", {f"spark-{i}" for i in range(1, 9)}
    first = bed.converge(inventory, "deploys/serve.py")
    assert first.changed_hosts() == hosts, first.changed
    assert any("Every worker has the head's" in op for op in first.changed["spark-1"]), first.changed["spark-1"]
    again = bed.converge(inventory, "deploys/serve.py")
    assert again.changes == {h: 0 for h in hosts}, again.changed
    result = bed.verify(inventory)
    assert result.returncode == 0, result.output[-3000:]
    env = [bed.node(f"spark-{i}", "cat /etc/sparkinfra/nccl.env").stdout for i in range(1, 9)]
    assert {re.search(r"^NCCL_IB_GID_INDEX=(\d+)$", e, re.M)[1] for e in env} == {"3", "5"}, env
    # both twins of the cabled f1 port, found on each node: the fabric interface's HCA first, then its twin's
    assert all("NCCL_IB_HCA=mlx5_3,mlx5_1\n" in e and "NCCL_SOCKET_IFNAME=enP2p1s0f1np1\n" in e for e in env), env
    assert "dgx8" in bed.node("spark-1", "cat /root/.ssh/config").stdout  # the mesh maps each worker's user
