"""
The settings model: bad settings are refused naming the file (or ``--data``) and the key,
in every layer pyinfra reads; good settings build the right clusters; and the refusal
happens while the inventory loads, before pyinfra connects to any host.

Most cases build a small project in ``tmp_path`` (``inventory/lab.py`` + ``group_data/``)
and call ``load_settings`` in-process; a handful run the real ``pyinfra`` command line
against a local listening socket to prove no connection is attempted.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest
from pydantic import ValidationError
from pyinfra.api import State
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory_from_files

from sparkinfra import settings
from sparkinfra.run import InventorySettingsError, checked_settings, parse_data
from sparkinfra.settings import (
    CLUSTER_KEYS,
    Settings,
    SettingsError,
    cluster_problem,
    container_problem,
    env_value_problem,
    host_name_problem,
    image_problem,
    interface_problem,
    lane_problem,
    model_id_problem,
    node_path_problem,
    rdma_device_problem,
    revision_problem,
    ssh_host_problem,
    ssh_user_problem,
)

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"

INV = "inventory/lab.py"
GLAB = "group_data/lab.py"
GALL = "group_data/all.py"
DATA = "--data"

# group_data/lab.py of a good project (the inventory file's stem is the group ``lab``).
LAB_GROUP = 'cluster = "lab"\nfabric_subnet = "10.0.0.0/24"\n'


# Building projects
# -----------------


def two(n0: dict | None = None, n1: dict | None = None) -> list[tuple[str, dict]]:
    """Two good hosts (n0 head, n1 worker), with changes; a value of None drops the key."""
    hosts = []
    for name, base, change in (
        ("n0", {"rank": 0, "fabric_ip": "10.0.0.1"}, n0),
        ("n1", {"rank": 1, "fabric_ip": "10.0.0.2"}, n1),
    ):
        data = {**base, **(change or {})}
        hosts.append((name, {k: v for k, v in data.items() if v is not None}))
    return hosts


def inv(hosts: list, group_data: dict | None = None, extra: str = "") -> str:
    """Text of inventory/lab.py: group ``lab`` (with inventory group data if given)."""
    body = repr(hosts) if group_data is None else f"({hosts!r}, {group_data!r})"
    return f"lab = {body}\n{extra}"


def proj(files: dict[str, str | None] | None = None, inventory: str | None = None) -> dict[str, str]:
    """A good project's files, changed by ``files`` (None removes a file)."""
    out: dict[str, str] = {INV: inventory if inventory is not None else inv(two()), GLAB: LAB_GROUP}
    for path, text in (files or {}).items():
        if text is None:
            out.pop(path, None)
        else:
            out[path] = text
    return out


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def load(root: Path, data: tuple[str, ...] = (), name: str = "lab") -> Settings:
    """Build the inventory as pyinfra's CLI does (from ``root``) and load its settings."""
    with ctx_state.use(State()):
        # An absolute path: pyinfra caches compiled files by the name it is given.
        inventory = make_inventory_from_files(str(root / "inventory" / f"{name}.py"), parse_data(data), str(root))
        return checked_settings(inventory, inventory_file=f"inventory/{name}.py", cwd=str(root))


@pytest.fixture
def project(tmp_path, monkeypatch):
    """Write a project into tmp_path and load it from there, as pyinfra would run in it."""
    monkeypatch.chdir(tmp_path)

    def run(files: dict[str, str], data: tuple[str, ...] = ()) -> Settings:
        write(tmp_path, files)
        return load(tmp_path, data)

    return run


def expect_error(project, files, data, source, key, host, says) -> str:
    with pytest.raises(SettingsError) as info:
        project(files, data)
    message = str(info.value)
    prefix = f"{source}, key '{key}' (host {host}): "
    assert message.startswith(prefix), f"expected {prefix!r}..., got {message!r}"
    assert says in message, f"expected {says!r} in {message!r}"
    return message


# The corpus of bad settings
# --------------------------


@dataclass
class Bad:
    id: str
    files: dict[str, str]
    source: str  # the file (relative) or --data the message must name
    key: str
    host: str
    says: str
    data: tuple[str, ...] = field(default=())


