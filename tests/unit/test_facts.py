"""
Facts, fed the text real nodes print: the RoCE GID table (sysfs dump of ``RoceGidTable.command``
and Mellanox ``show_gids``), ``ip -j addr``, ``ncclGetVersion`` codes, ``docker inspect``.

The GID index NCCL must use is the RoCE v2 row carrying the node's IPv4 on the fabric netdev:
never the link-local rows 0/1, never a v1 row, never another address's row.
"""

from __future__ import annotations

import grp
import importlib.machinery
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import Config, FactProcessError, Inventory, State
from pyinfra.context import ctx_config, ctx_host, ctx_state

from sparkinfra.facts.fabric import (
    GID_ZERO,
    FabricLink,
    RoceGidTable,
    gid_ipv4,
    parse_gid_table,
    parse_ip_addr_json,
    roce_v2_index,
)
from sparkinfra.facts.files import FileState
from sparkinfra.facts.lane import DockerContainer
from sparkinfra.facts.mesh import AuthorizedKeys
from sparkinfra.facts.nccl import NcclVersion, nccl_version_from_code
from sparkinfra.facts.stage import DockerImageId, docker_answer

REPO = Path(__file__).resolve().parents[2]
STANDIN_SHOW_GIDS = REPO / "sparkbed" / "standins" / "show_gids"

NETDEV = "enp1s0f0np0"
VLAN = "enp1s0f0np0.100"
NODE_IP = "192.168.192.1"
OTHER_IP = "10.10.0.1"  # a second IPv4, on a VLAN of the same port

LINK_LOCAL = "fe80:0000:0000:0000:4ebb:47ff:fe00:0001"  # EUI-64 of 4c:bb:47:00:00:01
IPV6_GLOBAL = "fdc0:a8c0:0000:0000:4ebb:47ff:fe00:0001"
NODE_GID = "0000:0000:0000:0000:0000:ffff:c0a8:c001"  # ::ffff:192.168.192.1
OTHER_GID = "0000:0000:0000:0000:0000:ffff:0a0a:0001"  # ::ffff:10.10.0.1
V1, V2 = "IB/RoCE v1", "RoCE v2"


# Fixtures in the real formats
# ----------------------------


def sysfs_lines(populated: dict[int, tuple[str, str, str]], size: int = 16) -> list[str]:
    """
    What ``RoceGidTable.command`` prints for a port with ``size`` GID slots: one
    ``sysfs<TAB>index<TAB>gid<TAB>type<TAB>ndev`` line per slot, in the shell glob's order
    (``0 1 10 11 ... 2 3 ...``); an unpopulated slot reads as zeros with empty type and ndev.
    """
    lines = []
    for index in sorted(range(size), key=str):
        gid, kind, ndev = populated.get(index, (GID_ZERO, "", ""))
        lines.append(f"sysfs\t{index}\t{gid}\t{kind}\t{ndev}")
    return lines


# A ConnectX port: link-local v1/v2, then v1/v2 pairs for an IPv6 global address, the node's
# IPv4 (index 5 in v2), and a second IPv4 on a VLAN netdev; zero rows to the end of the table.
SYSFS_POPULATED = {
    0: (LINK_LOCAL, V1, NETDEV),
    1: (LINK_LOCAL, V2, NETDEV),
    2: (IPV6_GLOBAL, V1, NETDEV),
    3: (IPV6_GLOBAL, V2, NETDEV),
    4: (NODE_GID, V1, NETDEV),
    5: (NODE_GID, V2, NETDEV),
    6: (OTHER_GID, V1, VLAN),
    7: (OTHER_GID, V2, VLAN),
}

