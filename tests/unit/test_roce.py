"""
A GB10's fabric port as RoCE sees it (``sparkinfra.roce``, ``facts.fabric.RdmaNetdevs``): the four
RDMA devices as a real GB10 lists them (both QSFP ports, the cable on one), the twin of the fabric
interface, the HCAs NCCL uses, and the GID row each one's own table gives.
"""

from __future__ import annotations

import subprocess
from ipaddress import IPv4Address
from pathlib import Path

import pytest
from gb10 import LINKS, LL, RA, table, v4

from sparkinfra import roce
from sparkinfra.facts.fabric import RdmaNetdevs, parse_rdma_netdevs, twin_of
from sparkinfra.settings import Fabric

# ibdev2netdev on a GB10 (DGX OS 7, one DAC cable in the f0 port), as it prints.
IBDEV2NETDEV = """\
rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)
rocep1s0f1 port 1 ==> enp1s0f1np1 (Down)
roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Up)
roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Down)
"""
FABRIC = Fabric(interface="enp1s0f0np0", subnet="192.168.192.0/24", mtu=4200, rdma_devices=(), rdma_port=1)
def test_ibdev2netdev_of_a_gb10_parses_to_its_four_twins():
    assert parse_rdma_netdevs(IBDEV2NETDEV.splitlines()) == LINKS


def fake_sysfs(root: Path) -> None:
    """The same four devices in sysfs as mlx5 lays them out: each PCI function's net/ holds its netdev."""
    for link in LINKS:
        device = root / link["device"]
        (device / "device" / "net" / link["netdev"]).mkdir(parents=True)
        (device / "ports" / "1").mkdir(parents=True)
        state = "4: ACTIVE" if link["state"] == "ACTIVE" else "1: DOWN"
        (device / "ports" / "1" / "state").write_text(state + "\n")


def test_the_fact_reads_sysfs_as_ibdev2netdev_does(tmp_path):
    fake_sysfs(tmp_path)
    command = RdmaNetdevs().command().replace("/sys/class/infiniband", str(tmp_path))
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
    assert RdmaNetdevs().process(out.stdout.splitlines()) == LINKS


def test_the_fact_falls_back_to_ibdev2netdev(tmp_path):
    tool = tmp_path / "ibdev2netdev"
    tool.write_text(f"#!/bin/sh\ncat <<'EOF'\n{IBDEV2NETDEV}EOF\n")
    tool.chmod(0o755)
    command = RdmaNetdevs().command().replace("/sys/class/infiniband", str(tmp_path / "none"))
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert RdmaNetdevs().process(out.stdout.splitlines()) == LINKS
    assert RdmaNetdevs().process([]) == []


@pytest.mark.parametrize(("interface", "twin"), [
    ("enp1s0f0np0", "enP2p1s0f0np0"), ("enP2p1s0f0np0", "enp1s0f0np0"),
    ("enp1s0f1np1", "enP2p1s0f1np1"), ("enP2p1s0f1np1", "enp1s0f1np1"),
])
def test_the_twin_is_the_same_function_in_the_other_pci_domain(interface, twin):
    assert twin_of(interface, [link["netdev"] for link in LINKS]) == twin


def test_no_twin_on_a_single_function_nic():
    assert twin_of("enp1s0f0np0", ["enp1s0f0np0", "enp1s0f1np1", "eno1"]) is None


def test_the_port_of_a_gb10_is_both_twins_of_the_cabled_port():
    port = roce.port_of(FABRIC, LINKS)
    assert port == roce.Port("enp1s0f0np0", "enP2p1s0f0np0",
                             (("rocep1s0f0", "enp1s0f0np0"), ("roceP2p1s0f0", "enP2p1s0f0np0")))
    assert port.devices == ["rocep1s0f0", "roceP2p1s0f0"] and port.netdevs == ["enp1s0f0np0", "enP2p1s0f0np0"]


def test_a_site_names_its_own_twin_or_none_or_its_hcas():
    assert roce.port_of(FABRIC.model_copy(update={"twin": "none"}), LINKS).hcas == (("rocep1s0f0", "enp1s0f0np0"),)
    named = roce.port_of(FABRIC.model_copy(update={"rdma_devices": ("rocep1s0f0",)}), LINKS)
    assert named.hcas == (("rocep1s0f0", "enp1s0f0np0"),) and not named.problems
    wrong = roce.port_of(FABRIC.model_copy(update={"rdma_devices": ("mlx5_0",)}), LINKS)
    assert wrong.problems == ("rdma_devices mlx5_0 not on this node (ibdev2netdev: roceP2p1s0f0 port 1 ==> "
                              "enP2p1s0f0np0, roceP2p1s0f1 port 1 ==> enP2p1s0f1np1, rocep1s0f0 port 1 ==> enp1s0f0np0, "
                              "rocep1s0f1 port 1 ==> enp1s0f1np1)",)
    missing = roce.port_of(FABRIC.model_copy(update={"twin": "enp9s0f0np0"}), LINKS)
    assert missing.problems[0].startswith("fabric_twin_interface enp9s0f0np0 has no RDMA device")