BAD = [
    # Ranks: unique, a head (0), no gaps.
    Bad("rank-duplicate/inventory-host", proj(inventory=inv(two(n1={"rank": 0}))),
        INV, "rank", "n1", "rank 0 is given to both n0 and n1"),
    Bad("rank-duplicate/group_data-group",
        proj({GLAB: LAB_GROUP + "rank = 0\n"}, inventory=inv(two(n0={"rank": None}, n1={"rank": None}))),
        GLAB, "rank", "n1", "rank 0 is given to both n0 and n1"),
    Bad("rank-duplicate/--data", proj(), DATA, "rank", "n1", "rank 1 is given to both n0 and n1",
        ("rank=1",)),
    Bad("rank-no-head/inventory-host", proj(inventory=inv(two(n0={"rank": 2}))),
        INV, "rank", "n1", "cluster lab has no rank 0 (head)"),
    Bad("rank-no-head/inventory-group",
        proj(inventory=inv([("n0", {"fabric_ip": "10.0.0.1"})], {"rank": 1})),
        INV, "rank", "n0", "cluster lab has no rank 0 (head)"),
    Bad("rank-gap/inventory-host", proj(inventory=inv(two(n1={"rank": 2}))),
        INV, "rank", "n1", "ranks of cluster lab must be 0..1; 2 given, 1 missing"),
    Bad("rank-gap/group_data-all", proj({GALL: "rank = 2\n"}, inventory=inv(two(n1={"rank": None}))),
        GALL, "rank", "n1", "2 given, 1 missing"),
    # Fabric addresses: inside the subnet, host addresses, unique.
    Bad("fabric-ip-outside-subnet/inventory-host", proj(inventory=inv(two(n1={"fabric_ip": "10.0.1.2"}))),
        INV, "fabric_ip", "n1", "10.0.1.2 is outside the fabric subnet 10.0.0.0/24"),
    Bad("fabric-ip-outside-subnet/--data", proj(),
        DATA, "fabric_ip", "n0", "10.9.9.9 is outside the fabric subnet 10.0.0.0/24", ("fabric_ip=10.9.9.9",)),
    Bad("fabric-ip-duplicate/inventory-host", proj(inventory=inv(two(n1={"fabric_ip": "10.0.0.1"}))),
        INV, "fabric_ip", "n1", "10.0.0.1 is given to both n0 and n1"),
    Bad("fabric-ip-duplicate/--data", proj(),
        DATA, "fabric_ip", "n1", "10.0.0.7 is given to both n0 and n1", ("fabric_ip=10.0.0.7",)),
    Bad("fabric-ip-network-address/inventory-host", proj(inventory=inv(two(n0={"fabric_ip": "10.0.0.0"}))),
        INV, "fabric_ip", "n0", "10.0.0.0 is not a host address of 10.0.0.0/24"),
    Bad("fabric-ip-broadcast-address/inventory-host", proj(inventory=inv(two(n1={"fabric_ip": "10.0.0.255"}))),
        INV, "fabric_ip", "n1", "10.0.0.255 is not a host address of 10.0.0.0/24"),
    Bad("fabric-ip-broadcast-address/inventory-group",
        proj(inventory=inv([("n0", {"rank": 0})], {"fabric_ip": "10.0.0.255"})),
        INV, "fabric_ip", "n0", "10.0.0.255 is not a host address of 10.0.0.0/24"),
    Bad("fabric-ip-broadcast-address/group_data-all-subnet",
        proj({GLAB: 'cluster = "lab"\n', GALL: 'fabric_subnet = "10.0.0.0/30"\n'},
             inventory=inv(two(n1={"fabric_ip": "10.0.0.3"}))),
        INV, "fabric_ip", "n1", "10.0.0.3 is not a host address of 10.0.0.0/30"),
    # MTU: 1280..9216.
    Bad("fabric-mtu-70000/group_data-all", proj({GALL: "fabric_mtu = 70000\n"}),
        GALL, "fabric_mtu", "n0", "must be 9216 or less (got 70000): 9216 is the largest jumbo frame"),
    Bad("fabric-mtu-70000/group_data-group", proj({GLAB: LAB_GROUP + "fabric_mtu = 70000\n"}),
        GLAB, "fabric_mtu", "n0", "must be 9216 or less (got 70000): 9216 is the largest jumbo frame"),
    Bad("fabric-mtu-70000/inventory-dir-group_data",
        proj({GLAB: LAB_GROUP + "fabric_mtu = 9000\n", "inventory/group_data/lab.py": "fabric_mtu = 70000\n"}),
        "inventory/group_data/lab.py", "fabric_mtu", "n0", "(got 70000)"),
    Bad("fabric-mtu-70000/--data-over-group_data-all", proj({GALL: "fabric_mtu = 9000\n"}),
        DATA, "fabric_mtu", "n0", "(got 70000)", ("fabric_mtu=70000",)),
    Bad("fabric-mtu-1000/--data", proj(),
        DATA, "fabric_mtu", "n0", "must be 1280 or more (got 1000): 1280 is IPv6's minimum link MTU", ("fabric_mtu=1000",)),
    Bad("fabric-mtu-1000/inventory-group", proj(inventory=inv(two(), {"fabric_mtu": 1000})),
        INV, "fabric_mtu", "n0", "must be 1280 or more (got 1000): 1280 is IPv6's minimum link MTU"),
    Bad("fabric-mtu-1000/group_data-group-over-inventory-group",
        proj({GLAB: LAB_GROUP + "fabric_mtu = 1000\n"}, inventory=inv(two(), {"fabric_mtu": 9000})),
        GLAB, "fabric_mtu", "n0", "(got 1000)"),
    Bad("fabric-mtu-1000/inventory-host-over-group_data", proj(
        {GLAB: LAB_GROUP + "fabric_mtu = 9000\n"},
        inventory=inv(two(n0={"fabric_mtu": 1000}, n1={"fabric_mtu": 1000}))),
        INV, "fabric_mtu", "n0", "(got 1000)"),
    # Unknown keys (typos).
    Bad("unknown-key/group_data-group", proj({GLAB: LAB_GROUP + "fabric_mtuu = 9000\n"}),
        GLAB, "fabric_mtuu", "n0", "unknown key"),
    Bad("unknown-key/group_data-all", proj({GALL: "fabric_mtuu = 9000\n"}),
        GALL, "fabric_mtuu", "n0", "unknown key"),
    Bad("unknown-key/--data", proj(), DATA, "fabric_mtuu", "n0", "unknown key", ("fabric_mtuu=9000",)),
    Bad("unknown-key/inventory-host", proj(inventory=inv(two(n1={"fabric_mtuu": 9000}))),
        INV, "fabric_mtuu", "n1", "unknown key"),
    Bad("unknown-key/inventory-group", proj(inventory=inv(two(), {"fabrc_interface": "eth0"})),
        INV, "fabrc_interface", "n0", "unknown key"),
    # Wrong types.
    Bad("type-rank-zero/inventory-host", proj(inventory=inv(two(n0={"rank": "zero"}))),
        INV, "rank", "n0", "(got 'zero')"),
    Bad("type-fabric-mtu-big/--data", proj(), DATA, "fabric_mtu", "n0", "(got 'big')", ("fabric_mtu=big",)),
    Bad("type-rdma-devices-5/group_data-all", proj({GALL: "rdma_devices = 5\n"}),
        GALL, "rdma_devices", "n0", "(got 5)"),
    Bad("type-rdma-devices-item/--data", proj(),
        DATA, "rdma_devices", "n0", "(got 5)", ('rdma_devices=["rocep1s0f0", 5]',)),
    Bad("type-fabric-subnet-not-a-net/inventory-group",
        proj({GLAB: 'cluster = "lab"\n'}, inventory=inv(two(), {"fabric_subnet": "not-a-net"})),
        INV, "fabric_subnet", "n0", "(got 'not-a-net')"),
    Bad("type-fabric-subnet-not-a-net/group_data-group", proj({GLAB: 'fabric_subnet = "not-a-net"\n'}),
        GLAB, "fabric_subnet", "n0", "(got 'not-a-net')"),
    # Cluster-level keys must agree on every node of a cluster.
    Bad("cluster-key-differs/inventory-host", proj(inventory=inv(two(n1={"fabric_mtu": 9000}))),
        INV, "fabric_mtu", "n1", "9000 differs from 4200 on n0: every node of cluster lab must agree"),
    Bad("cluster-key-differs/inventory-group",
        proj(inventory=inv(two(), extra='gpu = (["n1"], {"image": "other:1"})\n')),
        INV, "image", "n1", "'other:1' differs from 'vllm-node:latest' on n0"),
    Bad("cluster-key-differs/group_data-group",
        proj({"group_data/gpu.py": "rdma_port = 2\n"}, inventory=inv(two(), extra='gpu = ["n1"]\n')),
        "group_data/gpu.py", "rdma_port", "n1", "2 differs from 1 on n0"),
    # A full teardown is confirmed with the cluster's name; unset, the error names where it was asked.
    Bad("teardown-full-unconfirmed/--data", proj(), DATA, "teardown_confirm", "n0",
        "teardown=full removes what sparkinfra installed on cluster lab: confirm with teardown_confirm=lab (not set)",
        ("teardown=full",)),
    Bad("teardown-full-unconfirmed/group_data-group", proj({GLAB: LAB_GROUP + 'teardown = "full"\n'}),
        GLAB, "teardown_confirm", "n0", "confirm with teardown_confirm=lab (not set)"),
    Bad("teardown-full-wrong-cluster/--data", proj(), DATA, "teardown_confirm", "n0",
        "confirm with teardown_confirm=lab (got 'pair')", ("teardown=full", "teardown_confirm=pair")),
    Bad("teardown-full-wrong-cluster/group_data-group-over-data",
        proj({GLAB: LAB_GROUP + 'teardown_confirm = "pair"\n'}), GLAB, "teardown_confirm", "n0",
        "(got 'pair')", ("teardown=full",)),
    Bad("teardown-unknown/--data", proj(), DATA, "teardown", "n0", "'lanes' or 'full' (got 'all')",
        ("teardown=all",)),
    Bad("teardown-differs/inventory-host",
        proj(inventory=inv(two(n1={"teardown": "full", "teardown_confirm": "lab"}))),
        INV, "teardown", "n1", "'full' differs from 'lanes' on n0: every node of cluster lab must agree"),
    # SSH hostnames (here only, in process: the corpus's nodes must stay on 127.0.0.1).
    Bad("ssh-hostname-space/inventory-host", proj(inventory=inv(two(n1={"ssh_hostname": "reddie local"}))),
        INV, "ssh_hostname", "n1", "'reddie local' is neither an IPv4 address nor a DNS name"),
    Bad("ssh-hostname-option/inventory-host", proj(inventory=inv(two(n0={"ssh_hostname": "-oProxyCommand=sh"}))),
        INV, "ssh_hostname", "n0", "'-oProxyCommand=sh' is neither an IPv4 address nor a DNS name"),
    Bad("ssh-hostname-bad-ipv4/--data", proj(), DATA, "ssh_hostname", "n0", "'10.0.0.300' is not an IPv4 address",
        ("ssh_hostname=10.0.0.300",)),
    Bad("ssh-hostname-label-dash/group_data-group", proj({GLAB: LAB_GROUP + 'ssh_hostname = "spark-.lab"\n'}),
        GLAB, "ssh_hostname", "n0", "'spark-' is not a DNS label"),
    # A typo gets the nearest key, a setting's or one of pyinfra's.
    Bad("unknown-key-near/group_data-group", proj({GLAB: LAB_GROUP + "fabrc_mtu = 9000\n"}),
        GLAB, "fabrc_mtu", "n0", "unknown key — did you mean 'fabric_mtu'?"),
    Bad("unknown-key-near-ssh/inventory-host", proj(inventory=inv(two(n1={"ssh_hostnme": "10.1.0.2"}))),
        INV, "ssh_hostnme", "n1", "unknown key — did you mean 'ssh_hostname'?"),
    Bad("unknown-key-far/group_data-all", proj({GALL: "colour = 'blue'\n"}),
        GALL, "colour", "n0", "unknown key: neither a setting (docs/settings.md) nor one of pyinfra's ssh_* keys"),
]


