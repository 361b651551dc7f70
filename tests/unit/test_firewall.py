"""
The cluster's ports on the fabric only: the ports each lane keeps there, the nft file (golden), the
live table read from nftables' JSON, and the file and the reading agreeing with each other.

``fixtures/nft/table.json`` is real output of ``nft -j list table inet sparkinfra`` (nftables 1.0.6,
Debian 12) after ``nft -f`` of the file this module renders for the bed's Ray lane, in a private
network namespace (``unshare -n``); ``table-extra-rule.json`` the same after
``nft add rule inet sparkinfra input tcp dport 80 drop``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api import FileUploadCommand
from pyinfra.context import ctx_host, ctx_state

from sparkinfra.facts.firewall import FirewallTable, table_rules
from sparkinfra.lanes import find_lane
from sparkinfra.lanes.ports import EPHEMERAL, firewalled, merged, opened
from sparkinfra.lanes.render import launch
from sparkinfra.operations.files import render
from sparkinfra.operations.firewall import fabric_only_ports, firewall_file, wanted_table

from golden_files import golden
from test_operations import FakeHost

HERE = Path(__file__).resolve().parent
NFT = HERE / "fixtures" / "nft"
RAY = ((6379, 6379), (10001, 19999), (29501, 29501), (32768, 60999))  # the sample's set
SUBNET = "10.213.1.0/24"


@pytest.fixture
def sim_cluster(cluster_of):
    return cluster_of(find_lane("sim"))


def test_merged_joins_overlapping_and_adjacent_ranges():
    assert merged([(29501, 29501), (10002, 19999), (10001, 10001), (32768, 60999), (40000, 40010)]) == (
        (10001, 19999), (29501, 29501), (32768, 60999))
    assert merged([]) == ()


def test_an_mp_lane_keeps_its_rendezvous_a_ray_lane_its_gcs_client_and_worker_ports(sim_cluster):
    assert firewalled(find_lane("sim"), sim_cluster) == ((29501, 29501),)
    assert firewalled(find_lane("sim-b"), sim_cluster) == ((6379, 6379), (10001, 19999))


def test_ray_start_pins_the_worker_ports_the_firewall_names(sim_cluster):
    lane = find_lane("sim-b")
    for rank in (0, 1):
        command = " ".join(launch(lane, sim_cluster, rank).command)
        assert "--min-worker-port=10002 --max-worker-port=19999" in command


def test_every_port_a_lane_opens_is_said_with_where_it_may_be_reached_from(sim_cluster):
    head = {o.ports: o for o in opened(find_lane("sim"), sim_cluster, 0)}
    assert set(head) == {"8000", "29501", EPHEMERAL}
    assert "API key" in head["8000"].reach
    assert "firewall" in head["29501"].reach and "torch.distributed" in head["29501"].process
    worker = {o.ports for o in opened(find_lane("sim"), sim_cluster, 1)}
    assert worker == {EPHEMERAL}
    ray = {o.ports: o for o in opened(find_lane("sim-b"), sim_cluster, 0)}
    assert set(ray) == {"8000", "6379", "10001", "10002-19999", EPHEMERAL}
    assert all(SUBNET in o.reach for p, o in ray.items() if p != "8000")
    off = sim_cluster.model_copy(update={"config": sim_cluster.config.model_copy(update={"firewall": False})})
    assert "firewall: false" in {o.ports: o for o in opened(find_lane("sim-b"), off, 0)}["6379"].reach


def test_the_nft_file_is_golden():
    golden(HERE / "golden" / "firewall.nft", firewall_file(RAY, SUBNET, (8000, 22, 22)))


def test_the_real_listing_reads_as_the_table_the_file_makes():
    listing = json.loads((NFT / "table.json").read_text())
    assert table_rules(listing) == wanted_table(RAY, SUBNET, (22, 8000))


def test_a_rule_of_someone_elses_in_our_table_makes_it_differ():
    listing = json.loads((NFT / "table-extra-rule.json").read_text())
    read = table_rules(listing)
    assert read != wanted_table(RAY, SUBNET, (22, 8000))
    assert read["rules"][-1] == "tcp dport 80 drop" or "drop" in read["rules"][-1]


def test_the_fact_reads_range_table_and_a_node_without_nft():
    fact = FirewallTable()
    listing = (NFT / "table.json").read_text()
    read = fact.process(["ephemeral 32768\t60999", *listing.splitlines()])
    assert read["nft"] and read["ephemeral"] == [32768, 60999]
    assert read["table"]["ports"] == [list(r) for r in RAY]
    assert fact.process(["ephemeral 32768\t60999"]) == {"nft": True, "ephemeral": [32768, 60999], "table": None}
    assert fact.process(["ephemeral 32768\t60999", "no-nft"])["nft"] is False


@pytest.mark.skipif(not shutil.which("nft") or not shutil.which("unshare"), reason="nft or unshare is missing")
def test_nft_loads_the_file_twice_and_lists_what_the_operation_wants(tmp_path):
    """The rendered file loaded by nftables itself (twice: the delete-and-make of a reload), in a
    private network namespace; what it lists is what the operation compares with."""
    path = tmp_path / "firewall.nft"
    path.write_text(firewall_file(RAY, SUBNET, (22, 8000)))
    proc = subprocess.run(["unshare", "-n", "sh", "-c", f"nft -f {path} && nft -f {path} && "
                           "nft -j list table inet sparkinfra"], capture_output=True, text=True)
    if proc.returncode and "Operation not permitted" in proc.stderr:
        pytest.skip("no network namespace of our own here")
    assert proc.returncode == 0, proc.stderr
    assert table_rules(json.loads(proc.stdout)) == wanted_table(RAY, SUBNET, (22, 8000))


class Node(FakeHost):
    """A fake node that also names the temporary files of uploads, as pyinfra hosts do."""

    def get_temp_filename(self, key):
        return f"/tmp/pyinfra-{abs(hash(key))}"


def test_a_lane_switch_writes_the_ray_ports_and_loads_them(sim_cluster):
    """The mp lane's table is live and on file, the Ray lane is placed: the file changes, is loaded."""
    mp = merged([(29501, 29501), (32768, 60999)])
    unit = render("etc/systemd/system/sparkinfra-firewall.service.j2")
    node = Node("node", [
        {"fact": "FirewallTable", "value": {"nft": True, "ephemeral": [32768, 60999],
                                            "table": wanted_table(mp, SUBNET, (22, 8000))}},
        {"fact": "FileState", "args": {"path": "/etc/sparkinfra/firewall.nft"},
         "value": _file(firewall_file(mp, SUBNET, (22, 8000)))},
        {"fact": "FileState", "args": {"path": "/etc/systemd/system/sparkinfra-firewall.service"}, "value": _file(unit)},
        {"fact": "SystemdEnabled", "args": {"services": "sparkinfra-firewall.service"},
         "value": {"sparkinfra-firewall.service": True}},
    ])
    with ctx_state.use(SimpleNamespace(config=SimpleNamespace(DIFF=False))), ctx_host.use(node):
        commands = list(fabric_only_ports._inner(ports=firewalled(find_lane("sim-b"), sim_cluster), subnet=SUBNET,
                                                 open_ports=(22, 8000)))
    upload = commands[0]
    assert isinstance(upload, FileUploadCommand) and upload.dest == "/etc/sparkinfra/firewall.nft"
    assert "elements = { 6379, 10001-19999, 32768-60999 }" in upload.src.getvalue()
    assert str(commands[-1]) == "systemctl restart sparkinfra-firewall.service"


