"""
deploys/prepare.py on the simulated pair: converge -> converge again (0 changes) -> verify ->
fault -> verify sees it -> one converge heals only what broke -> verify.
"""

import re

import pytest

import sparkbed as simbed

INV = "inventory/sim.py"
DEPLOY = "deploys/prepare.py"
HOSTS = {"spark-1", "spark-2"}
ENV = "/etc/sparkinfra/nccl.env"
ONLY_PREPARE = ("--ignore", "tests/verify/test_stage.py", "--ignore", "tests/verify/test_lane.py")  # nothing staged or served here


@pytest.fixture(scope="module")
def prepared(bed):
    bed.fresh(2)
    first = bed.converge(INV, DEPLOY)
    return bed, first


def test_first_converge_prepares_every_node(prepared):
    bed, first = prepared
    for host in HOSTS:
        for step in ("MTU", "Fabric address", "come back at boot", "NCCL 2.30.7 is pinned", "NCCL environment"):
            assert any(step in op for op in first.changed[host]), (host, step, first.changed[host])
    assert any("Fabric SSH key" in op for op in first.changed["spark-1"])
    assert any("authorized for spark2" in op for op in first.changed["spark-2"])
    for host in HOSTS:  # the bed's gpu_clock_cap, through its nvidia-smi stand-in
        assert any("GPU clock is locked to 200,2150 MHz" in op for op in first.changed[host]), first.changed[host]
        assert bed.node(host, "cat /run/sparkbed/gpu-locked-clocks").stdout.strip() == "200,2150"


def test_second_converge_changes_nothing(prepared):
    bed, _ = prepared
    again = bed.converge(INV, DEPLOY)
    assert again.changes == {h: 0 for h in HOSTS}, again.changed


def test_a_no_op_converge_reads_each_fact_once_per_node(prepared):
    bed, _ = prepared  # gathered: a fact two operations ask for is one command
    ran = bed.commands(INV, DEPLOY)
    assert set(ran) == HOSTS
    assert {h: [c for c, n in commands.items() if n > 1] for h, commands in ran.items()} == {h: [] for h in HOSTS}


def test_verify_passes_and_measures_the_fabric(prepared):
    """With --fabric-bandwidth, RDMA writes (the bed's stand-in: a TCP stream over the veth, on both
    HCAs at once, each side at its own GID index) reach fabric_min_gbps."""
    bed, _ = prepared
    result = bed.verify(INV, *ONLY_PREPARE, "--fabric-bandwidth", "-s")
    assert result.returncode == 0, result.output[-3000:]
    figure = re.search(r"fabric bandwidth from spark-1: spark-2 ([\d.]+) Gb/s \(rocep1s0f0 [\d.]+, roceP2p1s0f0 [\d.]+\)",
                       result.output)
    assert figure and float(figure[1]) >= 1, result.output[-3000:]
    print(figure[0])


def test_gid_index_is_discovered_per_node(prepared):
    """The stand-in table puts the IPv4 RoCE v2 row at 3 on spark-1 and 5 on spark-2."""
    bed, _ = prepared
    found = {h: bed.node(h, f"grep NCCL_IB_GID_INDEX {ENV}").stdout.strip() for h in sorted(HOSTS)}
    assert found == {"spark-1": "NCCL_IB_GID_INDEX=3", "spark-2": "NCCL_IB_GID_INDEX=5"}


def test_persistent_fabric_survives_a_reboot(prepared):
    """Rebooted worker: the fabric comes back by itself; verify passes; converge changes nothing."""
    bed, _ = prepared
    bed.reboot("spark-2")
    result = bed.verify(INV, *ONLY_PREPARE)
    assert result.returncode == 0, result.output[-3000:]
    assert bed.node("spark-2", "cat /run/sparkbed/gpu-locked-clocks").stdout.strip() == "200,2150"  # the unit's, at boot
    assert bed.converge(INV, DEPLOY).changes == {h: 0 for h in HOSTS}