@pytest.mark.parametrize("case", BAD, ids=[case.id for case in BAD])
def test_bad_settings_name_file_and_key(project, case):
    expect_error(project, case.files, case.data, case.source, case.key, case.host, case.says)


def test_corpus_covers_every_layer():
    sources = {case.source for case in BAD}
    assert {INV, GLAB, GALL, DATA, "group_data/gpu.py", "inventory/group_data/lab.py"} <= sources
    layers = {case.id.split("/", 1)[1].split("-over-")[0] for case in BAD}
    assert {"inventory-host", "inventory-group", "group_data-group", "group_data-all", "--data"} <= layers


@pytest.mark.parametrize(
    "files, key, host",
    [
        pytest.param(proj(inventory=inv(two(n1={"fabric_ip": None}))), "fabric_ip", "n1", id="no-fabric_ip"),
        pytest.param(proj({GLAB: 'cluster = "lab"\n'}), "fabric_subnet", "n0", id="no-fabric_subnet"),
    ],
)
def test_missing_required_key_is_named(project, files, key, host):
    with pytest.raises(SettingsError) as info:
        project(files)
    message = str(info.value)
    assert f"key '{key}' (host {host}): required key is missing" in message


@pytest.mark.parametrize(
    "files, key, host",
    [
        pytest.param(proj(inventory=inv(two(n1={"fabric_ip": None}))), "fabric_ip", "n1", id="no-fabric_ip"),
        pytest.param(proj({GLAB: 'cluster = "lab"\n'}), "fabric_subnet", "n0", id="no-fabric_subnet"),
    ],
)
def test_missing_required_key_names_a_file(project, files, key, host):
    with pytest.raises(SettingsError) as info:
        project(files)
    message = str(info.value)
    assert f"key '{key}' (host {host})" in message
    # Nothing supplied the key, and it has no default: at least name the file declaring the host.
    assert "the defaults" not in message
    assert INV in message