# The same dump written out as it comes off a node (the shell's glob order, zero rows at 8..15).
SYSFS_DUMP = """\
sysfs	0	fe80:0000:0000:0000:4ebb:47ff:fe00:0001	IB/RoCE v1	enp1s0f0np0
sysfs	1	fe80:0000:0000:0000:4ebb:47ff:fe00:0001	RoCE v2	enp1s0f0np0
sysfs	10	0000:0000:0000:0000:0000:0000:0000:0000		
sysfs	11	0000:0000:0000:0000:0000:0000:0000:0000		
sysfs	12	0000:0000:0000:0000:0000:0000:0000:0000		
sysfs	13	0000:0000:0000:0000:0000:0000:0000:0000		
sysfs	14	0000:0000:0000:0000:0000:0000:0000:0000		
sysfs	15	0000:0000:0000:0000:0000:0000:0000:0000		
sysfs	2	fdc0:a8c0:0000:0000:4ebb:47ff:fe00:0001	IB/RoCE v1	enp1s0f0np0
sysfs	3	fdc0:a8c0:0000:0000:4ebb:47ff:fe00:0001	RoCE v2	enp1s0f0np0
sysfs	4	0000:0000:0000:0000:0000:ffff:c0a8:c001	IB/RoCE v1	enp1s0f0np0
sysfs	5	0000:0000:0000:0000:0000:ffff:c0a8:c001	RoCE v2	enp1s0f0np0
sysfs	6	0000:0000:0000:0000:0000:ffff:0a0a:0001	IB/RoCE v1	enp1s0f0np0.100
sysfs	7	0000:0000:0000:0000:0000:ffff:0a0a:0001	RoCE v2	enp1s0f0np0.100
sysfs	8	0000:0000:0000:0000:0000:0000:0000:0000		
sysfs	9	0000:0000:0000:0000:0000:0000:0000:0000		
"""

# Mellanox show_gids, as it prints (tabs, blank IPv4 column on non-IPv4 rows).
SHOW_GIDS = """\
DEV	PORT	INDEX	GID					IPv4  		VER	DEV
---	----	-----	---					------------  	---	---
rocep1s0f0	1	0	fe80:0000:0000:0000:4cbb:47ff:fe00:0001			v1	enp1s0f0np0
rocep1s0f0	1	1	fe80:0000:0000:0000:4cbb:47ff:fe00:0001			v2	enp1s0f0np0
rocep1s0f0	1	2	0000:0000:0000:0000:0000:ffff:c0a8:c001	192.168.192.1  	v1	enp1s0f0np0
rocep1s0f0	1	3	0000:0000:0000:0000:0000:ffff:c0a8:c001	192.168.192.1  	v2	enp1s0f0np0
n_gids_found=4
"""

# show_gids where an IPv6 global pair comes first: the node's v2 row is index 5.
SHOW_GIDS_IPV6_FIRST = """\
DEV	PORT	INDEX	GID					IPv4  		VER	DEV
---	----	-----	---					------------  	---	---
rocep1s0f0	1	0	fe80:0000:0000:0000:4ebb:47ff:fe00:0001			v1	enp1s0f0np0
rocep1s0f0	1	1	fe80:0000:0000:0000:4ebb:47ff:fe00:0001			v2	enp1s0f0np0
rocep1s0f0	1	2	fdc0:a8c0:0000:0000:4ebb:47ff:fe00:0001			v1	enp1s0f0np0
rocep1s0f0	1	3	fdc0:a8c0:0000:0000:4ebb:47ff:fe00:0001			v2	enp1s0f0np0
rocep1s0f0	1	4	0000:0000:0000:0000:0000:ffff:c0a8:c001	192.168.192.1  	v1	enp1s0f0np0
rocep1s0f0	1	5	0000:0000:0000:0000:0000:ffff:c0a8:c001	192.168.192.1  	v2	enp1s0f0np0
n_gids_found=6
"""

# show_gids with several IPv4 addresses (a VLAN's first, then the node's, then a secondary).
SHOW_GIDS_SEVERAL_IPV4 = """\
DEV	PORT	INDEX	GID					IPv4  		VER	DEV
---	----	-----	---					------------  	---	---
rocep1s0f0	1	0	fe80:0000:0000:0000:4ebb:47ff:fe00:0001			v1	enp1s0f0np0
rocep1s0f0	1	1	fe80:0000:0000:0000:4ebb:47ff:fe00:0001			v2	enp1s0f0np0
rocep1s0f0	1	2	0000:0000:0000:0000:0000:ffff:0a0a:0001	10.10.0.1      	v1	enp1s0f0np0.100
rocep1s0f0	1	3	0000:0000:0000:0000:0000:ffff:0a0a:0001	10.10.0.1      	v2	enp1s0f0np0.100
rocep1s0f0	1	4	0000:0000:0000:0000:0000:ffff:c0a8:c001	192.168.192.1  	v1	enp1s0f0np0
rocep1s0f0	1	5	0000:0000:0000:0000:0000:ffff:c0a8:c001	192.168.192.1  	v2	enp1s0f0np0
rocep1s0f0	1	6	0000:0000:0000:0000:0000:ffff:c0a8:c0fe	192.168.192.254	v1	enp1s0f0np0
rocep1s0f0	1	7	0000:0000:0000:0000:0000:ffff:c0a8:c0fe	192.168.192.254	v2	enp1s0f0np0
n_gids_found=8
"""


