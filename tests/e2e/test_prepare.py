"""
deploys/prepare.py on the simulated pair: converge -> converge again (0 changes) -> verify ->
fault -> converge (heals only what broke) -> verify.
"""

import pytest

INV = "inventory/sim.py"
DEPLOY = "deploys/prepare.py"
HOSTS = {"spark-1", "spark-2"}


@pytest.fixture(scope="module")
def prepared(bed):
    bed.ensure(2)
    first = bed.converge(INV, DEPLOY)
    return bed, first


def test_first_converge_sets_fabric_address_and_mtu(prepared):
    bed, first = prepared
    for host in HOSTS:
        assert any("MTU" in op for op in first.changed[host]), first.changed
        assert any("Fabric address" in op for op in first.changed[host]), first.changed


def test_second_converge_changes_nothing(prepared):
    bed, _ = prepared
    again = bed.converge(INV, DEPLOY)
    assert again.changes == {h: 0 for h in HOSTS}, again.changed


def test_verify_passes(prepared):
    bed, _ = prepared
    result = bed.verify(INV)
    assert result.returncode == 0, result.output[-3000:]


FAULTS = {
    "address deleted": ("spark-1", "ip addr del 10.213.1.1/24 dev enp1s0f0np0", {"Fabric address"}),
    "MTU back to 1500": ("spark-2", "ip link set enp1s0f0np0 mtu 1500", {"MTU"}),
    "worker rebooted": ("spark-2", None, {"MTU", "Fabric address"}),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_is_seen_then_healed_by_one_converge(prepared, fault):
    bed, _ = prepared
    host, command, touched = FAULTS[fault]
    if command:
        bed.node(host, command)
    else:
        bed.reboot(host)
    broken = bed.verify(INV)
    assert broken.returncode != 0 and broken.failed_on(host), broken.output[-3000:]

    heal = bed.converge(INV, DEPLOY)
    assert heal.changed_hosts() == {host}, heal.changed
    assert {word for word in touched if any(word in op for op in heal.changed[host])} == touched

    healed = bed.verify(INV)
    assert healed.returncode == 0, healed.output[-3000:]
    assert bed.converge(INV, DEPLOY).changes == {h: 0 for h in HOSTS}