def test_cluster_key_differs_on_first_host_names_its_file(project):
    files = proj({GLAB: LAB_GROUP + "fabric_mtu = 4200\n"}, inventory=inv(two(n0={"fabric_mtu": 9000})))
    with pytest.raises(SettingsError) as info:
        project(files)
    # The only file that sets 9000 (and the only one that differs between the hosts) is the inventory.
    assert INV in str(info.value)


def test_bad_key_assigned_under_if_in_group_data_names_group_data(project):
    files = proj({GALL: "import os\nif os.sep:\n    fabric_mtu = 70000\n"})
    expect_error(project, files, (), GALL, "fabric_mtu", "n0", "(got 70000)")


def test_load_settings_names_files_relative_to_its_cwd(tmp_path, monkeypatch):
    write(tmp_path, proj({GALL: "fabric_mtu = 70000\n"}))
    monkeypatch.chdir(REPO)
    with pytest.raises(SettingsError) as info:
        load(tmp_path)
    assert str(info.value).startswith(f"{GALL}, key 'fabric_mtu' (host n0): ")


# Good settings
# -------------


def test_good_settings_build_cluster_by_rank(project):
    hosts = [
        ("w2", {"ssh_hostname": "10.1.0.12", "ssh_user": "bob", "rank": 2, "fabric_ip": "10.0.0.12"}),
        ("head", {"ssh_hostname": "10.1.0.10", "ssh_user": "nvidia", "rank": 0, "fabric_ip": "10.0.0.10"}),
        ("w1", {"rank": 1, "fabric_ip": "10.0.0.11"}),
    ]
    files = proj(
        {GLAB: LAB_GROUP + "fabric_mtu = 9000\n", GALL: '_sudo = True\nimage = "img:1"\n'},
        inventory=inv(hosts),
    )
    settings = project(files)

    assert list(settings.clusters) == ["lab"]
    cluster = settings.clusters["lab"]
    assert cluster.head.name == "head"
    assert [n.name for n in cluster.workers] == ["w1", "w2"]
    assert [n.rank for n in cluster.nodes] == [0, 1, 2]
    assert {n.name: n.ssh_user for n in cluster.nodes} == {"head": "nvidia", "w1": "root", "w2": "bob"}
    assert {n.name: n.ssh_host for n in cluster.nodes} == {"head": "10.1.0.10", "w1": "w1", "w2": "10.1.0.12"}
    assert cluster.node("w2").fabric_ip == IPv4Address("10.0.0.12")
    assert cluster.fabric.subnet == IPv4Network("10.0.0.0/24")
    assert cluster.fabric.mtu == 9000
    assert cluster.fabric.interface == "enp1s0f0np0"
    assert cluster.fabric.rdma_devices == ()  # the twins of the fabric port, read from each node
    assert cluster.config.image == "img:1"
    assert settings.cluster_of("w1") is cluster
    assert settings.node("head").rank == 0