FAULTS = {
    # fault: (host, command run as root in the node, ops the heal must change, a failing check)
    "address deleted": ("spark-1", "ip addr del 10.213.1.1/24 dev enp1s0f0np0", {"Fabric address"}, "test_fabric_address"),
    "MTU back to 1500": ("spark-2", "ip link set enp1s0f0np0 mtu 1500", {"MTU"}, "test_fabric_mtu"),
    "env file edited by hand": (
        "spark-2", f"sed -i 's/^NCCL_IB_GID_INDEX=.*/NCCL_IB_GID_INDEX=3/; s/^NCCL_NET=.*/NCCL_NET=Socket/' {ENV}",
        {"NCCL environment"}, "test_nccl_env_has_this_nodes_gid_index",
    ),
    "GID index moved (address re-added after an IPv6 one)": (
        "spark-1",
        "ip addr del 10.213.1.1/24 dev enp1s0f0np0; sleep 0.3; ip addr add fd00:213:1::1/64 dev enp1s0f0np0 nodad;"
        " sleep 0.3; ip addr add 10.213.1.1/24 dev enp1s0f0np0; sleep 0.5",
        {"NCCL environment"}, "test_nccl_env_has_this_nodes_gid_index",
    ),
    "mesh key removed from the worker": (
        "spark-2", "sed -i '/sparkinfra-fabric/d' /home/spark2/.ssh/authorized_keys",
        {"Head's fabric key is authorized"}, "test_head_reaches_every_worker",
    ),
    "wrong NCCL on a node": (
        "spark-2", None, {"NCCL 2.30.7 is pinned"}, "test_nccl_pin_reports_the_wanted_version",
    ),
    "stale lane container": (
        "spark-2",
        "d=$(mktemp -d); cp -L --parents /usr/bin/true $(ldd /usr/bin/true | grep -o '/[^ ]*') $d;"
        " tar -C $d -c . | docker import - sparkbed-probe:1 >/dev/null;"
        " docker create --name vllm_node sparkbed-probe:1 /usr/bin/true >/dev/null; rm -rf $d",
        {"No stale vllm_node"}, "test_no_stale_lane_container",
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_is_seen_then_healed_by_one_converge(prepared, fault):
    bed, _ = prepared
    host, command, touched, check = FAULTS[fault]
    if command:
        bed.node(host, command)
    else:  # the bed's other stand-in NCCL, reporting 2.27.3, in place of the pin
        nccl = simbed.node_dir(host) / "root/opt/nccl/lib/libnccl.so.2"
        nccl.write_bytes(simbed.nccl_standin("2.27.3").read_bytes())

    broken = bed.verify(INV, *ONLY_PREPARE)
    assert broken.returncode != 0 and any(check in t for t in broken.failed), broken.output[-3000:]
    if fault == "wrong NCCL on a node":
        assert "reports NCCL 2.27.3, settings want 2.30.7" in broken.output

    heal = bed.converge(INV, DEPLOY)
    assert heal.changed_hosts() == {host}, heal.changed
    changed = heal.changed[host]
    assert all(any(word in op for op in changed) for word in touched), changed
    assert len(changed) == len(touched), f"the heal changed more than the fault broke: {changed}"

    healed = bed.verify(INV, *ONLY_PREPARE)
    assert healed.returncode == 0, healed.output[-3000:]
    assert bed.converge(INV, DEPLOY).changes == {h: 0 for h in HOSTS}


def test_wrong_nccl_without_an_upload_is_refused_naming_both_versions(prepared):
    bed, _ = prepared
    nccl = simbed.node_dir("spark-2") / "root/opt/nccl/lib/libnccl.so.2"
    nccl.write_bytes(simbed.nccl_standin("2.27.3").read_bytes())
    run = bed.converge(INV, DEPLOY, "nccl_library_upload=", check=False)
    assert run.returncode != 0
    assert "spark-2: /opt/nccl/lib/libnccl.so.2 reports NCCL 2.27.3, settings want 2.30.7" in run.stderr
    assert bed.converge(INV, DEPLOY).changed_hosts() == {"spark-2"}  # the upload puts the pin back


def test_reboot_without_persistence_is_healed_by_converge(prepared):
    """With fabric_persist off, sparkinfra's boot config goes; a reboot then loses the fabric."""
    bed, _ = prepared
    off = "fabric_persist=false"
    assert bed.converge(INV, DEPLOY, off).changed_hosts() == HOSTS  # our unit removed everywhere
    bed.reboot("spark-2")
    broken = bed.verify(INV, "--data", off, *ONLY_PREPARE)
    assert broken.returncode != 0 and broken.failed_on("spark-2"), broken.output[-3000:]
    heal = bed.converge(INV, DEPLOY, off)
    assert heal.changed_hosts() == {"spark-2"}, heal.changed
    assert bed.verify(INV, "--data", off, *ONLY_PREPARE).returncode == 0
    assert bed.converge(INV, DEPLOY).changed_hosts() == HOSTS  # persistence back on


def test_page_caches_are_dropped_on_every_node(prepared):
    bed, _ = prepared
    for host in HOSTS:
        bed.node(host, "echo 0 > /proc/sys/vm/drop_caches")
    bed.converge(INV, "tests/e2e/deploys/drop_caches.py")
    for host in HOSTS:
        assert bed.node(host, "cat /usr/local/lib/sparkbed/drop_caches").stdout.strip() == "3"
