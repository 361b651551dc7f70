"""
Preflight: ``PreflightProbe`` lines as a node prints them, judged by ``evaluate`` against a
cluster loaded from a pyinfra inventory (the seeds' pair: head bluey, worker reddie).
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest
from spark_cluster import load_cluster

from sparkinfra import lanes
from sparkinfra.preflight import Check, PreflightProbe, evaluate, link_flags, required_ports

HEAD, WORKER = "bluey", "reddie"
GB = 1_000_000_000

# ``ip -o link show dev X`` lines, in their real format (-o joins the two lines with "\    ").
LINK_UP = (
    "3: enp1s0f0np0@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 4200 qdisc noqueue state UP mode DEFAULT "
    "group default qlen 1000\\    link/ether 4c:bb:47:00:00:01 brd ff:ff:ff:ff:ff:ff link-netns x"
)
LINK_UP_HW = (
    "3: enp1s0f0np0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 4200 qdisc mq state UP mode DEFAULT "
    "group default qlen 1000\\    link/ether 4c:bb:47:00:00:01 brd ff:ff:ff:ff:ff:ff"
)
LINK_NO_CARRIER = (
    "3: enp1s0f0np0: <NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 4200 qdisc mq state DOWN mode DEFAULT "
    "group default qlen 1000\\    link/ether 4c:bb:47:00:00:01 brd ff:ff:ff:ff:ff:ff"
)
LINK_UP_NO_LOWER = (
    "3: enp1s0f0np0: <BROADCAST,MULTICAST,UP> mtu 4200 qdisc mq state UNKNOWN mode DEFAULT "
    "group default qlen 1000\\    link/ether 4c:bb:47:00:00:01 brd ff:ff:ff:ff:ff:ff"
)
LINK_ADMIN_DOWN = (
    "3: enp1s0f0np0: <BROADCAST,MULTICAST> mtu 1500 qdisc mq state DOWN mode DEFAULT "
    "group default qlen 1000\\    link/ether 4c:bb:47:00:00:01 brd ff:ff:ff:ff:ff:ff"
)


def probe_lines(
    gpu: str = "NVIDIA GB10",
    free: int | str = 512 * GB,
    used: int | str = 0,
    link: str = LINK_UP,
    ports: tuple[str, ...] = (),
) -> list[str]:
    """What ``PreflightProbe.command`` prints on a node."""
    return [f"gpu={gpu}", f"free={free}", f"used={used}", f"link={link}", *(f"port={p}" for p in ports)]


def probe(**kwargs) -> dict:
    return PreflightProbe().process(probe_lines(**kwargs))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    return load_cluster(tmp_path_factory.mktemp("preflight"))


def by_name(checks: list[Check]) -> dict[str, Check]:
    names = [c.check for c in checks]
    assert len(names) == len(set(names)), names
    return {c.check: c for c in checks}


# PreflightProbe.process
# ----------------------


def test_probe_process():
    lines = probe_lines(ports=("8000 pid=4242 comm=python3 container=", "29501 pid=5151 comm=python3 container=vllm_node"))
    assert PreflightProbe().process(lines) == {
        "gpu": "NVIDIA GB10",
        "free": str(512 * GB),
        "used": "0",
        "link": LINK_UP,
        "ports": ["8000 pid=4242 comm=python3 container=", "29501 pid=5151 comm=python3 container=vllm_node"],
    }


def test_probe_process_empty_values():
    # No model folder yet (du prints nothing), no interface (ip prints nothing), no listeners.
    assert PreflightProbe().process(["gpu=!missing", "free=1000", "used=", "link="]) == {
        "gpu": "!missing", "free": "1000", "used": "", "link": "", "ports": [],
    }


def test_probe_script_runs_and_its_lines_are_read(tmp_path):
    """scripts/preflight_probe.sh as PreflightProbe runs it, here: a listener on the asked port
    is named; the folder's nearest existing parent gives the free bytes."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        command = PreflightProbe().command(str(tmp_path / "not" / "yet"), "lo", (port,)).get_raw_value()
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = PreflightProbe().process(done.stdout.splitlines())
    assert set(found) >= {"gpu", "free", "used", "link", "rdma", "ports"}, found
    assert int(found["free"]) > 0 and found["used"] == ""
    assert "lo:" in found["link"] and "UP" in link_flags(found)
    assert [p.split()[0] for p in found["ports"]] == [str(port)], found["ports"]
    assert f"pid={os.getpid()}" in found["ports"][0]
    worker = PreflightProbe().command("/var/lib/sparkinfra/hf", "enp1s0f0np0", ()).get_raw_value()
    assert worker.endswith("preflight_probe.sh /var/lib/sparkinfra/hf enp1s0f0np0")


def test_required_ports(cluster):
    assert required_ports(cluster, HEAD) == (8000, 29501)
    assert required_ports(cluster, WORKER) == ()
    own = lanes.find_lane("sim").model_copy(update={"api_port": 8100, "master_port": 29600})
    assert required_ports(cluster, HEAD, own) == (8100, 29600)  # the lane's own ports, where it sets them
    ray = lanes.find_lane("quad-awq-eagle3")
    assert required_ports(cluster, HEAD, ray) == (8000, 29501, ray.ray_port)  # and a Ray lane's GCS port
    assert required_ports(cluster, WORKER, ray) == ()