def test_good_settings_data_overrides_every_host(project):
    settings = project(proj({GLAB: LAB_GROUP + "fabric_mtu = 9000\n"}), ("fabric_mtu=1500", "ssh_user=ops"))
    cluster = settings.clusters["lab"]
    assert cluster.fabric.mtu == 1500
    assert {n.ssh_user for n in cluster.nodes} == {"ops"}


def test_good_settings_two_clusters_in_one_inventory(project):
    hosts_a = [("a0", {"rank": 0, "fabric_ip": "10.0.0.1"}), ("a1", {"rank": 1, "fabric_ip": "10.0.0.2"})]
    hosts_b = [("b0", {"rank": 0, "fabric_ip": "10.0.0.1"})]
    files = {
        INV: f"a = {hosts_a!r}\nb = {hosts_b!r}\n",
        "group_data/lab.py": 'fabric_subnet = "10.0.0.0/24"\n',
        "group_data/a.py": 'cluster = "a"\nfabric_mtu = 9000\n',
        "group_data/b.py": 'cluster = "b"\n',
    }
    settings = project(files)
    assert sorted(settings.clusters) == ["a", "b"]
    assert [n.name for n in settings.clusters["a"].nodes] == ["a0", "a1"]
    assert settings.clusters["a"].fabric.mtu == 9000
    assert settings.clusters["b"].head.name == "b0"
    assert settings.clusters["b"].workers == ()
    assert settings.clusters["b"].fabric.mtu == 4200


def test_teardown_is_lanes_by_default_and_cluster_wide(project):
    config = project(proj()).clusters["lab"].config
    assert (config.teardown, config.teardown_confirm) == ("lanes", "")
    assert {"teardown", "teardown_confirm"} <= set(CLUSTER_KEYS)


@pytest.mark.parametrize(
    "files, data, teardown",
    [
        pytest.param(proj(), ("teardown=full", "teardown_confirm=lab"), "full", id="--data"),
        pytest.param(proj({GLAB: LAB_GROUP + 'teardown = "full"\nteardown_confirm = "lab"\n'}), (), "full",
                     id="group_data"),
        pytest.param(proj({GLAB: LAB_GROUP + 'teardown_confirm = "lab"\n'}), ("teardown=full",), "full",
                     id="group_data-confirms---data"),
        # A confirmation left in place asks for nothing by itself.
        pytest.param(proj({GLAB: LAB_GROUP + 'teardown_confirm = "lab"\n'}), (), "lanes", id="confirm-alone"),
    ],
)
def test_full_teardown_confirmed_with_the_cluster_name_is_accepted(project, files, data, teardown):
    config = project(files, data).clusters["lab"].config
    assert (config.teardown, config.teardown_confirm) == (teardown, "lab")


