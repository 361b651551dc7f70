"""
Preflight: ``PreflightProbe`` lines as a node prints them, judged by ``evaluate`` against a
cluster loaded from a pyinfra inventory (the seeds' pair: head bluey, worker reddie).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest
from spark_cluster import load_cluster, load_inventory

from sparkinfra import lanes, preflight, run
from sparkinfra.preflight import Check, PreflightFailed, PreflightProbe, evaluate, link_flags, required_ports

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
    docker: str = "28.3.3",
    free: int | str = 512 * GB,
    used: int | str = 0,
    link: str = LINK_UP,
    ports: tuple[str, ...] = (),
    hcas: tuple[str, ...] = None,
) -> list[str]:
    """What ``PreflightProbe.command`` prints on a node (by default a GB10's four HCAs, the cable on f0)."""
    return [f"gpu={gpu}", f"docker={docker}", f"free={free}", f"used={used}", f"link={link}",
            *(f"hca={h}" for h in (GB10_HCAS if hcas is None else hcas)), *(f"port={p}" for p in ports)]


GB10_HCAS = (
    "roceP2p1s0f0 enP2p1s0f0np0 <BROADCAST,MULTICAST,UP,LOWER_UP>",
    "roceP2p1s0f1 enP2p1s0f1np1 <NO-CARRIER,BROADCAST,MULTICAST>",
    "rocep1s0f0 enp1s0f0np0 <BROADCAST,MULTICAST,UP,LOWER_UP>",
    "rocep1s0f1 enp1s0f1np1 <NO-CARRIER,BROADCAST,MULTICAST>",
)


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
        "docker": "28.3.3",
        "free": str(512 * GB),
        "used": "0",
        "link": LINK_UP,
        "hcas": list(GB10_HCAS),
        "ports": ["8000 pid=4242 comm=python3 container=", "29501 pid=5151 comm=python3 container=vllm_node"],
        "gens": {}, "widths": {}, "addrs": [],
    }


def test_probe_process_empty_values():
    # No model folder yet (du prints nothing), no interface (ip prints nothing), no listeners.
    assert PreflightProbe().process(["gpu=!missing", "docker=!missing", "free=1000", "used=", "link="]) == {
        "gpu": "!missing", "docker": "!missing", "free": "1000", "used": "", "link": "", "ports": [], "hcas": [],
        "gens": {}, "widths": {}, "addrs": [],
    }


def test_both_twins_of_the_fabric_port_are_found_and_a_twin_without_carrier_is_named(cluster):
    found = by_name(evaluate(cluster, WORKER, probe()))["twins"]
    assert found.ok and found.detail == "enp1s0f0np0 (rocep1s0f0) and enP2p1s0f0np0 (roceP2p1s0f0)"
    dark = GB10_HCAS[:1] and ("roceP2p1s0f0 enP2p1s0f0np0 <NO-CARRIER,BROADCAST,MULTICAST,UP>", *GB10_HCAS[1:])
    found = by_name(evaluate(cluster, WORKER, probe(hcas=dark)))["twins"]
    assert not found.ok and "the twin enP2p1s0f0np0 is up without a carrier while enp1s0f0np0 has one" in found.detail
    peer_down = by_name(evaluate(cluster, WORKER, probe(hcas=dark), twins_down=(HEAD,)))["twins"]
    assert peer_down.ok and peer_down.detail.endswith(f"enP2p1s0f0np0 has no carrier while the twin of {HEAD} is down "
                                                      "(prepare brings it up)")
    down = ("roceP2p1s0f0 enP2p1s0f0np0 <BROADCAST,MULTICAST>", *GB10_HCAS[1:])  # before prepare: no problem
    assert by_name(evaluate(cluster, WORKER, probe(hcas=down)))["twins"].ok
    none = by_name(evaluate(cluster, WORKER, probe(hcas=GB10_HCAS[:2] + GB10_HCAS[3:])))["twins"]
    assert not none.ok and none.detail.startswith("no RDMA device on enp1s0f0np0 port 1 (ibdev2netdev: ")


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
    assert set(found) >= {"gpu", "docker", "free", "used", "link", "rdma", "ports"}, found
    assert int(found["free"]) > 0 and found["used"] == ""
    assert "lo:" in found["link"] and "UP" in link_flags(found)
    assert [p.split()[0] for p in found["ports"]] == [str(port)], found["ports"]
    assert f"pid={os.getpid()}" in found["ports"][0]
    assert found["kernel"] == os.uname().release and "cma" in found  # this kernel shows no CMA area: ""
    assert "platform" not in found  # no node programs placed here
    worker = PreflightProbe().command("/var/lib/sparkinfra/hf", "enp1s0f0np0", ()).get_raw_value()
    assert worker.endswith("preflight_probe.sh /var/lib/sparkinfra/hf enp1s0f0np0 /usr/local/lib/sparkinfra/node "
                           "/var/lib/sparkinfra/known-good -")
    head = PreflightProbe().command("/var/lib/sparkinfra/hf", "enp1s0f0np0", (8000,), "sim").get_raw_value()
    assert head.endswith("/var/lib/sparkinfra/known-good /var/lib/sparkinfra/lanes/sim.history 8000")


