"""
deploys/prepare.py on the simulated pair (shape gb10: two twins per port, each its own netdev, RDMA
device and GID table, the cable on f0): converge -> converge again (0 changes) -> verify -> fault ->
verify sees it, naming the twin or the build -> one converge heals only what broke -> verify
(faults that touch apart: broken together, healed by one converge).
"""

import hashlib
import json
import re
from pathlib import Path

import pytest

import sparkbed as simbed

INV = "inventory/sim.py"
DEPLOY = "deploys/prepare.py"
HOSTS = {"spark-1", "spark-2"}
ENV = "/etc/sparkinfra/nccl.env"
# nothing staged or served here
ONLY_PREPARE = ("--ignore", "tests/verify/test_stage.py", "--ignore", "tests/verify/test_lane.py")


@pytest.fixture(scope="module")
def prepared(bed):
    bed.fresh(2)
    first = bed.converge(INV, DEPLOY)
    return bed, first


def test_first_converge_prepares_every_node(prepared):
    bed, first = prepared
    for host in HOSTS:
        for step in ("Fabric port enp1s0f0np0 is up with MTU 4200", "Fabric twin enP2p1s0f0np0 is up with MTU 4200",
                     "Fabric address", "Twin address", "enp1s0f0np0 and enP2p1s0f0np0 come back at boot",
                     "NCCL environment of this node (rocep1s0f0, roceP2p1s0f0)"):
            assert any(step in op for op in first.changed[host]), (host, step, first.changed[host])
    head = first.changed["spark-1"]  # the pin: fetched once by the head, copied to the worker
    assert any("The head holds nvidia-nccl-cu13 2.30.7" in op for op in head), head
    assert any("Every worker holds the head's /opt/nccl/lib/libnccl.so.2" in op for op in head), head
    assert simbed.nccl_index_downloads() == 1
    # The lock (a fresh bed's: none yet): the model's main and the wheel, resolved on the head, written.
    assert f"--> lock: sim: pinned model: sparkbed/tiny-llama main -> {simbed.SIM_REVISION}" in first.stderr, \
        first.stderr[-3000:]
    assert re.search(r"^--> lock: sim: pinned nccl: \S+ 2\.30\.7 -> [0-9a-f]{64}", first.stderr, re.M), first.stderr[-3000:]
    assert "model:\n  source: sparkbed/tiny-llama\n  ref: main\n" in simbed.lock_path("sim").read_text()
    assert any("Fabric SSH key" in op for op in first.changed["spark-1"])
    assert any("authorized for spark2" in op for op in first.changed["spark-2"])
    for host in HOSTS:  # the bed's gpu_clock_cap, through its nvidia-smi stand-in
        assert any("GPU clock is locked to 200,2150 MHz" in op for op in first.changed[host]), first.changed[host]
        assert bed.node(host, "cat /run/sparkbed/gpu-locked-clocks").stdout.strip() == "200,2150"


def test_second_converge_changes_nothing_and_fetches_nothing(prepared):
    bed, _ = prepared
    again = bed.converge(INV, DEPLOY)
    assert again.changes == {h: 0 for h in HOSTS}, again.changed
    assert simbed.nccl_index_downloads() == 1
    assert "--> lock:" not in again.stderr  # the lock pins everything: nothing resolved


def test_the_pin_is_the_wheels_library_on_every_node(prepared):
    """The x86_64 wheel of 2.30.7 (the bed's nodes' platform; the index also has an aarch64 one and
    2.27.3), byte for byte on both nodes, its identity recorded."""
    bed, _ = prepared
    digests = {h: bed.node(h, "sha256sum /opt/nccl/lib/libnccl.so.2").stdout.split()[0] for h in sorted(HOSTS)}
    assert len(set(digests.values())) == 1, digests
    record = json.loads(bed.node("spark-2", "cat /etc/sparkinfra/nccl-pin.json").stdout)
    assert record["sha256"] == digests["spark-1"] and record["version"] == "2.30.7" and record["build_id"]
    assert record["source"]["file"].endswith("manylinux_2_18_x86_64.whl"), record


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
                       result.output)  # both twins, each over its own veth
    assert figure and float(figure[1]) >= 1, result.output[-3000:]
    print(figure[0])


def test_gid_index_is_discovered_per_node_on_both_twins(prepared):
    """Each twin's table from its own netdev: the IPv4 RoCE v2 row is 3 on both of spark-1's, 5 on both
    of spark-2's (a router-advertised IPv6 address took rows 2/3 there); NCCL_IB_HCA names both."""
    bed, _ = prepared
    found = {h: bed.node(h, f"grep -E 'NCCL_IB_(GID_INDEX|HCA)=' {ENV}").stdout.split() for h in sorted(HOSTS)}
    assert found == {"spark-1": ["NCCL_IB_GID_INDEX=3", "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0"],
                     "spark-2": ["NCCL_IB_GID_INDEX=5", "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0"]}
    twin = bed.node("spark-1", "show_gids roceP2p1s0f0 1").stdout
    assert "169.254.1.1" in twin and "10.213.1.1" not in twin, twin  # the twin's own IPv4, never the fabric's


