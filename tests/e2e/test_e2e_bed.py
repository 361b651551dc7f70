"""The bed itself: isolated, faithful where it matters, and honest about its stand-ins."""

import hashlib
import re
import subprocess
import time
import urllib.parse

import sparkbed as simbed

GB10 = simbed.SHAPES["gb10"]
FABRIC, TWIN = GB10.fabric, GB10.twin  # enp1s0f0np0, enP2p1s0f0np0
FABRIC_DEV, TWIN_DEV = GB10.rdma  # rocep1s0f0, roceP2p1s0f0


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
    for tool in ("show_gids", "ibv_devinfo", "ibdev2netdev", "ib_write_bw", "nvidia-smi", "uname"):
        first = pair.node("spark-1", f"head -n 1 $(command -v {tool})").stdout
        assert "stand-in" in first, f"{tool}: {first!r}"


def test_the_kernel_a_node_shows_is_a_dgx_os_kernels(pair):
    """The uname and /proc/meminfo stand-ins: a DGX OS release and a CMA area (this machine's
    kernel has neither), the rest of meminfo live; the real uname for anything but -r."""
    shown = pair.node("spark-1", "uname -r; grep -E '^(CmaTotal|CmaFree|MemTotal):' /proc/meminfo; uname -s").stdout
    assert shown.splitlines() == [simbed.KERNEL_RELEASE, f"MemTotal:{shown.splitlines()[1][9:]}",
                                  f"CmaTotal:       {simbed.CMA_KIB:8d} kB", f"CmaFree:        {simbed.CMA_KIB:8d} kB",
                                  "Linux"], shown


def test_gpu_standin_reports_a_gb10(pair):
    out = pair.node("spark-1", "nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader").stdout
    assert out.strip() == "NVIDIA GB10, 12.1"


def test_a_node_has_a_gb10s_four_netdevs_and_rdma_devices(pair):
    """Two QSFP ports, two PCIe functions ("twins") each, each with its own netdev and RDMA device."""
    out = pair.node("spark-1", "ibdev2netdev; ls /sys/class/infiniband; ls /dev/infiniband; ls /sys/class/net").stdout
    # the real tool's lines, in a Spark's ``ls`` order; (Up)/(Down) as the netdevs are now
    assert [re.sub(r" \((Up|Down)\)$", "", line) for line in out.splitlines()[:4]] == [
        "rocep1s0f0 port 1 ==> enp1s0f0np0", "rocep1s0f1 port 1 ==> enp1s0f1np1",
        "roceP2p1s0f0 port 1 ==> enP2p1s0f0np0", "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1",
    ], out
    assert all(line.endswith(("(Up)", "(Down)")) for line in out.splitlines()[:4]), out
    assert out.splitlines()[1].endswith("(Down)") and out.splitlines()[3].endswith("(Down)"), out  # uncabled
    words = out.split()
    assert {dev for _, dev in GB10.pairs} <= set(words) and set(GB10.netdevs) <= set(words), out
    assert {"uverbs0", "uverbs1", "uverbs2", "uverbs3", "rdma_cm"} <= set(words), out
    for netdev, dev in GB10.pairs:
        assert pair.node("spark-1", f"ls /sys/class/infiniband/{dev}/device/net").stdout.split() == [netdev]


def test_the_uncabled_port_never_has_a_carrier(pair):
    n = "spark-1"
    pair.node(n, "ip link set enp1s0f1np1 up; ip link set enP2p1s0f1np1 up")
    try:
        carriers = pair.node(n, "cat /sys/class/net/enp1s0f1np1/carrier /sys/class/net/enP2p1s0f1np1/carrier "
                                "/sys/class/net/enp1s0f1np1/operstate").stdout.split()
        assert carriers == ["0", "0", "down"], carriers
        lines = pair.node(n, "sleep 0.3; ibdev2netdev").stdout.splitlines()
        assert "rocep1s0f1 port 1 ==> enp1s0f1np1 (Down)" in lines and \
            "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Down)" in lines, lines
    finally:
        pair.node(n, "ip link set enp1s0f1np1 down; ip link set enP2p1s0f1np1 down")