def lines(text: str) -> list[str]:
    """Output as pyinfra hands it to ``process``: one string per line, newline removed."""
    return text.splitlines()


# parse_gid_table
# ---------------


def test_sysfs_dump_parses_populated_rows_in_index_order():
    rows = parse_gid_table(lines(SYSFS_DUMP))
    assert rows == [
        {"index": i, "gid": gid, "type": kind, "ndev": ndev}
        for i, (gid, kind, ndev) in sorted(SYSFS_POPULATED.items())
    ]


def test_sysfs_dump_literal_matches_generated():
    assert lines(SYSFS_DUMP) == sysfs_lines(SYSFS_POPULATED)


def test_sysfs_dump_of_a_full_size_table():
    # A ConnectX port has 255 GID slots; the glob order puts 100..109 before 11.
    rows = parse_gid_table(sysfs_lines(SYSFS_POPULATED, size=255))
    assert [r["index"] for r in rows] == list(range(8))
    assert roce_v2_index(rows, NODE_IP, NETDEV) == 5


def test_sysfs_dump_without_trailing_empty_fields():
    # Trailing tabs of an unpopulated row may be gone (stripped by a transport): still a zero row.
    stripped = [line.rstrip() for line in sysfs_lines(SYSFS_POPULATED)]
    assert parse_gid_table(stripped) == parse_gid_table(sysfs_lines(SYSFS_POPULATED))


def test_sysfs_populated_gid_with_unreadable_type_is_skipped():
    # A row being (re)populated: gid set but type not readable yet - not a usable row.
    dump = sysfs_lines({0: (LINK_LOCAL, V1, NETDEV), 1: (NODE_GID, "", "")}, size=4)
    assert parse_gid_table(dump) == [{"index": 0, "gid": LINK_LOCAL, "type": V1, "ndev": NETDEV}]


def test_empty_output_means_no_device():
    assert parse_gid_table([]) is None
    assert parse_gid_table([""]) is None


def test_table_of_only_zero_rows_is_empty_not_missing():
    assert parse_gid_table(sysfs_lines({}, size=16)) == []
    assert parse_gid_table(sysfs_lines({}, size=1)) == []


def test_show_gids_with_no_rows_is_empty_not_missing():
    text = "\n".join(lines(SHOW_GIDS)[:2] + ["n_gids_found=0"])
    assert parse_gid_table(lines(text)) == []


def test_show_gids_parses_rows():
    rows = parse_gid_table(lines(SHOW_GIDS))
    assert rows == [
        {"index": 0, "gid": "fe80:0000:0000:0000:4cbb:47ff:fe00:0001", "type": V1, "ndev": NETDEV},
        {"index": 1, "gid": "fe80:0000:0000:0000:4cbb:47ff:fe00:0001", "type": V2, "ndev": NETDEV},
        {"index": 2, "gid": NODE_GID, "type": V1, "ndev": NETDEV},
        {"index": 3, "gid": NODE_GID, "type": V2, "ndev": NETDEV},
    ]


def test_show_gids_and_sysfs_agree_on_the_same_table():
    from_show_gids = parse_gid_table(lines(SHOW_GIDS_IPV6_FIRST))
    from_sysfs = parse_gid_table(sysfs_lines({i: SYSFS_POPULATED[i] for i in range(6)}))
    assert from_show_gids == from_sysfs


def test_show_gids_with_space_aligned_columns():
    # Some builds align with spaces instead of tabs: whitespace-split parsing takes both.
    spaced = [" ".join(line.split()) for line in lines(SHOW_GIDS)]
    assert parse_gid_table(spaced) == parse_gid_table(lines(SHOW_GIDS))


# gid_ipv4
# --------


