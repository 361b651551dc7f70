"""The rest of deploys/prepare.py: persistence, RoCE, NCCL env and pin, the SSH mesh, no stale container."""

import shlex

import pytest

from sparkinfra import roce
from sparkinfra.facts.nccl import NcclPin, NcclVersion
from sparkinfra.node.paths import MESH_KEY, NCCL_ENV_FILE, NCCL_PIN_RECORD
from sparkinfra.operations.nccl import nccl_variables

IB_MTUS = (256, 512, 1024, 2048, 4096)


def test_fabric_config_comes_back_at_boot(node):
    """Both twins' addresses and the MTU are in the boot-time config (netplan, else our unit)."""
    if not node.cluster.config.fabric_persist:
        pytest.skip("fabric_persist is off: the site persists the fabric config")
    fabric, port = node.cluster.fabric, node.port()
    links = [(fabric.interface, f"{node.node.fabric_ip}/{fabric.subnet.prefixlen}")]
    links += [(port.twin, fabric.twin_address(node.node.fabric_ip))] if port.twin else []
    netplan = node.root("cat /etc/netplan/60-sparkinfra-fabric.yaml")
    if netplan.rc == 0:
        for netdev, address in links:
            assert f"{netdev}:" in netplan.stdout and address in netplan.stdout, f"{node}: {netdev} {address}"
        assert f"mtu: {fabric.mtu}" in netplan.stdout
    else:
        unit = node.root("systemctl is-enabled sparkinfra-fabric.service; cat /etc/systemd/system/sparkinfra-fabric.service")
        assert unit.stdout.startswith("enabled"), unit.stdout + unit.stderr
        for netdev, address in links:
            assert f"ip addr replace {address} dev {netdev}" in unit.stdout, f"{node}: {netdev} {address}"
            assert f"ip link set dev {netdev} mtu {fabric.mtu}" in unit.stdout, f"{node}: {netdev} MTU"


def test_roce_port_active_at_fabric_mtu_on_both_twins(node):
    """ibv_devinfo: each HCA's port is active and RoCE runs at the largest IB MTU the fabric MTU
    carries (a twin left at 1500 shows 1024)."""
    fabric = node.cluster.fabric
    expected = max(m for m in IB_MTUS if m + 96 <= fabric.mtu)  # 4200 -> 4096
    port = node.port()
    assert port.devices and not port.problems, f"{node}: {port.problems}"
    for device in port.devices:
        out = node.host.check_output(f"ibv_devinfo -d {device} -i {fabric.rdma_port}")
        assert "PORT_ACTIVE" in out, f"{node} {device}: {out}"
        assert f"active_mtu:\t\t{expected} " in out, f"{node} {device}: want active_mtu {expected}: {out}"


def test_nccl_env_file_is_root_only(node):
    st = node.root(f"stat -c '%U %G %a' {NCCL_ENV_FILE}").stdout.split()
    assert st == ["root", "root", "600"], f"{node}: {st}"


def test_nccl_env_names_both_twins_and_each_ones_own_gid_row(node):
    """``NCCL_IB_HCA`` is the port's HCAs (both twins); the row NCCL uses on each (the env's index, or
    where the twins' rows differ its own choice) is an IPv4 RoCE v2 row of that HCA's own netdev, the
    fabric HCA's the fabric IP; and the env holds what prepare would write from the tables now."""
    env, port = node.nccl_env(), node.port()
    assert not port.problems, f"{node}: {port.problems}"
    overrides = node.cluster.config.nccl_env_overrides
    if "NCCL_IB_HCA" not in overrides:
        assert env.get("NCCL_IB_HCA") == ",".join(port.devices), f"{node}: NCCL_IB_HCA {env.get('NCCL_IB_HCA')}, port {port.hcas}"
    tables = node.gid_tables(port)
    index = env.get("NCCL_IB_GID_INDEX", "")
    problems = roce.index_problems(port, tables, str(node.node.fabric_ip), index)
    assert not problems, f"{node}: {'; '.join(problems)}"
    if "NCCL_IB_GID_INDEX" not in overrides:
        choice = roce.gid_choice(port, tables, str(node.node.fabric_ip), node.cluster.config.nccl_version)
        assert index == choice.index, f"{node}: the env says index {index or 'unset'}, the tables now give {choice}"