def _settled(pair, node, ready, dev=FABRIC_DEV, timeout=10.0):
    """The stand-ins' output once ``ready(output)`` holds (they redraw on netlink events, later under load)."""
    deadline = time.monotonic() + timeout
    while True:
        out = pair.node(node, f"show_gids {dev}; ibv_devinfo -d {dev}").stdout
        if ready(out) or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def _power_on(pair, n):
    """The node's fabric twins as they power on (an earlier test may have configured them)."""
    for netdev in (FABRIC, TWIN):
        pair.node(n, f"ip addr flush dev {netdev} scope global; ip link set {netdev} mtu 1500 down;"
                     f"ip addr add fd00:213:1::2/64 dev {netdev} nodad 2>/dev/null || true")


def test_rdma_standins_follow_live_link_state(pair):
    """No IPv4 GID and active_mtu 1024 at power-on; the IPv4 RoCE v2 row and 4096 once configured."""
    n = "spark-2"
    _power_on(pair, n)
    out = _settled(pair, n, lambda o: "ffff" not in o and "active_mtu:\t\t1024 (3)" in o and "PORT_DOWN" in o)
    assert "ffff" not in out and "active_mtu:\t\t1024 (3)" in out and "PORT_DOWN" in out
    pair.node(n, f"ip addr add 10.213.1.2/24 dev {FABRIC}; ip link set {FABRIC} mtu 4200 up")
    pair.node("spark-1", f"ip link set {FABRIC} up")
    out = _settled(pair, n, lambda o: "\tv2\t" in o and "10.213.1.2" in o and "PORT_ACTIVE" in o)
    v2_rows = [line.split("\t") for line in out.splitlines() if "10.213.1.2" in line and "\tv2\t" in line]
    assert [row[2] for row in v2_rows] == ["5"], out  # after the two IPv6 GID pairs: differs per node
    assert "active_mtu:\t\t4096 (5)" in out and "PORT_ACTIVE" in out
    sysfs = pair.node(n, f"cat /sys/class/infiniband/{FABRIC_DEV}/ports/1/gids/5 "
                         f"/sys/class/infiniband/{FABRIC_DEV}/ports/1/gid_attrs/types/5 "
                         f"/sys/class/infiniband/{FABRIC_DEV}/ports/1/gid_attrs/ndevs/5").stdout.split()
    assert sysfs == ["0000:0000:0000:0000:0000:ffff:0ad5:0102", "RoCE", "v2", FABRIC]


def test_each_rdma_device_follows_its_own_netdev(pair):
    """The twin's table never holds the fabric's IPv4; an IPv4 on the twin adds rows to the twin's device only."""
    n = "spark-2"
    _power_on(pair, n)
    pair.node(n, f"ip addr add 10.213.1.2/24 dev {FABRIC}; ip link set {FABRIC} mtu 4200 up")
    fabric_out = _settled(pair, n, lambda o: "10.213.1.2" in o)
    twin_out = _settled(pair, n, lambda o: "PORT_DOWN" in o, dev=TWIN_DEV)
    assert "10.213.1.2" in fabric_out and "ffff" not in twin_out and "PORT_DOWN" in twin_out, twin_out
    assert "active_mtu:\t\t1024 (3)" in twin_out  # the twin's own MTU (1500), not the fabric's
    pair.node(n, f"ip addr add 169.254.10.2/16 dev {TWIN}; ip link set {TWIN} mtu 4200 up")
    pair.node("spark-1", f"ip link set {TWIN} up")
    twin_out = _settled(pair, n, lambda o: "169.254.10.2" in o and "PORT_ACTIVE" in o, dev=TWIN_DEV)
    rows = [line.split("\t") for line in twin_out.splitlines() if "169.254.10.2" in line]
    assert [(r[2], r[5], r[6]) for r in rows] == [("4", "v1", TWIN), ("5", "v2", TWIN)], twin_out
    assert "10.213.1.2" not in twin_out and "active_mtu:\t\t4096 (5)" in twin_out
    fabric_out = _settled(pair, n, lambda o: True)
    assert "169.254.10.2" not in fabric_out and "10.213.1.2" in fabric_out
    pair.node(n, f"ip addr del 169.254.10.2/16 dev {TWIN}")
    twin_out = _settled(pair, n, lambda o: "169.254.10.2" not in o, dev=TWIN_DEV)
    assert "ffff" not in twin_out, twin_out  # its rows freed when the address goes


