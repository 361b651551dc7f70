"""
Scale (runs last): two pairs in one inventory, each cluster its own head and ports, converge in one
run; eight nodes behind the switch prepare, stage and verify. Serving stays on the pair (2 cores).
"""


DEPLOYS = ("deploys/prepare.py", "deploys/stage.py")


def _converge_verify(bed, inventory, hosts, heads):
    """prepare changes every node; stage's changes are the heads' (they send to their workers)."""
    for deploy, changing in zip(DEPLOYS, (hosts, heads)):
        first = bed.converge(inventory, deploy)
        assert first.changed_hosts() == changing, (deploy, first.changed)
    for deploy in DEPLOYS:
        again = bed.converge(inventory, deploy)
        assert again.changes == {h: 0 for h in hosts}, (deploy, again.changed)
    result = bed.verify(inventory)
    assert result.returncode == 0, result.output[-3000:]


def test_two_pairs_in_one_inventory_converge_in_one_run(bed):
    bed.fresh(4)
    _converge_verify(bed, "inventory/sim_pairs.py", {f"spark-{i}" for i in range(1, 5)}, {"spark-1", "spark-3"})
    # Each pair's head meshes only with its own worker.
    assert "10.213.1.2" in bed.node("spark-1", "cat /root/.ssh/config").stdout
    assert "10.213.1.4" not in bed.node("spark-1", "cat /root/.ssh/config").stdout
    assert "10.213.1.4" in bed.node("spark-3", "cat /root/.ssh/config").stdout


def test_eight_nodes_prepare_stage_and_verify(bed):
    bed.fresh(8)
    _converge_verify(bed, "inventory/sim8.py", {f"spark-{i}" for i in range(1, 9)}, {"spark-1"})
    gids = {bed.node(f"spark-{i}", "grep NCCL_IB_GID_INDEX /etc/sparkinfra/nccl.env").stdout.strip()[-1] for i in range(1, 9)}
    assert gids == {"3", "5"}, gids