def test_seeds_pair(monkeypatch):
    monkeypatch.chdir(REPO)
    settings = load(REPO, name="pair")
    assert list(settings.clusters) == ["pair"]
    pair = settings.clusters["pair"]
    assert (pair.head.name, pair.head.ssh_host, pair.head.ssh_user) == ("bluey", "bluey.local", "nvidia")
    assert [(n.name, n.ssh_host, n.ssh_user) for n in pair.workers] == [("reddie", "reddie.local", "reddie")]
    assert pair.head.fabric_ip == IPv4Address("192.168.192.1")
    assert pair.node("reddie").fabric_ip == IPv4Address("192.168.192.2")
    assert pair.fabric.subnet == IPv4Network("192.168.192.0/24")
    assert pair.fabric.mtu == 4200


def test_seeds_pair_bad_data_names_data(monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(SettingsError) as info:
        load(REPO, ("fabric_mtu=70000",), name="pair")
    assert str(info.value).startswith("--data, key 'fabric_mtu' (host bluey): ")


# Identifiers, checked for where they go
# --------------------------------------

DIGEST = "sha256:" + "0123456789abcdef" * 4


def test_legitimate_unusual_values_pass(project):
    """A /8 fabric, IPv4 and dashed DNS hostnames, users with '.', '_' and '-', and names of every
    kind at the edges of their rules build a cluster."""
    hosts = [
        ("spark-head.lab-1", {"ssh_hostname": "10.1.0.10", "ssh_user": "first.last", "rank": 0,
                              "fabric_ip": "10.0.0.1"}),
        ("w1", {"ssh_hostname": "spark-w1.lab-1.example.com", "ssh_user": "svc_spark-2", "rank": 1,
                "fabric_ip": "10.254.0.2"}),
        ("10.1.0.12", {"ssh_user": "_admin", "rank": 2, "fabric_ip": "10.9.9.9"}),
    ]
    group = (
        'cluster = "lab-1.a"\nfabric_subnet = "10.0.0.0/8"\nfabric_interface = "eth0.100"\n'
        'rdma_devices = ["mlx5_0", "roceP2p1s0f0"]\ncontainer_name = "vllm_node.2-a"\n'
        f'image = "registry.example.com:5000/team/vllm-node:v0.11.0@{DIGEST}"\n'
        'model = "Org-1/Model_v1.5-AWQ"\nmodel_revision = "refs/pr/12"\ndrafter = "org/eagle3.draft"\n'
        'model_dir = "/srv/hf-cache/models@v2"\nnccl_library = "/opt/nccl-2.30.7/lib/libnccl.so.2"\n'
        'image_tarball = "/srv/images/vllm+cu13.tar"\nlane_env = {"VLLM_X": "a b=c:d \'quoted\'"}\n'
    )
    settings = project(proj({GLAB: group}, inventory=inv(hosts)))
    cluster = settings.clusters["lab-1.a"]
    assert cluster.fabric.subnet == IPv4Network("10.0.0.0/8")
    assert [(n.name, n.ssh_host, n.ssh_user) for n in cluster.nodes] == [
        ("spark-head.lab-1", "10.1.0.10", "first.last"),
        ("w1", "spark-w1.lab-1.example.com", "svc_spark-2"),
        ("10.1.0.12", "10.1.0.12", "_admin"),
    ]
    assert cluster.fabric.interface == "eth0.100"
    assert cluster.config.model_revision == "refs/pr/12"


@pytest.mark.parametrize(
    "rule, value",
    [
        (interface_problem, "enp1s0f0np0"), (interface_problem, "a" * 15), (interface_problem, "br-fabric_1.20"),
        (rdma_device_problem, "rocep1s0f0"), (rdma_device_problem, "r" * 63),
        (container_problem, "vllm_node"), (container_problem, "0.a-b_c"),
        (lane_problem, ""), (lane_problem, "pair-a-balanced"), (lane_problem, "sim.v2"),
        (host_name_problem, "spark-1"), (host_name_problem, "10.0.0.5"),
        (ssh_user_problem, "nvidia"), (ssh_user_problem, "first.last"), (ssh_user_problem, "svc_x-1"),
        (ssh_host_problem, "192.168.1.20"), (ssh_host_problem, "bluey.local"), (ssh_host_problem, "a-b.example.com."),
        (model_id_problem, "meta-llama/Llama-3.1-8B"), (model_id_problem, "org/x_y.z"), (model_id_problem, ""),
        (revision_problem, "main"), (revision_problem, "a" * 40), (revision_problem, "v1.0"),
        (image_problem, "vllm-node:latest"), (image_problem, "sparkbed/stage:1"),
        (image_problem, f"nvcr.io/nvidia/vllm@{DIGEST}"), (image_problem, "localhost:5000/a/b__c:Tag_1.2"),
        (node_path_problem, "/var/lib/sparkinfra/hf"), (node_path_problem, "/opt/a+b@c/lib.so.2"),
        (env_value_problem, "INIT,NET"), (env_value_problem, ""),
    ],
)
def test_rules_accept(rule, value):
    assert rule(value) is None


@pytest.mark.parametrize(
    "rule, value, says",
    [
        (interface_problem, "a" * 16, "is 16 characters: Linux takes at most 15"),
        (interface_problem, ".", "Linux refuses an empty name, '.' and '..'"),
        (interface_problem, "eth0:1", "holds ':'"),
        (interface_problem, "eth 0", "holds whitespace"),
        (interface_problem, "eth$0", "holds '$'"),
        (interface_problem, "eth%i", "holds '%'"),  # a specifier in a unit file
        (rdma_device_problem, "r" * 64, "at most 63"),
        (rdma_device_problem, "../mlx5_0", "holds '/'"),
        (container_problem, "-rm", "starts with '-'"),
        (container_problem, "a/b", "is a path"),
        (lane_problem, "../tiny", "is a path"),
        (lane_problem, "lanes/tiny.yaml", "is a path"),
        (lane_problem, ".tiny", "starts with '.'"),
        (lane_problem, "a..b", "holds '..'"),
        (lane_problem, "tiny lane", "holds a space"),
        (cluster_problem, "", "cannot be empty"),
        (host_name_problem, "n1;reboot", "holds ';'"),
        (ssh_user_problem, "red die", "holds a space"),
        (ssh_user_problem, "-oProxyCommand", "starts with '-'"),
        (ssh_user_problem, "a" * 33, "at most 32"),
        (ssh_user_problem, "", "cannot be empty"),
        (ssh_host_problem, "host:22", "neither an IPv4 address nor a DNS name"),
        (ssh_host_problem, "1.2.3", "is not an IPv4 address"),
        (model_id_problem, "tiny", "owner/name"),
        (model_id_problem, "a/b/c", "owner/name"),
        (model_id_problem, "org/-x", "is not a Hub name"),
        (model_id_problem, "org/x..y", "is not a Hub name"),
        (model_id_problem, "org/x.git", "ends with '.git'"),
        (model_id_problem, "org/" + "x" * 97, "at most 96"),
        (revision_problem, "../main", "is not a revision"),
        (revision_problem, "main branch", "is not a revision"),
        (image_problem, "Vllm:latest", "not an image reference"),
        (image_problem, "vllm:latest; rm -rf /", "not an image reference"),
        (node_path_problem, "relative/path", "is not an absolute path"),
        (node_path_problem, "/a b", "holds a space"),
        (node_path_problem, "/a,b", "holds ','"),
        (node_path_problem, "/srv/../etc", "holds '..'"),
        (env_value_problem, "1\nX=2", "control character"),
    ],
)
def test_rules_refuse(rule, value, says):
    said = rule(value)
    assert said and says in said, said


# validate_inventory: refused while the inventory loads
# -----------------------------------------------------

VALIDATE = "\nfrom sparkinfra.run import validate_inventory  # noqa: E402\n\nvalidate_inventory(__file__)\n"


def test_validate_inventory_raises_pyinfra_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, proj({GLAB: LAB_GROUP + "fabric_mtu = 70000\n"}, inventory=inv(two()) + VALIDATE))
    with ctx_state.use(State()), pytest.raises(InventorySettingsError) as info:
        make_inventory_from_files(str(tmp_path / INV), {}, str(tmp_path))
    assert isinstance(info.value, PyinfraError)
    assert str(info.value).startswith("bad settings: group_data/lab.py, key 'fabric_mtu' (host n0): ")