def test_nccl_env_matches_settings(node):
    expected = nccl_variables(node.cluster)
    for key, value in node.cluster.config.nccl_env_overrides.items():
        if value is None:
            expected.pop(key, None)
        else:
            expected[key] = value
    env = node.nccl_env()
    for key in ("NCCL_IB_GID_INDEX", "NCCL_IB_HCA"):  # read on the node (the test above)
        if key not in expected:
            env.pop(key, None)
    assert env == expected


def test_nccl_pin_reports_the_wanted_version(node):
    config = node.cluster.config
    command = NcclVersion().command(config.nccl_library)
    out = node.host.run(command.get_raw_value())
    found = NcclVersion().process(out.stdout.splitlines())
    assert found == config.nccl_version, (
        f"{node}: {config.nccl_library} reports NCCL {found}, settings want {config.nccl_version} "
        f"({out.stdout.strip()} {out.stderr.strip()})"
    )


def test_the_pin_is_one_build_on_every_node_and_recorded(cluster):
    """Identity, not version: every node holds the same bytes (sha256) at nccl_library, and its
    record (sha256, ELF build-id, source) says so."""
    config = cluster[0].cluster.config
    pins = {str(t): t.fact(NcclPin, path=config.nccl_library, record=NCCL_PIN_RECORD) for t in cluster}
    builds = {node: pin["sha256"] for node, pin in pins.items()}
    assert None not in builds.values() and len(set(builds.values())) == 1, f"{config.nccl_library} differs: {builds}"
    for node, pin in pins.items():
        record = pin["record"] or {}
        assert record.get("sha256") == pin["sha256"] and record.get("build_id"), f"{node}: {NCCL_PIN_RECORD} is {record}"


def test_head_reaches_every_worker_over_the_fabric_as_its_user(cluster):
    head = next(t for t in cluster if t.node.rank == 0)
    for worker in (t for t in cluster if t.node.rank > 0):
        out = head.root(f"ssh -o ConnectTimeout=5 {worker.node.fabric_ip} id -un")
        assert out.rc == 0 and out.stdout.strip() == worker.node.ssh_user, (
            f"{head} -> {worker} ({worker.node.fabric_ip}) with {MESH_KEY}: rc {out.rc} {out.stdout}{out.stderr}"
        )


def test_no_stale_lane_container(node):
    name = node.cluster.config.container_name
    out = node.root(
        f"docker ps -a --filter name=^{shlex.quote(name)}$ --format '{{{{.Status}}}}'"
    )
    assert out.rc == 0, out.stderr
    stale = [s for s in out.stdout.splitlines() if s and not s.startswith("Up")]
    assert not stale, f"{node}: stale {name} container: {stale}"


def test_gpu_clock_is_locked_as_set(node):
    """A set gpu_clock_cap: its unit ran nvidia-smi -lgc with the range and holds it; unset: no unit of ours."""
    cap, unit = node.cluster.config.gpu_clock_cap, "sparkinfra-gpu-clocks.service"
    service = node.host.service(unit)
    if not cap:
        assert not node.host.file(f"/etc/systemd/system/{unit}").exists, f"{node}: {unit} is left from a lock"
        return
    assert service.is_running and service.is_enabled, f"{node}: {unit} is not active and enabled"
    started = node.root(f"systemctl show -p ExecMainStatus --value {unit}").stdout.strip()
    command = node.root(f"systemctl show -p ExecStart --value {unit}").stdout
    assert f"-lgc {cap}" in command and started == "0", f"{node}: {unit} ran {command!r} with status {started}"