# evaluate
# --------


def test_all_good_on_the_head(cluster):
    checks = evaluate(cluster, HEAD, probe())
    assert [c.check for c in checks] == ["ssh", "gpu", "disk", "fabric", "ports"]
    assert all(c.ok for c in checks), checks
    assert all(c.host == HEAD for c in checks)
    got = by_name(checks)
    assert got["ssh"].detail == "nvidia@bluey.local"
    assert got["gpu"].detail == "NVIDIA GB10"
    assert got["disk"].detail == "512.0 GB free + 0.0 GB staged under /var/lib/sparkinfra/hf, 240.0 GB needed"
    assert got["fabric"].detail == "enp1s0f0np0 up, carrier"
    assert got["ports"].detail == "8000, 29501 free"


def test_all_good_on_a_worker_has_no_ports_check(cluster):
    checks = evaluate(cluster, WORKER, probe())
    assert [c.check for c in checks] == ["ssh", "gpu", "disk", "fabric"]
    assert all(c.ok for c in checks), checks
    assert checks[0].detail == "reddie@reddie.local"


def test_worker_ignores_listeners(cluster):
    # Even if a worker's probe had listeners, ports are only the head's business.
    checks = evaluate(cluster, WORKER, probe(ports=("8000 pid=1 comm=nginx container=",)))
    assert "ports" not in by_name(checks)
    assert all(c.ok for c in checks)


@pytest.mark.parametrize("host", [HEAD, WORKER])
def test_unreachable_node_is_one_ssh_failure(cluster, host):
    checks = evaluate(cluster, host, None)
    user_host = {"bluey": "nvidia@bluey.local", "reddie": "reddie@reddie.local"}[host]
    assert checks == [Check(host, "ssh", False, f"{user_host} not reachable")]


def test_nvidia_smi_missing(cluster):
    got = by_name(evaluate(cluster, HEAD, probe(gpu="!missing")))
    assert not got["gpu"].ok
    assert got["gpu"].detail == "nvidia-smi not found"
    assert all(c.ok for name, c in got.items() if name != "gpu")


@pytest.mark.parametrize(
    "gpu",
    [
        "NVIDIA H100 80GB HBM3",
        "NVIDIA GeForce RTX 4090",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.",
    ],
)
def test_not_a_gb10(cluster, gpu):
    got = by_name(evaluate(cluster, HEAD, probe(gpu=gpu)))
    assert not got["gpu"].ok
    assert got["gpu"].detail == gpu


def test_nvidia_smi_reports_nothing(cluster):
    got = by_name(evaluate(cluster, HEAD, probe(gpu="")))
    assert not got["gpu"].ok
    assert got["gpu"].detail == "nvidia-smi reported no GPU"


def test_disk_short(cluster):
    got = by_name(evaluate(cluster, HEAD, probe(free=100 * GB, used="")))
    assert not got["disk"].ok
    assert got["disk"].detail == "100.0 GB free + 0.0 GB staged under /var/lib/sparkinfra/hf, 240.0 GB needed"


def test_disk_short_but_enough_already_staged(cluster):
    got = by_name(evaluate(cluster, HEAD, probe(free=100 * GB, used=150 * GB)))
    assert got["disk"].ok
    assert got["disk"].detail == "100.0 GB free + 150.0 GB staged under /var/lib/sparkinfra/hf, 240.0 GB needed"


def test_disk_staged_but_still_short(cluster):
    assert not by_name(evaluate(cluster, HEAD, probe(free=100 * GB, used=139 * GB)))["disk"].ok


def test_disk_exactly_enough(cluster):
    assert by_name(evaluate(cluster, HEAD, probe(free=240 * GB, used=0)))["disk"].ok
    assert not by_name(evaluate(cluster, HEAD, probe(free=240 * GB - 1, used=0)))["disk"].ok


def test_disk_need_follows_settings(tmp_path):
    small = load_cluster(tmp_path, {"preflight_free_gb": 1, "model_dir": "/srv/models"})
    got = by_name(evaluate(small, HEAD, probe(free=2 * GB)))
    assert got["disk"].ok
    assert got["disk"].detail == "2.0 GB free + 0.0 GB staged under /srv/models, 1.0 GB needed"


def test_fabric_link_absent(cluster):
    got = by_name(evaluate(cluster, HEAD, probe(link="")))
    assert not got["fabric"].ok
    assert got["fabric"].detail == "enp1s0f0np0 not present"


def test_fabric_link_admin_down_passes_with_a_note(cluster):
    got = by_name(evaluate(cluster, HEAD, probe(link=LINK_ADMIN_DOWN)))
    assert got["fabric"].ok
    assert got["fabric"].detail == "enp1s0f0np0 present, down (prepare brings it up)"