@pytest.mark.parametrize(
    ("gid", "ipv4"),
    [
        (NODE_GID, NODE_IP),
        (OTHER_GID, OTHER_IP),
        ("0000:0000:0000:0000:0000:ffff:c0a8:c0fe", "192.168.192.254"),
        ("::ffff:192.168.192.1", NODE_IP),
        (LINK_LOCAL, None),
        (IPV6_GLOBAL, None),
        (GID_ZERO, None),
        ("", None),
        ("not-a-gid", None),
        ("0000:0000:0000:0000:0000:ffff:c0a8", None),  # truncated
    ],
)
def test_gid_ipv4(gid, ipv4):
    assert gid_ipv4(gid) == ipv4


# roce_v2_index
# -------------


@pytest.mark.parametrize(
    ("text", "index"),
    [(SHOW_GIDS, 3), (SHOW_GIDS_IPV6_FIRST, 5), (SHOW_GIDS_SEVERAL_IPV4, 5), (SYSFS_DUMP, 5)],
    ids=["show_gids", "show_gids-ipv6-first", "show_gids-several-ipv4", "sysfs"],
)
def test_index_is_the_v2_row_of_the_node_ipv4(text, index):
    rows = parse_gid_table(lines(text))
    assert roce_v2_index(rows, NODE_IP, NETDEV) == index
    assert roce_v2_index(rows, NODE_IP) == index  # without a netdev filter too
    assert index not in (0, 1)
    row = next(r for r in rows if r["index"] == index)
    assert row["type"] == V2 and gid_ipv4(row["gid"]) == NODE_IP


def test_index_of_the_other_ipv4_follows_its_netdev():
    rows = parse_gid_table(lines(SYSFS_DUMP))
    assert roce_v2_index(rows, OTHER_IP, VLAN) == 7
    assert roce_v2_index(rows, OTHER_IP) == 7
    assert roce_v2_index(rows, OTHER_IP, NETDEV) is None  # on a different netdev

    several = parse_gid_table(lines(SHOW_GIDS_SEVERAL_IPV4))
    assert roce_v2_index(several, OTHER_IP, VLAN) == 3
    assert roce_v2_index(several, "192.168.192.254", NETDEV) == 7


def test_no_index_when_only_a_v1_row_carries_the_ip():
    rows = [r for r in parse_gid_table(lines(SHOW_GIDS)) if not (r["type"] == V2 and r["index"] == 3)]
    assert [r["index"] for r in rows] == [0, 1, 2]
    assert roce_v2_index(rows, NODE_IP, NETDEV) is None


def test_no_index_when_only_another_ip_is_in_the_table():
    rows = parse_gid_table(lines(SHOW_GIDS))
    assert roce_v2_index(rows, "192.168.192.2", NETDEV) is None
    rows = parse_gid_table(sysfs_lines({0: (LINK_LOCAL, V1, NETDEV), 1: (LINK_LOCAL, V2, NETDEV),
                                        2: (OTHER_GID, V1, NETDEV), 3: (OTHER_GID, V2, NETDEV)}))
    assert roce_v2_index(rows, NODE_IP, NETDEV) is None


def test_no_index_when_the_row_is_on_a_different_netdev():
    dump = sysfs_lines({0: (LINK_LOCAL, V1, NETDEV), 1: (LINK_LOCAL, V2, NETDEV),
                        2: (NODE_GID, V1, VLAN), 3: (NODE_GID, V2, VLAN)})
    rows = parse_gid_table(dump)
    assert roce_v2_index(rows, NODE_IP, NETDEV) is None
    assert roce_v2_index(rows, NODE_IP, VLAN) == 3


def test_index_skips_the_same_ip_on_another_netdev():
    # The node's IPv4 (mis)configured on a VLAN too, with a lower index: the fabric netdev's row wins.
    dump = sysfs_lines({0: (LINK_LOCAL, V1, NETDEV), 1: (LINK_LOCAL, V2, NETDEV),
                        2: (NODE_GID, V1, VLAN), 3: (NODE_GID, V2, VLAN),
                        4: (NODE_GID, V1, NETDEV), 5: (NODE_GID, V2, NETDEV)})
    assert roce_v2_index(parse_gid_table(dump), NODE_IP, NETDEV) == 5


def test_never_the_link_local_rows():
    rows = parse_gid_table(sysfs_lines({0: (LINK_LOCAL, V1, NETDEV), 1: (LINK_LOCAL, V2, NETDEV)}))
    assert len(rows) == 2
    for ip in (NODE_IP, "0.0.0.0", "254.128.0.0"):
        assert roce_v2_index(rows, ip, NETDEV) is None