# The probe's docker line, from stand-ins of docker's client: the daemon answers, does not
# answer (docker's own words on stderr, a blank line on stdout first), or there is no docker.
DOCKER_DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
DOCKER_STANDINS = {
    "answers": "echo 28.3.3",
    "down": f"echo; printf '%s\\r\\n%s\\n' '{DOCKER_DOWN}' 'second line' >&2; exit 1",
}


def probe_docker(tmp_path, docker: str | None) -> str:
    """The ``docker=`` value ``preflight_probe.sh`` prints with this stand-in docker (``None``: none on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "dirname", "df", "awk", "du", "cut", "ip", "ss", "grep", "head", "tr", "timeout"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    if docker is not None:
        (bin_dir / "docker").write_text(f"#!/bin/sh\n{DOCKER_STANDINS[docker]}\n")
        (bin_dir / "docker").chmod(0o755)
    command = PreflightProbe().command(str(tmp_path), "lo", ()).get_raw_value()
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_dir)})
    assert done.returncode == 0, done.stderr
    return PreflightProbe().process(done.stdout.splitlines())["docker"]


@pytest.mark.parametrize("docker, said", [
    ("answers", "28.3.3"),
    ("down", f"!{DOCKER_DOWN}"),  # its first line, without the carriage return
    (None, "!missing"),
], ids=["answers", "down", "missing"])
def test_probe_script_says_whether_dockerd_answers(tmp_path, docker, said):
    assert probe_docker(tmp_path, docker) == said


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
    assert [c.check for c in checks] == ["ssh", "gpu", "docker", "disk", "fabric", "twins", "ports"]
    assert all(c.ok for c in checks), checks
    assert all(c.host == HEAD for c in checks)
    got = by_name(checks)
    assert got["ssh"].detail == "nvidia@bluey.local"
    assert got["gpu"].detail == "NVIDIA GB10"
    assert got["docker"].detail == "dockerd 28.3.3 answers"
    assert got["disk"].detail == "512.0 GB free + 0.0 GB staged under /var/lib/sparkinfra/hf, 240.0 GB needed"
    assert got["fabric"].detail == "enp1s0f0np0 up, carrier"
    assert got["ports"].detail == "8000, 29501 free"


def test_all_good_on_a_worker_has_no_ports_check(cluster):
    checks = evaluate(cluster, WORKER, probe())
    assert [c.check for c in checks] == ["ssh", "gpu", "docker", "disk", "fabric", "twins"]
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
    checks = evaluate(cluster, HEAD, probe(gpu="!missing", docker="!missing", free=0, link=LINK_NO_CARRIER,
                                           ports=("8000 pid=1 comm=nginx container=",)))
    assert [c.check for c in checks if not c.ok] == ["gpu", "docker", "disk", "fabric", "ports"]
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


# docker: dockerd answers on every node


@pytest.mark.parametrize("host", [HEAD, WORKER])
def test_dockerd_answering_passes(cluster, host):
    found = by_name(evaluate(cluster, host, probe(docker="28.3.3")))["docker"]
    assert found == Check(host, "docker", True, "dockerd 28.3.3 answers")


@pytest.mark.parametrize("host", [HEAD, WORKER])
def test_dockerd_not_answering_fails_on_that_node_with_its_error(cluster, host):
    checks = evaluate(cluster, host, probe(docker=f"!{DOCKER_DOWN}"))
    assert [c for c in checks if not c.ok] == [
        Check(host, "docker", False, f"dockerd does not answer: {DOCKER_DOWN}")]


def test_no_docker_fails(cluster):
    assert by_name(evaluate(cluster, WORKER, probe(docker="!missing")))["docker"] == Check(
        WORKER, "docker", False, "docker not found")


# run: the clusters in the run, every node of them


def test_a_stopped_dockerd_on_a_worker_stops_the_run_naming_the_worker(monkeypatch):
    state, settings = load_inventory("inventory/sim_pairs.py", ["spark-1", "spark-2"])
    for name in ("spark-1", "spark-2"):
        state.activate_host(state.inventory.get_host(name))
    good = {**probe(), "rdma": "rdma_cm uverbs0"}
    probes = {"spark-1": good, "spark-2": {**good, "docker": f"!{DOCKER_DOWN}"}}
    monkeypatch.setattr(preflight, "at_once", lambda calls: [probes[h.name] for h, *_ in calls])
    with pytest.raises(PreflightFailed) as failed:
        preflight.run(state, settings, run.in_run(state))
    assert str(failed.value) == (
        f"preflight failed, nothing changed: spark-2 docker: dockerd does not answer: {DOCKER_DOWN}")


def test_a_cluster_left_out_of_the_run_is_not_checked(monkeypatch):
    """--limit spark-3 --limit spark-4: pair_a is not in the run, so not "not reachable"; spark-4 is in the
    run but could not be connected, so it is."""
    state, settings = load_inventory("inventory/sim_pairs.py", ["spark-3", "spark-4"])
    state.activate_host(state.inventory.get_host("spark-3"))
    asked = []

    def probes(calls):
        asked.extend(h.name for h, *_ in calls)
        return [{**probe(), "rdma": "rdma_cm uverbs0"} for _ in calls]

    monkeypatch.setattr(preflight, "at_once", probes)
    # (no connection from a unit test: the bed's addresses are not routed here)
    monkeypatch.setattr(preflight, "unreachable_detail", lambda data, name: f"{name}'s own reason")
    with pytest.raises(PreflightFailed) as failed:
        preflight.run(state, settings, run.in_run(state))
    assert asked == ["spark-3"]
    assert str(failed.value) == "preflight failed, nothing changed: spark-4 ssh: spark-4's own reason"
    state.activate_host(state.inventory.get_host("spark-4"))
    assert {c.host for c in preflight.run(state, settings, run.in_run(state))} == {"spark-3", "spark-4"}


# A node the controller could not connect to: a changed host key by name (issue 18)
# ----------------------------------------------------------------------------------


def _known_hosts(tmp_path, key, entry="10.0.0.12"):
    path = tmp_path / "known_hosts"
    path.write_text(f"{entry} {key.get_name()} {key.get_base64()}\n")
    return path


def test_a_changed_host_key_is_named_with_how_to_accept_it(tmp_path, monkeypatch):
    import paramiko

    keys = []
    for name in ("old", "new"):
        done = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)])
        assert done.returncode == 0
        keys.append(paramiko.Ed25519Key.from_private_key_file(str(tmp_path / name)))
    path = _known_hosts(tmp_path, keys[0])
    monkeypatch.setattr(preflight, "offered_key", lambda host, port, types, timeout=5: keys[1])
    data = {"ssh_hostname": "10.0.0.12", "ssh_user": "spark2", "ssh_known_hosts_file": str(path)}
    detail = preflight.unreachable_detail(data, "spark-2")
    assert detail.startswith(f"spark2@10.0.0.12: its SSH host key changed (ssh-ed25519 {keys[1].fingerprint} is "
                             f"not the key {path} holds): if spark-2 was re-installed")
    assert detail.endswith(f"ssh-keygen -f {path} -R '10.0.0.12', and run once with "
                           "--data ssh_strict_host_key_checking=accept-new")
    monkeypatch.setattr(preflight, "offered_key", lambda host, port, types, timeout=5: keys[0])
    assert "key changed" not in preflight.unreachable_detail(data, "spark-2")  # same key: another failure
    other_port = {**data, "ssh_port": 2222}
    assert "key changed" not in preflight.unreachable_detail(other_port, "spark-2")  # [host]:2222 is not known


def test_a_node_that_does_not_answer_is_not_reachable_with_the_reason():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    detail = preflight.unreachable_detail({"ssh_hostname": "127.0.0.1", "ssh_port": port, "ssh_user": "u"}, "n")
    assert detail.startswith("u@127.0.0.1 not reachable (") and "refused" in detail, detail


# Node rules (rules/*.yaml, checks: node), from the probe's facts
# ---------------------------------------------------------------


def test_a_fabric_port_not_eui64_is_a_warning_naming_its_netdev(cluster):
    """rules/fabric-addr-gen-not-eui64.yaml: the fabric port and its twin only (the other port's
    netdevs carry no fabric GID); a warning passes preflight, said."""
    lines = probe_lines() + ["gen=enp1s0f0np0 0", "gen=enP2p1s0f0np0 1", "gen=enp1s0f1np1 2", "gen=enP2p1s0f1np1 -"]
    parsed = PreflightProbe().process(lines)
    assert parsed["gens"] == {"enp1s0f0np0": "0", "enP2p1s0f0np0": "1", "enp1s0f1np1": "2", "enP2p1s0f1np1": "-"}
    rule = by_name(evaluate(cluster, WORKER, parsed))["rule fabric-addr-gen-not-eui64"]
    assert rule.ok and rule.detail.startswith(
        "rule fabric-addr-gen-not-eui64 (warn): addr_gen_mode enP2p1s0f0np0 1 (0 is eui64). "), rule.detail
    assert "remedy: set the fabric port's and its twin's IPv6 address generation to eui64" in rule.detail
    eui64 = PreflightProbe().process(probe_lines() + ["gen=enp1s0f0np0 0", "gen=enP2p1s0f0np0 0", "gen=enp1s0f1np1 2"])
    assert not [c for c in evaluate(cluster, WORKER, eui64) if c.check.startswith("rule ")]
    unreadable = PreflightProbe().process(probe_lines())  # no IPv6 on the node: nothing to judge
    assert not [c for c in evaluate(cluster, WORKER, unreadable) if c.check.startswith("rule ")]


def test_status_judges_the_node_rules_on_the_probe_lines_each_node_report_carries(cluster):
    """``status`` (its node report runs this probe): a refusing node rule is a problem, a warning a warning."""
    from sparkinfra.preflight import reported_rules

    answers = {HEAD: {"probe": probe_lines() + ["cma=65536", "width=roceP2p1s0f0 2 4"]},
               WORKER: {"probe": probe_lines() + ["cma=0", "kernel=7.0.0-1019-nvidia"]}, "gone": {"unreachable": "x"}}
    found = reported_rules(cluster, answers, None)
    assert [(name, said.split(":", 1)[0], refuse) for name, said, refuse in found] == [
        (HEAD, "rule twin-link-narrow (warn)", False), (WORKER, "rule kernel-cma-zero (refuse)", True)]