@pytest.mark.parametrize("link", [LINK_NO_CARRIER, LINK_UP_NO_LOWER], ids=["no-carrier", "no-lower-up"])
def test_fabric_link_up_without_carrier_fails(cluster, link):
    got = by_name(evaluate(cluster, HEAD, probe(link=link)))
    assert not got["fabric"].ok
    assert got["fabric"].detail == "enp1s0f0np0 up but no carrier: cable, peer or switch port down"


@pytest.mark.parametrize("link", [LINK_UP, LINK_UP_HW], ids=["veth", "hw"])
def test_fabric_link_up_with_carrier_passes(cluster, link):
    got = by_name(evaluate(cluster, WORKER, probe(link=link)))
    assert got["fabric"].ok
    assert got["fabric"].detail == "enp1s0f0np0 up, carrier"


def test_fabric_interface_follows_settings(tmp_path):
    other = load_cluster(tmp_path, {"fabric_interface": "enp1s0f1np1"})
    got = by_name(evaluate(other, HEAD, probe(link="")))
    assert got["fabric"].detail == "enp1s0f1np1 not present"


def test_head_port_held_by_an_unrelated_process(cluster):
    held = "8000 pid=4242 comm=python3 container="
    got = by_name(evaluate(cluster, HEAD, probe(ports=(held,))))
    assert not got["ports"].ok
    assert "pid=4242" in got["ports"].detail and "comm=python3" in got["ports"].detail
    assert got["ports"].detail == f"8000, 29501 in use: {held}"


def test_head_ports_held_by_two_processes(cluster):
    held = ("8000 pid=4242 comm=python3 container=", "29501 pid=777 comm=torchrun container=other_job")
    got = by_name(evaluate(cluster, HEAD, probe(ports=held)))
    assert not got["ports"].ok
    assert got["ports"].detail == "8000, 29501 in use: " + "; ".join(held)


def test_head_ports_held_by_the_lane_container(cluster):
    lane = ("8000 pid=5151 comm=vllm container=vllm_node", "29501 pid=5151 comm=vllm container=vllm_node")
    got = by_name(evaluate(cluster, HEAD, probe(ports=lane)))
    assert got["ports"].ok
    assert got["ports"].detail == "8000, 29501: 8000, 29501 held by the lane's own vllm_node"


def test_lane_container_name_follows_settings(tmp_path):
    other = load_cluster(tmp_path, {"container_name": "lane0", "api_port": 9000, "master_port": 29600})
    lane = by_name(evaluate(other, HEAD, probe(ports=("9000 pid=1 comm=vllm container=lane0",))))
    assert lane["ports"].ok and lane["ports"].detail == "9000, 29600: 9000 held by the lane's own lane0"
    default_name = by_name(evaluate(other, HEAD, probe(ports=("9000 pid=1 comm=vllm container=vllm_node",))))
    assert not default_name["ports"].ok


def test_head_port_held_by_a_container_with_a_longer_name(cluster):
    got = by_name(evaluate(cluster, HEAD, probe(ports=("8000 pid=6262 comm=vllm container=vllm_node_old",))))
    assert not got["ports"].ok


def test_several_failures_are_all_reported(cluster):
    checks = evaluate(cluster, HEAD, probe(gpu="!missing", free=0, link=LINK_NO_CARRIER,
                                           ports=("8000 pid=1 comm=nginx container=",)))
    assert [c.check for c in checks if not c.ok] == ["gpu", "disk", "fabric", "ports"]
    assert checks[0].ok  # reached over SSH


def test_unknown_host_is_a_key_error(cluster):
    with pytest.raises(KeyError):
        evaluate(cluster, "nobody", probe())


# rdma: the verbs devices a lane's container is given


@pytest.mark.parametrize("devices, ok, said", [
    ("issm0 rdma_cm umad0 uverbs0", True, "issm0 rdma_cm umad0 uverbs0 in /dev/infiniband, given to lane pair-a-balanced"),
    ("", False, "no uverbs device in /dev/infiniband (empty): the RDMA driver is not loaded"),
    ("uverbs0 uverbs1", False, "no rdma_cm in /dev/infiniband (the rdma_ucm module is not loaded)"),
], ids=["present", "no driver", "no rdma_cm"])
def test_a_lane_using_rdma_needs_the_nodes_verbs_devices(cluster, devices, ok, said):
    lane = lanes.find_lane("pair-a-balanced")
    found = by_name(evaluate(cluster, WORKER, {**probe(), "rdma": devices}, lane=lane))["rdma"]
    assert found.ok is ok and said in found.detail, found


def test_a_lane_that_opts_out_of_rdma_says_so_and_no_lane_has_no_rdma_check(cluster):
    cpu = lanes.find_lane("sim").model_copy(deep=True)
    cpu.container.rdma = False
    found = by_name(evaluate(cluster, HEAD, {**probe(), "rdma": ""}, lane=cpu))["rdma"]
    assert found.ok and found.detail == "not used: lane sim says container.rdma: false"
    assert "rdma" not in by_name(evaluate(cluster, HEAD, probe()))
