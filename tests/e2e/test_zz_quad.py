"""Four nodes behind the bed's switch: prepare converges, is idempotent, and verifies (runs last)."""

INV = "inventory/sim4.py"
DEPLOY = "deploys/prepare.py"


def test_quad_prepare_converges_and_verifies(bed):
    bed.ensure(4)
    hosts = {f"spark-{i}" for i in range(1, 5)}
    first = bed.converge(INV, DEPLOY)
    assert first.changed_hosts() == hosts
    assert bed.converge(INV, DEPLOY).changes == {h: 0 for h in hosts}
    result = bed.verify(INV)
    assert result.returncode == 0, result.output[-3000:]
    assert "12 passed" in result.output or "passed" in result.output
