"""
Templates under ``templates/``, rendered exactly as pyinfra's ``files.template`` renders them
(``pyinfra.api.util.get_template``: StrictUndefined, keep_trailing_newline) with the values
``deploys/prepare.py`` / ``sparkinfra.operations`` pass, compared with golden files in
``tests/unit/golden/``; and ``sparkinfra.nccl.nccl_variables``, which decides the env file.

To rewrite the golden files after a deliberate template change (then read the diff):
``SPARKINFRA_REGOLD=1 pytest tests/unit/test_templates.py``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from jinja2 import UndefinedError
from pyinfra.api.util import get_template
from spark_cluster import load_cluster

from sparkinfra.operations.nccl import nccl_variables
from sparkinfra.settings import DEFAULT_NCCL_ENV

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates" / "etc"
GOLDEN = Path(__file__).resolve().parent / "golden"

NCCL_ENV = TEMPLATES / "sparkinfra" / "nccl.env.j2"
FABRIC_UNIT = TEMPLATES / "systemd" / "system" / "sparkinfra-fabric.service.j2"
NETPLAN = TEMPLATES / "netplan" / "60-sparkinfra-fabric.yaml.j2"

# Both twins of a GB10's cabled port: the fabric address on one, a link-local one on the other.
FABRIC = {"links": [{"interface": "enp1s0f0np0", "address": "192.168.192.1/24"},
                    {"interface": "enP2p1s0f0np0", "address": "169.254.192.1/16"}], "mtu": 4200}
ONE = {"links": [{"interface": "enp1s0f1np1", "address": "10.213.1.2/24"}], "mtu": 9000}


def render(template: Path, **data) -> str:
    """Render as ``files.template`` does (its data also carries host/state/inventory)."""
    data.setdefault("host", None)
    data.setdefault("state", None)
    data.setdefault("inventory", None)
    return get_template(str(template)).render(data)


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("SPARKINFRA_REGOLD"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"render differs from {path}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    return load_cluster(tmp_path_factory.mktemp("templates"))


def env_file_variables(cluster, gid_index: int = 3) -> list[tuple[str, str]]:
    """What ``operations.nccl_environment`` passes the template (no overrides)."""
    env = dict(nccl_variables(cluster))
    env["NCCL_IB_HCA"] = "rocep1s0f0,roceP2p1s0f0"  # read on the node: both twins of the fabric port
    env["NCCL_IB_GID_INDEX"] = str(gid_index)
    return sorted(env.items())


# nccl.env
# --------


def test_nccl_env_golden(cluster):
    golden("nccl.env", render(NCCL_ENV, variables=env_file_variables(cluster)))


def test_nccl_env_is_one_variable_per_line(cluster):
    variables = env_file_variables(cluster)
    text = render(NCCL_ENV, variables=variables)
    assert text.endswith("\n") and not text.endswith("\n\n")
    header, *body = text.splitlines()
    assert header.startswith("# Managed by sparkinfra")
    assert body == [f"{k}={v}" for k, v in variables]
    assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*=\S+", line) for line in body), body
    assert "" not in body
    assert "NCCL_IB_GID_INDEX=3" in body


def test_nccl_env_with_overrides_applied(cluster):
    # As nccl_environment applies nccl_env_overrides: a value replaces, None removes.
    env = dict(env_file_variables(cluster, gid_index=5))
    overrides = {"NCCL_DEBUG": "INFO", "NCCL_NET_GDR_LEVEL": None, "NCCL_IB_QPS_PER_CONNECTION": "4"}
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    body = render(NCCL_ENV, variables=sorted(env.items())).splitlines()[1:]
    assert "NCCL_DEBUG=INFO" in body and "NCCL_IB_QPS_PER_CONNECTION=4" in body
    assert not any(line.startswith("NCCL_NET_GDR_LEVEL=") for line in body)
    assert "NCCL_IB_GID_INDEX=5" in body
    assert body == sorted(body)


def test_nccl_env_needs_its_variables():
    with pytest.raises(UndefinedError):
        render(NCCL_ENV)


# The fabric's boot-time config
# -----------------------------


def test_fabric_unit_golden():
    golden("sparkinfra-fabric.service", render(FABRIC_UNIT, **FABRIC))


def test_fabric_unit_sets_mtu_address_and_up_on_both_twins():
    text = render(FABRIC_UNIT, **FABRIC)
    assert [line for line in text.splitlines() if line.startswith("ExecStart=")] == [
        "ExecStart=/sbin/ip link set dev enp1s0f0np0 mtu 4200",
        "ExecStart=/sbin/ip addr replace 192.168.192.1/24 dev enp1s0f0np0",
        "ExecStart=/sbin/ip link set dev enp1s0f0np0 up",
        "ExecStart=/sbin/ip link set dev enP2p1s0f0np0 mtu 4200",
        "ExecStart=/sbin/ip addr replace 169.254.192.1/16 dev enP2p1s0f0np0",
        "ExecStart=/sbin/ip link set dev enP2p1s0f0np0 up",
    ]
    sections = re.findall(r"^\[(\w+)\]$", text, flags=re.M)
    assert sections == ["Unit", "Service", "Install"]
    assert "Type=oneshot" in text.splitlines() and "RemainAfterExit=yes" in text.splitlines()
    assert "WantedBy=multi-user.target" in text.splitlines()
    assert "{{" not in text and "}}" not in text


def test_fabric_unit_other_values():
    text = render(FABRIC_UNIT, **ONE)
    assert "Description=sparkinfra fabric port enp1s0f1np1 (10.213.1.2/24, MTU 9000)" in text
    assert "ExecStart=/sbin/ip addr replace 10.213.1.2/24 dev enp1s0f1np1" in text
    assert "enp1s0f0np0" not in text


def test_fabric_unit_waits_for_its_device():
    """Without udev device units (containers) too: an ExecStartPre waits for the netdev first."""
    lines = render(FABRIC_UNIT, **FABRIC).splitlines()
    waits = [i for i, line in enumerate(lines) if line.startswith("ExecStartPre=")]
    for wait, netdev in zip(waits, ("enp1s0f0np0", "enP2p1s0f0np0"), strict=True):
        assert f"/sys/class/net/{netdev}" in lines[wait] and "exit 1" in lines[wait]
    assert max(waits) < min(i for i, line in enumerate(lines) if line.startswith("ExecStart="))


def test_netplan_golden():
    golden("60-sparkinfra-fabric.yaml", render(NETPLAN, **FABRIC))


def test_netplan_is_valid_yaml_with_the_fabric():
    doc = yaml.safe_load(render(NETPLAN, **FABRIC))
    assert doc == {
        "network": {
            "version": 2,
            "ethernets": {
                "enp1s0f0np0": {
                    "dhcp4": False,
                    "addresses": ["192.168.192.1/24"],
                    "mtu": 4200,
                    "optional": True,
                },
                "enP2p1s0f0np0": {
                    "dhcp4": False,
                    "addresses": ["169.254.192.1/16"],
                    "mtu": 4200,
                    "optional": True,
                },
            },
        }
    }


def test_netplan_other_values():
    doc = yaml.safe_load(render(NETPLAN, **ONE))
    assert doc["network"]["ethernets"] == {
        "enp1s0f1np1": {"dhcp4": False, "addresses": ["10.213.1.2/24"], "mtu": 9000, "optional": True}
    }


# nccl_variables
# --------------

ADDED = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES", "VLLM_NCCL_SO_PATH", "LD_PRELOAD")


def test_nccl_variables_defaults(cluster):
    env = nccl_variables(cluster)
    for key, value in DEFAULT_NCCL_ENV.items():
        assert env[key] == value, key
    assert "NCCL_IB_HCA" not in env  # the twins of the fabric port, read per node when the file is written
    for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES"):
        assert env[key] == "enp1s0f0np0"
    assert env["VLLM_NCCL_SO_PATH"] == env["LD_PRELOAD"] == "/opt/nccl/lib/libnccl.so.2"
    assert "NCCL_IB_GID_INDEX" not in env  # read per node when the file is written
    assert set(env) == set(DEFAULT_NCCL_ENV) | set(ADDED)
    assert all(isinstance(v, str) for v in env.values())


def test_nccl_variables_follow_the_fabric_and_pin(tmp_path):
    cluster = load_cluster(tmp_path, {
        "fabric_interface": "enp1s0f1np1",
        "rdma_devices": ["rocep1s0f1"],
        "nccl_library": "/usr/local/nccl-2.30.7/lib/libnccl.so.2",
    })
    env = nccl_variables(cluster)
    assert env["NCCL_IB_HCA"] == "rocep1s0f1"  # named by the site: every node uses these
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == env["UCX_NET_DEVICES"] == "enp1s0f1np1"
    assert env["VLLM_NCCL_SO_PATH"] == env["LD_PRELOAD"] == "/usr/local/nccl-2.30.7/lib/libnccl.so.2"


def test_custom_nccl_env_replaces_the_defaults(tmp_path):
    cluster = load_cluster(tmp_path, {"nccl_env": {"NCCL_DEBUG": "WARN", "NCCL_IB_TIMEOUT": "22"}})
    env = nccl_variables(cluster)
    assert set(env) == {"NCCL_DEBUG", "NCCL_IB_TIMEOUT", *ADDED}
    assert env["NCCL_DEBUG"] == "WARN" and env["NCCL_IB_TIMEOUT"] == "22"
    del env["NCCL_DEBUG"]
    assert not set(DEFAULT_NCCL_ENV) & set(env)


def test_nccl_env_cannot_displace_the_per_node_variables(tmp_path):
    # The fabric's and the pin's variables are added on top of nccl_env (only
    # nccl_env_overrides, applied later, may change them).
    cluster = load_cluster(tmp_path, {"nccl_env": {"NCCL_SOCKET_IFNAME": "eth0", "LD_PRELOAD": "/tmp/x.so"}})
    env = nccl_variables(cluster)
    assert env["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0"
    assert env["LD_PRELOAD"] == "/opt/nccl/lib/libnccl.so.2"


def test_nccl_variables_leave_the_settings_alone(cluster):
    before = dict(cluster.config.nccl_env)
    env = nccl_variables(cluster)
    env["NCCL_NET"] = "changed"
    assert cluster.config.nccl_env == before == DEFAULT_NCCL_ENV