def test_ib_write_bw_runs_over_each_devices_own_link(pair):
    """A twin's test binds its link-local IPv4 from its GID row and moves bytes over the twin's link only."""
    for i in (1, 2):
        pair.node(f"spark-{i}", f"ip addr replace 169.254.20.{i}/16 dev {TWIN}; ip link set {TWIN} mtu 4200 up;"
                                f"ip addr replace 10.213.1.{i}/24 dev {FABRIC}; ip link set {FABRIC} mtu 4200 up")
    index = {}
    for i in (1, 2):
        out = _settled(pair, f"spark-{i}", lambda o, i=i: f"169.254.20.{i}" in o and "PORT_ACTIVE" in o, dev=TWIN_DEV)
        index[i] = [line.split("\t")[2] for line in out.splitlines() if f"169.254.20.{i}" in line and "\tv2\t" in line]
    assert index == {1: ["3"], 2: ["5"]}, index  # the IPv6 RA address on the even node's twin too

    def tx(netdev):
        return int(pair.node("spark-1", f"cat /sys/class/net/{netdev}/statistics/tx_bytes").stdout)

    before = tx(TWIN), tx(FABRIC)
    pair.node("spark-2", f"nohup ib_write_bw -d {TWIN_DEV} -x 5 -D 1 -p 18611 >/tmp/bw.log 2>&1 &")
    out = pair.node("spark-1", f"ib_write_bw -d {TWIN_DEV} -x 3 -D 1 -p 18611 -F --report_gbits 169.254.20.2").stdout
    assert "BW average[Gb/sec]" in out, out
    after = tx(TWIN), tx(FABRIC)
    assert after[0] - before[0] > 10_000_000 and after[1] - before[1] < 1_000_000, (before, after)
    # what the real tool refuses: a row that is not IPv4 RoCE v2, a device whose port is down
    wrong_row = pair.node("spark-1", f"ib_write_bw -d {TWIN_DEV} -x 1 169.254.20.2", check=False)
    down_port = pair.node("spark-1", "ib_write_bw -d rocep1s0f1 -x 1 169.254.20.2", check=False)
    assert wrong_row.returncode != 0 and "RoCE v2" in wrong_row.stderr, wrong_row.stderr
    assert down_port.returncode != 0 and "not active" in down_port.stderr, down_port.stderr


def test_reboot_resets_the_fabric_port(pair):
    n = "spark-2"
    pair.node(n, f"ip addr replace 10.213.1.2/24 dev {FABRIC}; ip link set {FABRIC} mtu 4200 up;"
                 f"ip addr replace 169.254.30.2/16 dev {TWIN}; ip link set {TWIN} mtu 4200 up")
    pair.reboot(n)
    for netdev in GB10.netdevs:
        link = pair.node(n, f"ip -4 -o addr show dev {netdev}; cat /sys/class/net/{netdev}/mtu "
                            f"/sys/class/net/{netdev}/operstate").stdout.split()
        assert link == ["1500", "down"], (netdev, link)
    ipv6 = {netdev: pair.node(n, f"ip -6 -o addr show dev {netdev} scope global").stdout for netdev in GB10.netdevs}
    assert [d for d, out in ipv6.items() if "fd00:213:1::2/64" in out] == [FABRIC, TWIN], ipv6
    assert pair.node(n, "systemctl is-active ssh docker").stdout.split() == ["active", "active"]


def test_the_hubs_package_index_serves_nccl_wheels(pair):
    """PEP 503 page (ungated) from a node; every file's sha256 as the anchor says; whole downloads counted."""
    page = pair.node("spark-1", f"python3 -c 'import urllib.request as u; "
                                f"print(u.urlopen(\"{simbed.NCCL_INDEX_URL}/nvidia-nccl-cu13/\").read().decode())'").stdout
    anchors = re.findall(r'<a href="([^"#]+)#sha256=([0-9a-f]{64})">([^<]+)</a>', page)
    assert sorted(name for _, _, name in anchors) == [
        "nvidia_nccl_cu13-2.27.3-py3-none-manylinux_2_18_x86_64.whl",
        "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_aarch64.whl",
        "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_x86_64.whl",
    ], page
    before = simbed.nccl_index_downloads()
    for href, digest, name in anchors:
        url = urllib.parse.urljoin(f"{simbed.NCCL_INDEX_URL}/nvidia-nccl-cu13/", href)  # as pip resolves it
        got = pair.node("spark-1", f"python3 -c 'import hashlib, urllib.request as u; print(hashlib.sha256(u.urlopen("
                                   f"\"{url}\").read()).hexdigest())'").stdout
        assert got.strip() == digest == hashlib.sha256((simbed.PYPI_ROOT / name).read_bytes()).hexdigest(), name
    assert simbed.nccl_index_downloads() == before + 3


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