def test_no_index_in_an_empty_table():
    assert roce_v2_index([], NODE_IP, NETDEV) is None
    assert roce_v2_index(parse_gid_table(sysfs_lines({})), NODE_IP, NETDEV) is None


# RoceGidTable: its command, run on a fabricated sysfs tree
# ---------------------------------------------------------


def fake_sysfs(root: Path, device: str, port: int, populated: dict, size: int = 16) -> Path:
    """A sysfs GID table under ``root`` (unpopulated slots have no readable type/ndev)."""
    base = root / device / "ports" / str(port)
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    for index in range(size):
        gid, kind, ndev = populated.get(index, (GID_ZERO, "", ""))
        (base / "gids" / str(index)).write_text(gid + "\n")
        if kind:
            (base / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
            (base / "gid_attrs" / "ndevs" / str(index)).write_text(ndev + "\n")
    return root


def run_fact_command(command: str, root: Path, path_dirs: list[Path] = ()) -> list[str]:
    command = command.replace("/sys/class/infiniband", str(root))
    env = {"PATH": os.pathsep.join([*(str(p) for p in path_dirs), "/usr/bin", "/bin"]), "LC_ALL": "C"}
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env=env, timeout=10)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_fact_command_output_is_the_sysfs_dump(tmp_path):
    fake_sysfs(tmp_path, "rocep1s0f0", 1, SYSFS_POPULATED)
    output = run_fact_command(RoceGidTable().command("rocep1s0f0", 1), tmp_path)
    assert output == lines(SYSFS_DUMP)
    assert RoceGidTable().process(output) == parse_gid_table(lines(SYSFS_DUMP))
    assert roce_v2_index(RoceGidTable().process(output), NODE_IP, NETDEV) == 5