def test_persistent_fabric_survives_a_reboot(prepared):
    """Rebooted worker: the fabric comes back by itself; verify passes; converge changes nothing."""
    bed, _ = prepared
    bed.reboot("spark-2")
    result = bed.verify(INV, *ONLY_PREPARE)
    assert result.returncode == 0, result.output[-3000:]
    assert bed.node("spark-2", "cat /run/sparkbed/gpu-locked-clocks").stdout.strip() == "200,2150"  # the unit's, at boot
    assert bed.converge(INV, DEPLOY).changes == {h: 0 for h in HOSTS}


OTHER_BUILD = "/var/lib/sparkinfra-bed/controller/nccl/2.30.7-other/libnccl.so.2"

FAULTS = {
    # fault: (host, command run as root in the node, ops the heal must change, a failing check,
    #         what the failure names, the host whose operation heals it)
    "address deleted": ("spark-1", "ip addr del 10.213.1.1/24 dev enp1s0f0np0", {"Fabric address"},
                        "test_fabric_address", "", "spark-1"),
    "MTU back to 1500": ("spark-2", "ip link set enp1s0f0np0 mtu 1500", {"Fabric port"},
                         "test_fabric_mtu_on_both_twins", "'enp1s0f0np0': 1500", "spark-2"),
    "twin's MTU back to 1500": ("spark-2", "ip link set enP2p1s0f0np0 mtu 1500", {"Fabric twin"},
                                "test_fabric_mtu_on_both_twins", "'enP2p1s0f0np0': 1500", "spark-2"),
    "twin's address moved into the fabric subnet": (
        "spark-2", "ip addr del 169.254.1.2/16 dev enP2p1s0f0np0; ip addr add 10.213.1.102/24 dev enP2p1s0f0np0",
        {"Twin address"}, "test_twin_has_its_own_address", "twin enP2p1s0f0np0 lacks 169.254.1.2/16", "spark-2"),
    "env file edited by hand": (
        "spark-2", f"sed -i 's/^NCCL_IB_GID_INDEX=.*/NCCL_IB_GID_INDEX=3/; s/^NCCL_NET=.*/NCCL_NET=Socket/' {ENV}",
        {"NCCL environment"}, "test_nccl_env_names_both_twins", "", "spark-2",
    ),
    "GID index moved (address re-added after an IPv6 one)": (
        "spark-1",
        "ip addr del 10.213.1.1/24 dev enp1s0f0np0; sleep 0.3; ip addr add fd00:213:1::1/64 dev enp1s0f0np0 nodad;"
        " sleep 0.3; ip addr add 10.213.1.1/24 dev enp1s0f0np0; sleep 0.5",
        {"NCCL environment"}, "test_nccl_env_names_both_twins",
        "rocep1s0f0 (enp1s0f0np0): row 3 is fd00:0213:0001:0000:0000:0000:0000:0001", "spark-1",
    ),
    "twin's GID row at the index is not IPv4": (
        "spark-2",
        "ip addr del 169.254.1.2/16 dev enP2p1s0f0np0; sleep 0.3; ip addr add fd00:213:2::2/64 dev enP2p1s0f0np0 nodad;"
        " sleep 0.3; ip addr add 169.254.1.2/16 dev enP2p1s0f0np0; sleep 0.5",
        {"NCCL environment"}, "test_nccl_env_names_both_twins",
        "roceP2p1s0f0 (enP2p1s0f0np0): row 5 is fd00:0213:0002:0000:0000:0000:0000:0002", "spark-2",
    ),
    "mesh key removed from the worker": (
        "spark-2", "sed -i '/sparkinfra-fabric/d' /home/spark2/.ssh/authorized_keys",
        {"Head's fabric key is authorized"}, "test_head_reaches_every_worker", "", "spark-2",
    ),
    "wrong NCCL on a node": (
        "spark-2", "2.27.3", {"Every worker holds"}, "test_nccl_pin_reports_the_wanted_version",
        "reports NCCL 2.27.3, settings want 2.30.7", "spark-1",
    ),
    "same NCCL version, another build, on a node": (
        "spark-2", "other", {"Every worker holds"}, "test_the_pin_is_one_build_on_every_node",
        "/opt/nccl/lib/libnccl.so.2 differs", "spark-1",
    ),
    "stale lane container": (
        "spark-2",
        "d=$(mktemp -d); cp -L --parents /usr/bin/true $(ldd /usr/bin/true | grep -o '/[^ ]*') $d;"
        " tar -C $d -c . | docker import - sparkbed-probe:1 >/dev/null;"
        " docker create --name vllm_node sparkbed-probe:1 /usr/bin/true >/dev/null; rm -rf $d",
        {"No stale vllm_node"}, "test_no_stale_lane_container", "", "spark-2",
    ),
}


