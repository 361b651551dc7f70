"""The bed itself: isolated, faithful where it matters, and honest about its stand-ins."""

import subprocess
import time

import sparkbed as simbed


def test_guard_route_keeps_bed_traffic_local(pair):
    """In the root namespace every bed address is unreachable: a misdirected command fails here."""
    for node in simbed.sim_nodes(2):
        for address in (node.mgmt_ip, node.fabric_ip):
            result = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True)
            assert result.returncode != 0 or result.stdout.startswith("unreachable"), result.stdout
            assert "unreachable" in (result.stdout + result.stderr).lower() or "no route" in result.stderr.lower()


def test_nodes_boot_systemd_sshd_dockerd(pair):
    for node in simbed.sim_nodes(2):
        assert pair.node(node.name, "systemctl is-system-running").stdout.strip() == "running"
        assert pair.node(node.name, "systemctl is-active ssh docker").stdout.split() == ["active", "active"]
        assert pair.node(node.name, "hostname").stdout.strip() == node.name


def test_standins_say_so_in_their_first_line(pair):
    for tool in ("show_gids", "ibv_devinfo", "nvidia-smi"):
        first = pair.node("spark-1", f"head -n 1 $(command -v {tool})").stdout
        assert "stand-in" in first, f"{tool}: {first!r}"


def test_gpu_standin_reports_a_gb10(pair):
    out = pair.node("spark-1", "nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader").stdout
    assert out.strip() == "NVIDIA GB10, 12.1"


def _settled(pair, node, ready, timeout=10.0):
    """The stand-ins' output once ``ready(output)`` holds (they redraw on netlink events, later under load)."""
    deadline = time.monotonic() + timeout
    while True:
        out = pair.node(node, "show_gids rocep1s0f0; ibv_devinfo -d rocep1s0f0").stdout
        if ready(out) or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def test_rdma_standins_follow_live_link_state(pair):
    """No IPv4 GID and active_mtu 1024 at power-on; the IPv4 RoCE v2 row and 4096 once configured."""
    n = "spark-2"
    pair.node(n, "ip addr flush dev enp1s0f0np0 scope global; ip link set enp1s0f0np0 mtu 1500 down;"
                 "ip addr add fd00:213:1::2/64 dev enp1s0f0np0 nodad")
    out = _settled(pair, n, lambda o: "ffff" not in o and "active_mtu:\t\t1024 (3)" in o and "PORT_DOWN" in o)
    assert "ffff" not in out and "active_mtu:\t\t1024 (3)" in out and "PORT_DOWN" in out
    pair.node(n, "ip addr add 10.213.1.2/24 dev enp1s0f0np0; ip link set enp1s0f0np0 mtu 4200 up")
    pair.node("spark-1", "ip link set enp1s0f0np0 up")
    out = _settled(pair, n, lambda o: "\tv2\t" in o and "10.213.1.2" in o and "PORT_ACTIVE" in o)
    v2_rows = [line.split("\t") for line in out.splitlines() if "10.213.1.2" in line and "\tv2\t" in line]
    assert [row[2] for row in v2_rows] == ["5"], out  # after the two IPv6 GID pairs: differs per node
    assert "active_mtu:\t\t4096 (5)" in out and "PORT_ACTIVE" in out
    sysfs = pair.node(n, "cat /sys/class/infiniband/roceP2p1s0f0/ports/1/gids/5 "
                         "/sys/class/infiniband/roceP2p1s0f0/ports/1/gid_attrs/types/5").stdout.split()
    assert sysfs[0] == "0000:0000:0000:0000:0000:ffff:0ad5:0102" and " ".join(sysfs[1:]) == "RoCE v2"


def test_reboot_resets_the_fabric_port(pair):
    n = "spark-2"
    pair.node(n, "ip addr replace 10.213.1.2/24 dev enp1s0f0np0; ip link set enp1s0f0np0 mtu 4200 up")
    pair.reboot(n)
    link = pair.node(n, "ip -4 -o addr show dev enp1s0f0np0; cat /sys/class/net/enp1s0f0np0/mtu "
                        "/sys/class/net/enp1s0f0np0/operstate").stdout.split()
    assert link == ["1500", "down"], link
    assert pair.node(n, "systemctl is-active ssh docker").stdout.split() == ["active", "active"]


def test_docker_runs_containers_in_a_node(pair):
    """dockerd in a node imports an image and runs it with host networking (no registry)."""
    out = pair.node(
        "spark-1",
        "set -e; d=$(mktemp -d); cp -L --parents /usr/bin/true $(ldd /usr/bin/true | grep -o '/[^ ]*') $d; "
        "cd $d; tar -c . | docker import - sparkbed-probe:1 >/dev/null; "
        "docker run --rm --network host --name sparkbed-probe sparkbed-probe:1 /usr/bin/true && echo ran; "
        "docker rmi -f sparkbed-probe:1 >/dev/null; rm -rf $d",
        check=False,
    )
    assert out.stdout.strip().endswith("ran"), out.stdout + out.stderr