def test_fact_command_falls_back_to_show_gids(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "show_gids"
    tool.write_text(f"#!/bin/sh\n[ \"$1 $2\" = 'rocep1s0f0 1' ] || exit 1\ncat <<'EOF'\n{SHOW_GIDS}EOF\n")
    tool.chmod(0o755)
    output = run_fact_command(RoceGidTable().command("rocep1s0f0", 1), tmp_path / "sys", [bin_dir])
    assert output == lines(SHOW_GIDS)
    assert roce_v2_index(RoceGidTable().process(output), NODE_IP, NETDEV) == 3


def test_fact_command_without_device_or_tool_is_none(tmp_path):
    output = run_fact_command(RoceGidTable().command("rocep1s0f0", 1), tmp_path / "sys", [tmp_path])
    assert output == []
    assert RoceGidTable().process(output) is None


# The test bed's stand-in show_gids
# ---------------------------------


def standin_line(dev, port, index, gid, ipv4, ver, ndev):
    """One row exactly as ``sparkbed/standins/show_gids`` formats it."""
    return f"{dev}\t{port}\t{index}\t{gid}\t{ipv4:<14}\t{ver}\t{ndev}"


STANDIN_OUTPUT = [
    "DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV",
    "---\t----\t-----\t---\t\t\t\t\t------------  \t---\t---",
    standin_line("rocep1s0f0", 1, 0, LINK_LOCAL, "", "v1", NETDEV),
    standin_line("rocep1s0f0", 1, 1, LINK_LOCAL, "", "v2", NETDEV),
    standin_line("rocep1s0f0", 1, 2, IPV6_GLOBAL, "", "v1", NETDEV),
    standin_line("rocep1s0f0", 1, 3, IPV6_GLOBAL, "", "v2", NETDEV),
    standin_line("rocep1s0f0", 1, 4, NODE_GID, NODE_IP, "v1", NETDEV),
    standin_line("rocep1s0f0", 1, 5, NODE_GID, NODE_IP, "v2", NETDEV),
    standin_line("rocep1s0f0", 1, 6, OTHER_GID, OTHER_IP, "v1", VLAN),
    standin_line("rocep1s0f0", 1, 7, OTHER_GID, OTHER_IP, "v2", VLAN),
    "n_gids_found=8",
]


def test_standin_show_gids_format_parses():
    rows = parse_gid_table(STANDIN_OUTPUT)
    assert rows == parse_gid_table(lines(SYSFS_DUMP))
    assert roce_v2_index(rows, NODE_IP, NETDEV) == 5
    assert roce_v2_index(rows, OTHER_IP, NETDEV) is None


@pytest.fixture
def standin_show_gids():
    loader = importlib.machinery.SourceFileLoader("sparkinfra_standin_show_gids", str(STANDIN_SHOW_GIDS))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_standin_show_gids_prints_what_we_expect(tmp_path, standin_show_gids, capsys, monkeypatch):
    # The stand-in itself, pointed at a fabricated sysfs tree instead of /sys.
    fake_sysfs(tmp_path, "rocep1s0f0", 1, SYSFS_POPULATED)
    monkeypatch.setattr(standin_show_gids, "ROOT", tmp_path)
    assert standin_show_gids.main(["show_gids", "rocep1s0f0", "1"]) == 0
    output = capsys.readouterr().out.splitlines()
    assert output == STANDIN_OUTPUT
    assert RoceGidTable().process(output) == parse_gid_table(lines(SYSFS_DUMP))


# FabricLink / parse_ip_addr_json
# -------------------------------


def ip_addr_json(flags, addr_info, mtu=4200, ifname=NETDEV):
    return json.dumps(
        [
            {
                "ifindex": 3,
                "link_index": 2,
                "ifname": ifname,
                "flags": flags,
                "mtu": mtu,
                "qdisc": "mq",
                "operstate": "UP" if "LOWER_UP" in flags else "DOWN",
                "group": "default",
                "txqlen": 1000,
                "link_type": "ether",
                "address": "4c:bb:47:00:00:01",
                "broadcast": "ff:ff:ff:ff:ff:ff",
                "addr_info": addr_info,
            }
        ]
    )


INET = {
    "family": "inet", "local": NODE_IP, "prefixlen": 24, "broadcast": "192.168.192.255",
    "scope": "global", "label": NETDEV, "valid_life_time": 4294967295, "preferred_life_time": 4294967295,
}
INET6_LL = {
    "family": "inet6", "local": "fe80::4ebb:47ff:fe00:1", "prefixlen": 64, "scope": "link",
    "valid_life_time": 4294967295, "preferred_life_time": 4294967295,
}


def test_ip_addr_up_with_carrier():
    text = ip_addr_json(["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], [INET, INET6_LL])
    assert parse_ip_addr_json(text) == {
        "mtu": 4200, "admin_up": True, "carrier": True, "ipv4": ["192.168.192.1/24"], "mac": "4c:bb:47:00:00:01",
    }


def test_ip_addr_up_without_carrier():
    link = parse_ip_addr_json(ip_addr_json(["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"], [INET]))
    assert link["admin_up"] is True and link["carrier"] is False


def test_ip_addr_admin_down_no_address():
    link = parse_ip_addr_json(ip_addr_json(["BROADCAST", "MULTICAST"], [], mtu=1500))
    assert link == {"mtu": 1500, "admin_up": False, "carrier": False, "ipv4": [], "mac": "4c:bb:47:00:00:01"}


def test_ip_addr_several_ipv4_in_order():
    second = {**INET, "local": "192.168.192.9", "secondary": True}
    other = {**INET, "local": OTHER_IP, "prefixlen": 16}
    link = parse_ip_addr_json(ip_addr_json(["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], [INET, second, INET6_LL, other]))
    assert link["ipv4"] == ["192.168.192.1/24", "192.168.192.9/24", "10.10.0.1/16"]


@pytest.mark.parametrize("text", ["", "  \n", "[]"])
def test_ip_addr_no_such_interface(text):
    assert parse_ip_addr_json(text) is None


def test_fabric_link_process_joins_lines():
    # ip -j prints one line, -p (pretty) several: either way the JSON is joined back.
    doc = json.loads(ip_addr_json(["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], [INET]))
    pretty = json.dumps(doc, indent=4).splitlines()
    assert FabricLink().process(pretty)["ipv4"] == ["192.168.192.1/24"]
    assert FabricLink().process([]) is None


# NcclVersion
# -----------


@pytest.mark.parametrize(
    ("code", "version"),
    [
        ("23007", "2.30.7"),
        ("22703", "2.27.3"),
        ("21903", "2.19.3"),
        ("20906", "2.9.6"),
        ("2708", "2.7.8"),
        ("2804", "2.8.4"),
        (" 23007\n", "2.30.7"),
        ("error libnccl.so.2: cannot open shared object file: No such file or directory", None),
        ("error ", None),
        ("", None),
        ("-1", None),
        ("2.30.7", None),
    ],
)
def test_nccl_version_from_code(code, version):
    assert nccl_version_from_code(code) == version


def test_nccl_version_fact_process():
    assert NcclVersion().process(["23007"]) == "2.30.7"
    assert NcclVersion().process(["2708"]) == "2.7.8"
    assert NcclVersion().process(["error /opt/nccl/lib/libnccl.so.2: cannot open shared object file"]) is None
    assert NcclVersion().process([]) is None


# DockerContainer
# ---------------


@pytest.mark.parametrize(
    ("output", "state"),
    [
        (["running true"], {"status": "running", "running": True}),
        (["exited false"], {"status": "exited", "running": False}),
        (["created false"], {"status": "created", "running": False}),  # an aborted launch's placeholder
        (["paused true"], {"status": "paused", "running": True}),
        (["Error response from daemon: No such container: vllm_node"], None),
        (["[]", "Error: No such container: vllm_node"], None),  # docker inspect of a missing name, on some versions
    ],
)
def test_docker_container_process(output, state):
    assert DockerContainer().process(output) == state


@pytest.mark.parametrize("output", [
    ["Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"],
    [],
])
def test_docker_container_of_a_daemon_that_does_not_answer_is_an_error_not_absent(output):
    with pytest.raises(FactProcessError, match="docker could not be asked"):
        DockerContainer().process(output)


# Docker's answers: absent, or could not be asked (``docker_answer``)
# ---------------------------------------------------------------------

IMAGE_ID = "sha256:" + "ab" * 32
DOCKER_DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"


@pytest.mark.parametrize("output, value", [
    ([IMAGE_ID], IMAGE_ID),
    (["WARNING: Error loading config file: /root/.docker/config.json: permission denied", IMAGE_ID], IMAGE_ID),
    (["", "Error: No such image: vllm-node:latest"], None),  # docker 24's client
    (["Error response from daemon: No such image: vllm-node:latest"], None),  # docker 28's
    (["[]", "Error: No such object: vllm-node:latest"], None),
], ids=["id", "id-after-a-warning", "no-such-image", "no-such-image-daemon", "no-such-object"])
def test_docker_image_id_is_the_id_or_absent(output, value):
    assert DockerImageId().process(output) == value


@pytest.mark.parametrize("output, error", [
    (["", DOCKER_DOWN], DOCKER_DOWN),
    (["permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock"],
     "permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock"),
    (["sh: 1: docker: not found"], "sh: 1: docker: not found"),
    (["   "], "no answer"),
], ids=["daemon-down", "permission", "no-docker", "blank"])
def test_a_docker_error_is_the_facts_error_never_a_missing_image(output, error):
    with pytest.raises(FactProcessError) as raised:
        DockerImageId().process(output)
    assert str(raised.value) == f"docker could not be asked: {error}"


def test_docker_answer_takes_the_first_accepted_line():
    assert docker_answer(["running true"], lambda line: len(line.split()) == 2) == "running true"
    assert docker_answer(["Error: No such container: vllm_node"], lambda line: len(line.split()) == 2) is None


def fake_docker(tmp_path, monkeypatch, script: str) -> None:
    """A stand-in ``docker`` first on this process's PATH, running ``script``."""
    (tmp_path / "docker").write_text(f"#!/bin/sh\n{script}\n")
    (tmp_path / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


@pytest.mark.parametrize("script, value", [
    (f"echo {IMAGE_ID}", IMAGE_ID),
    ("echo 'Error: No such image: vllm-node:latest' >&2; exit 1", None),
], ids=["there", "absent"])
def test_docker_image_id_command_run_here(tmp_path, monkeypatch, script, value):
    fake_docker(tmp_path, monkeypatch, script)
    command = DockerImageId().command(image="vllm-node:latest").get_raw_value()
    assert "2>&1 || true" in command and "/dev/null" not in command  # docker's error reaches the fact
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    assert DockerImageId().process(out.splitlines()) == value


def test_a_daemon_that_does_not_answer_is_reported_on_its_host_which_fails(tmp_path, monkeypatch, caplog):
    """Through pyinfra's own fact gathering, on a local host: the error is logged at the default
    verbosity (error) with that host's prefix, and the host fails; the value reads ``None``, which
    is why operations check the failed hosts (``operations.stage.image_ids``)."""
    fake_docker(tmp_path, monkeypatch, f"echo; echo '{DOCKER_DOWN}' >&2; exit 1")
    inventory = Inventory((["@local", "spark-2"], {}))
    state = State(inventory, Config())
    local = inventory.get_host("@local")
    local.connect()
    for h in inventory:
        state.activate_host(h)  # another host stays active: pyinfra stops a run with none left
    with ctx_state.use(state), ctx_config.use(state.config), ctx_host.use(local), caplog.at_level("INFO"):
        assert local.get_fact(DockerImageId, image="vllm-node:latest") is None
    assert state.failed_hosts == {local}
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("[@local]" in e and f"FactProcessError: docker could not be asked: {DOCKER_DOWN}" in e
               for e in errors), errors


# FileState: one command for what files.put asks three facts (run here, on this machine's files)

def file_state(path) -> dict:
    command = FileState().command(path=str(path)).get_raw_value()
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    return FileState().process(out.splitlines())


def test_file_state_of_a_file(tmp_path):
    import grp
    import hashlib
    import pwd

    path = tmp_path / "has space" / "nccl.env"
    path.parent.mkdir()
    path.write_text("NCCL_IB_GID_INDEX=3\n")
    path.chmod(0o600)
    st = path.stat()
    assert file_state(path) == {
        "kind": "file", "mode": "600", "user": pwd.getpwuid(st.st_uid).pw_name,
        "group": grp.getgrgid(st.st_gid).gr_name, "sha1": hashlib.sha1(b"NCCL_IB_GID_INDEX=3\n").hexdigest(),
        "parent": True,
    }


def test_file_state_absent_with_and_without_its_folder(tmp_path):
    assert file_state(tmp_path / "missing") == {
        "kind": "absent", "mode": None, "user": None, "group": None, "sha1": None, "parent": True}
    assert file_state(tmp_path / "no" / "missing")["parent"] is False


@pytest.mark.parametrize("make", ["folder", "link"])
def test_file_state_of_something_else_in_the_way(tmp_path, make):
    path = tmp_path / "unit.service"
    if make == "folder":
        path.mkdir()
    else:
        (tmp_path / "target").write_text("x")
        path.symlink_to(tmp_path / "target")
    state = file_state(path)
    assert state["kind"] == "other" and state["sha1"] is None and state["parent"] is True


def test_parse_file_state_of_no_output_is_absent_without_folder():
    assert FileState().process([]) == {
        "kind": "absent", "mode": None, "user": None, "group": None, "sha1": None, "parent": False}


# AuthorizedKeys: what ssh_key_authorized checks, in one command (run here, on this machine's files)


def _authorized_keys(user: str) -> dict | None:
    command = AuthorizedKeys().command(user=user).get_raw_value()
    lines = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout.splitlines()
    return AuthorizedKeys().process(lines) if lines else None


def test_authorized_keys_of_this_machines_user():
    import pwd

    me = pwd.getpwuid(os.getuid())
    ssh_dir = Path(me.pw_dir) / ".ssh"
    found = _authorized_keys(me.pw_name)
    assert found["home"] == me.pw_dir
    if not ssh_dir.exists():
        assert found["ssh_dir"][0] == "absent" and found["file"][0] == "absent" and found["lines"] == []
    else:
        assert found["ssh_dir"][:3] == ["directory", me.pw_name, grp.getgrgid(me.pw_gid).gr_name]
        assert found["ssh_dir"][3] == format(ssh_dir.stat().st_mode & 0o7777, "o")


def test_authorized_keys_of_a_user_without_home():
    assert _authorized_keys("no-such-user-here") is None


def test_authorized_keys_parses_kinds_and_lines():
    found = AuthorizedKeys().process(["/home/s", "directory s s 700", "other", "ssh-ed25519 AAA x", "", "k2"])
    assert found == {"home": "/home/s", "ssh_dir": ["directory", "s", "s", "700"],
                     "file": ["other", None, None, None], "lines": ["ssh-ed25519 AAA x", "k2"]}