def _pin_replaced(host: str, by: str) -> None:
    """The node's pin replaced: by the bed's stand-in of another version, or by another build of 2.30.7."""
    nccl = simbed.node_dir(host) / "root/opt/nccl/lib/libnccl.so.2"
    if by == "other":
        source = simbed.compile_nccl_standin("2.30.7", Path(OTHER_BUILD), build_tag="other-build")
    else:
        source = simbed.nccl_standin(by)
    nccl.write_bytes(source.read_bytes())


# Faults that touch apart (other operations, or other nodes) are broken together and healed by one
# converge: each named by verify, each healed by its own operation, nothing else changed. Fewer
# converges, the same proof per fault.
BATCHES = (
    ("address deleted", "MTU back to 1500", "stale lane container", "env file edited by hand"),
    ("twin's MTU back to 1500", "GID index moved (address re-added after an IPv6 one)", "mesh key removed from the worker"),
    ("twin's address moved into the fabric subnet", "wrong NCCL on a node"),
    ("twin's GID row at the index is not IPv4", "same NCCL version, another build, on a node"),
)


def test_every_fault_is_in_one_batch():
    assert sorted(f for batch in BATCHES for f in batch) == sorted(FAULTS)


@pytest.mark.parametrize("faults", BATCHES, ids="; ".join)
def test_faults_are_seen_then_healed_by_one_converge(prepared, faults):
    bed, _ = prepared
    for fault in faults:
        host, command, *_ = FAULTS[fault]
        if command in ("2.27.3", "other"):
            _pin_replaced(host, command)
        else:
            bed.node(host, command)

    broken = bed.verify(INV, *ONLY_PREPARE)
    assert broken.returncode != 0, broken.output[-3000:]
    for fault in faults:
        _, _, _, check, named, _ = FAULTS[fault]
        assert any(check in t for t in broken.failed), (fault, broken.output[-3000:])
        assert named in broken.output, (fault, broken.output[-3000:])

    heal = bed.converge(INV, DEPLOY)
    healers = {FAULTS[f][5] for f in faults}
    assert heal.changed_hosts() == healers, heal.changed
    for healer in healers:
        touched = [word for f in faults if FAULTS[f][5] == healer for word in FAULTS[f][2]]
        changed = heal.changed[healer]
        assert all(any(word in op for op in changed) for word in touched), (touched, changed)
        assert len(changed) == len(touched), f"the heal changed more than the faults broke on {healer}: {changed}"
    if "twin's GID row at the index is not IPv4" in faults:  # the rows differ now: left to NCCL, said
        assert "the IPv4 RoCE v2 rows differ" in heal.stderr and "NCCL_IB_GID_INDEX is left to NCCL" in heal.stderr
        assert "NCCL_IB_GID_INDEX" not in bed.node("spark-2", f"cat {ENV}").stdout
    assert simbed.nccl_index_downloads() == 1  # a worker's pin comes from the head, never the index

    healed = bed.verify(INV, *ONLY_PREPARE)
    assert healed.returncode == 0, healed.output[-3000:]
    assert bed.converge(INV, DEPLOY).changes == {h: 0 for h in HOSTS}


def test_wrong_nccl_without_a_wheel_is_refused_naming_both_versions(prepared):
    bed, _ = prepared
    _pin_replaced("spark-2", "2.27.3")
    run = bed.converge(INV, DEPLOY, "nccl_wheel=", check=False)
    assert run.returncode != 0
    assert "spark-2: /opt/nccl/lib/libnccl.so.2 reports NCCL 2.27.3, settings want 2.30.7" in run.stderr
    assert bed.converge(INV, DEPLOY).changed_hosts() == {"spark-1"}  # the head copies its pin back


def test_a_sites_own_build_is_uploaded_and_identified_the_same_way(prepared):
    """nccl_library_upload: the site's build (seed 004 built its own) on every node, recorded by its
    sha256 and build-id; back to the wheel, the head fetches it again and copies it to the worker."""
    bed, _ = prepared
    own = simbed.nccl_standin("2.30.7")
    run = bed.converge(INV, DEPLOY, f"nccl_library_upload={own}")
    assert run.changed_hosts() == HOSTS, run.changed
    digest = hashlib.sha256(own.read_bytes()).hexdigest()
    for host in HOSTS:
        record = json.loads(bed.node(host, "cat /etc/sparkinfra/nccl-pin.json").stdout)
        assert record["sha256"] == digest and record["source"] == {"upload": str(own)}, record
    assert bed.verify(INV, "--data", f"nccl_library_upload={own}", *ONLY_PREPARE).returncode == 0
    back = bed.converge(INV, DEPLOY)
    assert back.changed_hosts() == {"spark-1"}, back.changed  # fetched again, shared again
    assert simbed.nccl_index_downloads() == 2
    assert bed.verify(INV, *ONLY_PREPARE).returncode == 0


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