def test_each_twin_gets_its_own_ipv4_row_and_one_index_where_they_agree():
    port = roce.port_of(FABRIC, LINKS)
    tables = {"rocep1s0f0": table("enp1s0f0np0", v4("192.168.192.2")),
              "roceP2p1s0f0": table("enP2p1s0f0np0", v4("169.254.192.2"))}
    assert roce.gid_choice(port, tables, "192.168.192.2", "2.30.7") == roce.GidChoice(
        "3", {"rocep1s0f0": 3, "roceP2p1s0f0": 3})
    assert roce.index_problems(port, tables, "192.168.192.2", "3") == []
    assert roce.index_problems(port, tables, "192.168.192.2", "1") == [
        f"rocep1s0f0 (enp1s0f0np0): row 1 is {LL} (RoCE v2), not an IPv4 RoCE v2 GID",
        f"roceP2p1s0f0 (enP2p1s0f0np0): row 1 is {LL} (RoCE v2), not an IPv4 RoCE v2 GID"]


def test_rows_that_differ_are_left_to_nccl_and_say_what_to_remove():
    port = roce.port_of(FABRIC, LINKS)
    tables = {"rocep1s0f0": table("enp1s0f0np0", v4("192.168.192.2")),
              "roceP2p1s0f0": table("enP2p1s0f0np0", RA, v4("169.254.192.2"))}
    choice = roce.gid_choice(port, tables, "192.168.192.2", "2.30.7")
    assert choice.index == "" and choice.rows == {"rocep1s0f0": 3, "roceP2p1s0f0": 5} and not choice.problems
    assert f"remove {RA} from enP2p1s0f0np0" in choice.note
    assert roce.index_problems(port, tables, "192.168.192.2", "") == []  # NCCL's own: 3 and 5
    assert roce.index_problems(port, tables, "192.168.192.2", "3") == [
        f"roceP2p1s0f0 (enP2p1s0f0np0): row 3 is {RA} (RoCE v2), not an IPv4 RoCE v2 GID"]
    old = roce.gid_choice(port, tables, "192.168.192.2", "2.19.3")
    assert old.problems and "NCCL 2.19.3 takes one NCCL_IB_GID_INDEX for all" in old.problems[0]


def test_nccls_own_choice_on_the_fabric_hca_must_be_the_fabric_address():
    """Another IPv4 on the fabric interface, ahead of the fabric IP: NCCL's own choice would take it."""
    port = roce.port_of(FABRIC, LINKS)
    tables = {"rocep1s0f0": table("enp1s0f0np0", v4("10.9.9.9"), v4("192.168.192.2")),
              "roceP2p1s0f0": table("enP2p1s0f0np0", v4("169.254.192.2"))}
    choice = roce.gid_choice(port, tables, "192.168.192.2", "2.30.7")
    assert choice.problems == ("the IPv4 RoCE v2 rows differ (rocep1s0f0 (enp1s0f0np0) row 5, roceP2p1s0f0 "
                               "(enP2p1s0f0np0) row 3) and NCCL's own choice is wrong (rocep1s0f0 would use row 3, "
                               "not 5): give both twins the same IPv6 addresses (ipv6.addr-gen-mode eui64 on both), "
                               "then converge",)
    assert roce.index_problems(port, tables, "192.168.192.2", "") == [
        "rocep1s0f0 (enp1s0f0np0): NCCL's own row (3) carries 10.9.9.9, not the fabric address 192.168.192.2"]


def test_a_twin_without_ipv4_has_no_row_for_nccl():
    port = roce.port_of(FABRIC, LINKS)
    tables = {"rocep1s0f0": table("enp1s0f0np0", v4("192.168.192.2")), "roceP2p1s0f0": table("enP2p1s0f0np0")}
    assert roce.gid_choice(port, tables, "192.168.192.2", "2.30.7").problems[0].startswith(
        "roceP2p1s0f0 (enP2p1s0f0np0) has no IPv4 RoCE v2 GID row: ")
    assert roce.index_problems(port, tables, "192.168.192.2", "") == [
        "roceP2p1s0f0 (enP2p1s0f0np0): NCCL's own row (none: no IPv4 RoCE v2 row) is empty; table: "
        + roce.table_text(tables["roceP2p1s0f0"])]


@pytest.mark.parametrize(("fabric_ip", "subnet", "twin"), [
    ("192.168.192.2", "link-local", "169.254.192.2/16"),
    ("10.213.1.1", "link-local", "169.254.1.1/16"),
    ("10.0.0.7", "link-local", "169.254.1.7/16"),  # IPv4LL keeps 169.254.0.x for itself
    ("192.168.192.2", "192.168.193.0/24", "192.168.193.2/24"),
])
def test_the_twins_address(fabric_ip, subnet, twin):
    fabric = FABRIC.model_copy(update={"subnet": "10.0.0.0/24" if fabric_ip.startswith("10.0") else
                                       "10.213.1.0/24" if fabric_ip.startswith("10.213") else "192.168.192.0/24",
                                       "twin_subnet": subnet})
    if subnet != "link-local":
        fabric = Fabric(**{**fabric.model_dump(), "twin_subnet": subnet})
    assert fabric.twin_address(IPv4Address(fabric_ip)) == twin