def _file(content: str) -> dict:
    return {"kind": "file", "mode": "644", "user": "root", "group": "root",
            "sha1": hashlib.sha1(content.encode()).hexdigest(), "parent": True}


def _fact_script(tmp_path: Path, nft: str | None) -> dict:
    """FirewallTable's command run here, with a stand-in ``nft`` (its body) or none on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("sh", "cat"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    if nft is not None:
        (bin_dir / "nft").write_text("#!/bin/sh\n" + nft)
        (bin_dir / "nft").chmod(0o755)
    command = FirewallTable().command().get_raw_value()
    out = subprocess.run([shutil.which("sh"), "-c", command], env={"PATH": str(bin_dir)}, capture_output=True,
                         text=True, check=True)
    return FirewallTable().process(out.stdout.splitlines())


def test_the_facts_script_reads_the_table_none_or_no_nft(tmp_path):
    listing = NFT / "table.json"
    read = _fact_script(tmp_path / "a", f'[ "$*" = "-j list table inet sparkinfra" ] && cat {listing}\n')
    assert read["nft"] and len(read["ephemeral"]) == 2 and read["table"]["ports"] == [list(r) for r in RAY]
    gone = _fact_script(tmp_path / "b", "echo 'Error: No such file or directory' >&2; exit 1\n")
    assert gone["nft"] and gone["table"] is None
    assert _fact_script(tmp_path / "c", None)["nft"] is False