def test_validate_inventory_accepts_good(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, proj(inventory=inv(two()) + VALIDATE))
    with ctx_state.use(State()):
        inventory = make_inventory_from_files(str(tmp_path / INV), {}, str(tmp_path))
    assert sorted(host.name for host in inventory) == ["n0", "n1"]


# Through the real pyinfra command line, against a listening socket
# -----------------------------------------------------------------


class Listener:
    """A TCP socket on 127.0.0.1 that accepts (and drops) connections, counting them."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _accept_one(self) -> bool:
        try:
            conn, _ = self.sock.accept()
        except (TimeoutError, BlockingIOError):
            return False
        self.count += 1
        conn.close()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._accept_one()
            except OSError:
                return

    def seen(self) -> int:
        """Stop, take any connection still queued, and say how many were made."""
        self._stop.set()
        self._thread.join(5)
        self.sock.setblocking(False)
        while self._accept_one():
            pass
        return self.count

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def listener():
    lst = Listener()
    yield lst
    lst.close()


DEPLOY = 'from pyinfra.operations import server\n\nserver.shell(name="Say hello", commands=["true"])\n'


def cli_project(root: Path, port: int, files: dict[str, str | None] | None = None, n1: dict | None = None,
                last_line: str = VALIDATE) -> None:
    ssh = {"ssh_hostname": "127.0.0.1", "ssh_port": port}
    hosts = two(n0=ssh, n1={**ssh, **(n1 or {})})
    write(root, proj({**(files or {}), "deploy.py": DEPLOY}, inventory=inv(hosts) + last_line))
    (root / "home").mkdir(exist_ok=True)


def run_pyinfra(root: Path, *args: str, inventory: str = INV) -> tuple[int, str]:
    env = {**os.environ, "HOME": str(root / "home")}
    proc = subprocess.run(
        [str(PYINFRA), "-y", inventory, "deploy.py", *args],
        cwd=root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        env=env,
    )
    return proc.returncode, proc.stdout


CLI_BAD = [
    pytest.param({}, {}, ("--data", "fabric_mtu=70000"), DATA, "fabric_mtu", id="--data"),
    pytest.param({GLAB: LAB_GROUP + "fabric_mtuu = 9000\n"}, {}, (), GLAB, "fabric_mtuu", id="group_data-group"),
    pytest.param({GALL: "rdma_devices = 5\n"}, {}, (), GALL, "rdma_devices", id="group_data-all"),
    pytest.param({}, {"rank": 0}, (), INV, "rank", id="inventory-host"),
    pytest.param({}, {}, ("--data", "teardown=full"), DATA, "teardown_confirm", id="--data-full-teardown-unconfirmed"),
]


@pytest.mark.parametrize("files, n1, args, source, key", CLI_BAD)
def test_cli_refuses_bad_settings_before_connecting(tmp_path, listener, files, n1, args, source, key):
    cli_project(tmp_path, listener.port, files, n1)
    code, out = run_pyinfra(tmp_path, *args)
    assert code != 0, out
    assert f"bad settings: {source}, key '{key}'" in out, out
    assert "Traceback" not in out, out
    assert "Connecting to hosts" not in out, out
    assert listener.seen() == 0, out


def test_cli_good_settings_do_connect(tmp_path, listener):
    """The control: with good settings pyinfra does reach the listener (so the tests above can fail)."""
    cli_project(tmp_path, listener.port)
    code, out = run_pyinfra(tmp_path)
    # (paramiko logs its own traceback for the failed SSH banner: not checked here.)
    assert "bad settings" not in out, out
    assert "Connecting to hosts" in out, out
    assert listener.seen() >= 1, out


def test_cli_refuses_bad_settings_in_group_data_option_before_connecting(tmp_path, listener):
    cli_project(tmp_path, listener.port, {"extra/lab.py": "fabric_mtuu = 9000\n"})
    code, out = run_pyinfra(tmp_path, "--group-data", "extra")
    assert listener.seen() == 0, out
    assert code != 0, out
    assert "bad settings: extra/lab.py, key 'fabric_mtuu'" in out, out


# The project's config.py: the check runs whichever inventory pyinfra is given
# ---------------------------------------------------------------------------

CONFIG = {"config.py": (REPO / "config.py").read_text(encoding="utf-8")}


def test_cli_checks_an_inventory_without_its_last_line(tmp_path, listener):
    cli_project(tmp_path, listener.port, CONFIG, last_line="")
    code, out = run_pyinfra(tmp_path, "--data", "fabric_mtu=70000")
    assert listener.seen() == 0, out
    assert code != 0 and "Connecting to hosts" not in out, out
    # In the tool's words, without a location in sparkinfra's source.
    assert "--> sparkinfra: bad settings: --data, key 'fabric_mtu' (host n0): must be 9216 or less" in out, out
    assert "pyinfra error" not in out and "Traceback" not in out, out


def test_cli_checks_a_host_list_inventory(tmp_path, listener):
    """``@local`` (or any host list) gets group_data/all.py and the same check."""
    cli_project(tmp_path, listener.port, CONFIG, last_line="")
    code, out = run_pyinfra(tmp_path, inventory="@local")
    assert code != 0 and "Connecting to hosts" not in out, out
    assert "--> sparkinfra: bad settings: @local (host @local): '@local' holds '@'" in out, out


def test_cli_good_settings_without_the_last_line_do_connect(tmp_path, listener):
    """The control of the two above: config.py lets good settings through."""
    cli_project(tmp_path, listener.port, CONFIG, last_line="")
    code, out = run_pyinfra(tmp_path)
    assert "bad settings" not in out, out
    assert listener.seen() >= 1, out


def test_a_refused_hf_endpoint_is_not_repeated_it_may_hold_a_password():
    with pytest.raises(ValidationError) as refused:
        settings.HostSettings.model_validate({"hf_endpoint": "https://me:hunter2@mirror.example/"})
    said = [settings.in_words(e) for e in refused.value.errors() if e["loc"] == ("hf_endpoint",)]
    assert said and "without user:password@" in said[0][2] and "hunter2" not in said[0][2], said
