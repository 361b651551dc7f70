"""The rest of deploys/prepare.py: persistence, RoCE, NCCL env and pin, the SSH mesh, no stale container."""

import shlex

import pytest

from sparkinfra.facts.fabric import RoceGidTable, roce_v2_index
from sparkinfra.facts.nccl import NcclVersion
from sparkinfra.operations.mesh import MESH_KEY
from sparkinfra.operations.nccl import NCCL_ENV_FILE, nccl_variables

IB_MTUS = (256, 512, 1024, 2048, 4096)


def test_fabric_config_comes_back_at_boot(node):
    if not node.cluster.config.fabric_persist:
        pytest.skip("fabric_persist is off: the site persists the fabric config")
    fabric = node.cluster.fabric
    address = f"{node.node.fabric_ip}/{fabric.subnet.prefixlen}"
    netplan = node.root("cat /etc/netplan/60-sparkinfra-fabric.yaml")
    if netplan.rc == 0:
        assert address in netplan.stdout and f"mtu: {fabric.mtu}" in netplan.stdout
    else:
        unit = node.root("systemctl is-enabled sparkinfra-fabric.service; cat /etc/systemd/system/sparkinfra-fabric.service")
        assert unit.stdout.startswith("enabled"), unit.stdout + unit.stderr
        assert f"ip addr replace {address} dev {fabric.interface}" in unit.stdout
        assert f"mtu {fabric.mtu}" in unit.stdout


def test_roce_port_active_at_fabric_mtu(node):
    """ibv_devinfo: the port is active and RoCE runs at the largest IB MTU the fabric MTU carries."""
    fabric = node.cluster.fabric
    expected = max(m for m in IB_MTUS if m + 96 <= fabric.mtu)  # 4200 -> 4096
    for device in fabric.rdma_devices:
        out = node.host.check_output(f"ibv_devinfo -d {device} -i {fabric.rdma_port}")
        assert "PORT_ACTIVE" in out, f"{node} {device}: {out}"
        assert f"active_mtu:\t\t{expected} " in out, f"{node} {device}: want active_mtu {expected}: {out}"


def _live_gid_index(node, device):
    fabric = node.cluster.fabric
    rows = node.fact(RoceGidTable, device=device, port=fabric.rdma_port) or []
    return roce_v2_index(rows, str(node.node.fabric_ip), fabric.interface), rows


def test_nccl_env_file_is_root_only(node):
    st = node.root(f"stat -c '%U %G %a' {NCCL_ENV_FILE}").stdout.split()
    assert st == ["root", "root", "600"], f"{node}: {st}"


def test_nccl_env_has_this_nodes_gid_index(node):
    """The env file's index is the RoCE v2 row of the fabric IPv4 on every HCA NCCL uses."""
    env = node.nccl_env()
    for device in node.cluster.fabric.rdma_devices:
        index, rows = _live_gid_index(node, device)
        assert index is not None, f"{node}: no RoCE v2 GID for {node.node.fabric_ip} on {device}: {rows}"
        assert index not in (0, 1)
        assert env.get("NCCL_IB_GID_INDEX") == str(index), (
            f"{node}: env file says GID index {env.get('NCCL_IB_GID_INDEX')}, {device}'s table says {index}"
        )


def test_nccl_env_matches_settings(node):
    expected = nccl_variables(node.cluster)
    for key, value in node.cluster.config.nccl_env_overrides.items():
        if value is None:
            expected.pop(key, None)
        else:
            expected[key] = value
    env = node.nccl_env()
    env.pop("NCCL_IB_GID_INDEX", None)
    if "NCCL_IB_GID_INDEX" in node.cluster.config.nccl_env_overrides:
        expected.pop("NCCL_IB_GID_INDEX", None)
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
