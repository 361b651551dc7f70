"""Four nodes behind the bed's switch: prepare converges, is idempotent, verifies; a pulled cable fails preflight (runs last)."""

INV = "inventory/sim4.py"
HOSTS = {f"spark-{i}" for i in range(1, 5)}


def test_quad_serve_converges_and_verifies(bed):
    bed.ensure(4)
    first = bed.converge(INV, "deploys/serve.py")
    assert first.changed_hosts() == HOSTS
    assert bed.converge(INV, "deploys/serve.py").changes == {h: 0 for h in HOSTS}
    result = bed.verify(INV)
    assert result.returncode == 0, result.output[-3000:]
    gids = {h: bed.node(h, "grep NCCL_IB_GID_INDEX /etc/sparkinfra/nccl.env").stdout.strip()[-1] for h in sorted(HOSTS)}
    assert gids == {"spark-1": "3", "spark-2": "5", "spark-3": "3", "spark-4": "5"}


def test_pulled_cable_fails_preflight_on_that_node(bed):
    bed.ensure(4)
    import sparkbed as simbed

    simbed.cable("spark-3", plugged=False)
    try:
        run = bed.converge(INV, "deploys/preflight.py", check=False)
    finally:
        simbed.cable("spark-3", plugged=True)
    assert run.returncode != 0
    assert "[spark-3] preflight FAIL fabric  enp1s0f0np0 up but no carrier" in run.stderr, run.stderr[-2000:]
    assert "[spark-2] preflight PASS fabric" in run.stderr
