"""
The known-bad rules (``rules/*.yaml``, ``sparkinfra.rules``): each shipped rule loads, trips on the
facts it names and not once its remedy is applied; no shipped lane trips a refusing rule on its
shipped cluster; a broken rule file is named with its key; ``python -m sparkinfra.rules`` lists
them. The real command line refusing each one is in the bad-input corpus (``*-rule-*`` cases).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparkinfra import roce, rules
from sparkinfra.lanes import find_lane
from sparkinfra.run import load_files

SHIPPED = {r.id: r for r in rules.load()}

# Each rule's facts when it trips, and the change its remedy makes.
TRIPS = {
    "nccl-2304-nvls-hang": (
        {"nccl_version": "2.30.4", "nodes": 8, "nccl_env.NCCL_NVLS_ENABLE": None},
        [{"nccl_env.NCCL_NVLS_ENABLE": "0"}, {"nccl_version": "2.30.7"}, {"nodes": 2}],
    ),
    "ray-memory-monitor-unified-memory": (
        {"launch": "ray", "env.RAY_memory_monitor_refresh_ms": None},
        [{"env.RAY_memory_monitor_refresh_ms": "0"}, {"launch": "mp"}],
    ),
    "fabric-addr-gen-not-eui64": (
        {"addr_gen_not_eui64": "enP2p1s0f0np0 1"},
        [{"addr_gen_not_eui64": ""}],
    ),
    "engine-ready-timeout-short": (
        {"engine_ready_timeout": 600, "lane_ready_timeout": 1800},
        [{"engine_ready_timeout": 1800}, {"lane_ready_timeout": 600}],
    ),
    "fabric-subnet-overlaps-management": (
        {"fabric_overlaps": "eno1 192.168.0.10/16", "fabric_subnet": "192.168.192.0/24"},
        [{"fabric_overlaps": ""}],
    ),
    "image-nccl-conf-applies": (
        {"nccl_conf_applies": "NCCL_SOCKET_IFNAME=eth0 (/etc/nccl.conf)"},
        [{"nccl_conf_applies": ""}],
    ),
    "kernel-cma-zero": (
        {"cma_total_kib": 0, "kernel": "7.0.0-1019-nvidia"},
        [{"cma_total_kib": 65536, "kernel": "6.17.0-1031-nvidia"}, {"cma_total_kib": None}],
    ),
    "ready-timeout-near-measured-start": (
        {"start_margin_pct": 10, "slowest_start": 1620, "lane_ready_timeout": 1800},
        [{"start_margin_pct": 50}, {"start_margin_pct": None}],
    ),
    "twin-link-narrow": (
        {"narrow_links": "roceP2p1s0f0 x2 of x4"},
        [{"narrow_links": ""}],
    ),
    "twin-missing-from-nccl-ib-hca": (
        {"hca_missing": "roceP2p1s0f0", "ib_hca": "rocep1s0f0"},
        [{"hca_missing": "", "ib_hca": "rocep1s0f0,roceP2p1s0f0"}],
    ),
}


def test_every_shipped_rule_is_tested_here():
    assert set(SHIPPED) == set(TRIPS)


@pytest.mark.parametrize("rule_id", sorted(TRIPS))
def test_a_rule_trips_on_its_facts_and_not_once_remedied(rule_id):
    rule = SHIPPED[rule_id]
    facts, remedies = TRIPS[rule_id]
    assert rule.trips(facts)
    said = rule.said(facts)
    assert said.startswith(f"rule {rule_id} ({rule.severity}): ") and "{" not in said and rule.remedy in said
    for remedy in remedies:
        assert not rule.trips({**facts, **remedy}), remedy


PORT = roce.Port("enp1s0f0np0", "enP2p1s0f0np0", (("rocep1s0f0", "enp1s0f0np0"), ("roceP2p1s0f0", "enP2p1s0f0np0")))


@pytest.fixture(scope="module")
def pair():
    _, settings = load_files("inventory/pair.py", pin=False)
    return next(iter(settings.clusters.values()))


def test_a_nodes_facts_name_the_fabric_netdevs_that_are_not_eui64(pair):
    gens = {"enp1s0f0np0": "0", "enP2p1s0f0np0": "3", "enp1s0f1np1": "1"}
    assert rules.node_facts(PORT, {"gens": gens}, pair)["addr_gen_not_eui64"] == "enP2p1s0f0np0 3"
    unreadable = {**gens, "enP2p1s0f0np0": "-"}
    assert rules.node_facts(PORT, {"gens": unreadable}, pair)["addr_gen_not_eui64"] == ""  # not judged
    (rule, said), = rules.node_tripped(rules.node_facts(PORT, {"gens": gens}, pair))
    assert rule.id == "fabric-addr-gen-not-eui64" and rule.severity == "warn" and "enP2p1s0f0np0 3" in said


# /proc/meminfo as a kernel writes it (fs/proc/meminfo.c: "CmaTotal:" and the kB value), the lines
# around it from a 6.x arm64 kernel; the probe's awk reads the value.
MEMINFO = """MemTotal:       127535104 kB
MemFree:        101232808 kB
MemAvailable:   118001640 kB
FilePmdMapped:         0 kB
CmaTotal:              0 kB
CmaFree:               0 kB
HugePages_Total:       0
"""


def test_the_kernels_cma_area_is_read_as_the_kernel_writes_it(tmp_path, pair):
    """The probe's own awk program on the kernel's text: 0 kB is a fact (the rule trips), a kernel
    without the line none (nothing to judge)."""
    probe = (Path(__file__).resolve().parents[2] / "sparkinfra/scripts/preflight_probe.sh").read_text()
    program = re.search(r"awk '([^']*CmaTotal[^']*)' /proc/meminfo", probe)[1]
    for text, value in ((MEMINFO, "0"), (MEMINFO.replace("CmaTotal:              0", "CmaTotal:          65536"), "65536"),
                        (MEMINFO.replace("CmaTotal:              0 kB\n", ""), "")):
        (tmp_path / "meminfo").write_text(text)
        read = subprocess.run(["awk", program, str(tmp_path / "meminfo")], capture_output=True, text=True, check=True)
        assert read.stdout.strip() == value
    facts = rules.node_facts(PORT, {"cma": "0", "kernel": "7.0.0-1019-nvidia"}, pair)
    (rule, said), = rules.node_tripped(facts)
    assert rule.id == "kernel-cma-zero" and rule.severity == "refuse"
    assert "kernel 7.0.0-1019-nvidia: /proc/meminfo CmaTotal 0 kB" in said
    assert rules.node_facts(PORT, {"cma": ""}, pair)["cma_total_kib"] is None


def test_a_link_trained_narrower_than_it_can_names_the_device(pair):
    widths = {"rocep1s0f0": ("4", "4"), "roceP2p1s0f0": ("2", "4"), "rocep1s0f1": ("1", "4"), "x": ("-", "-")}
    assert rules.node_facts(PORT, {"widths": widths}, pair)["narrow_links"] == "roceP2p1s0f0 x2 of x4"  # the port's
    assert rules.node_facts(PORT, {"widths": {"roceP2p1s0f0": ("-", "-")}}, pair)["narrow_links"] == ""


@pytest.mark.parametrize(("override", "missing"), [
    (None, ""),  # the tool's own: both twins of the port
    ("rocep1s0f0", "roceP2p1s0f0"),
    ("rocep1s0f0:1,roceP2p1s0f0:1", ""),
    ("=rocep1s0f0", "roceP2p1s0f0"),
    ("^roceP2p1s0f0", "roceP2p1s0f0"),
    ("^rocep1s0f1", ""),
])
def test_nccl_ib_hca_that_leaves_out_a_twin_is_named(pair, override, missing):
    lane = find_lane(pair.config.lane)
    if override is not None:
        lane = lane.model_copy(update={"nccl_env": {**lane.nccl_env, "NCCL_IB_HCA": override}})
    facts = rules.node_facts(PORT, {}, pair, lane)
    assert facts["hca_missing"] == missing, facts["ib_hca"]
    site = pair.config.model_copy(update={"nccl_env_overrides": {"NCCL_IB_HCA": "rocep1s0f0"}})
    assert rules.node_facts(PORT, {}, pair.model_copy(update={"config": site}))["hca_missing"] == "roceP2p1s0f0"


def test_a_fact_not_set_is_said_unset():
    said = SHIPPED["ray-memory-monitor-unified-memory"].said({"launch": "ray"})
    assert "launch ray, RAY_memory_monitor_refresh_ms unset" in said


@pytest.mark.parametrize("inventory", ["inventory/pair.py", "inventory/quad.py", "inventory/oct.py", "inventory/sim.py"])
def test_no_shipped_lane_trips_a_refusing_rule_on_its_cluster(inventory):
    _, settings = load_files(inventory, pin=False)
    for cluster in settings.clusters.values():
        lane = find_lane(cluster.config.lane)
        assert rules.refusals(lane, cluster) == [], (inventory, lane.name)


def test_the_tool_gives_vllm_its_own_bound_on_a_start():
    """Unless the lane sets VLLM_ENGINE_READY_TIMEOUT_S, vLLM's engine gets lane_ready_timeout (not 600 s)."""
    _, settings = load_files("inventory/pair.py", pin=False)
    cluster = next(iter(settings.clusters.values()))
    facts = rules.lane_facts(find_lane(cluster.config.lane), cluster)
    assert facts["engine_ready_timeout"] == cluster.config.lane_ready_timeout == facts["lane_ready_timeout"]
    assert facts["env.VLLM_ENGINE_READY_TIMEOUT_S"] == str(cluster.config.lane_ready_timeout)


@pytest.mark.parametrize(("text", "said"), [
    ("title: t\nchecks: disk\nseverity: refuse\nwhen: {a: {is: 1}}\nevidence: e\nremedy: r\nsource: s\n", "checks"),
    ("title: t\nchecks: lane\nseverity: refuse\nwhen: {a: {is: 1, below: 2}}\nevidence: e\nremedy: r\nsource: s\n",
     "when.a"),
    ("title: t\nchecks: lane\nseverity: refuse\nwhen: {a: {is: 1}}\nevidence: e\nremedy: r\nsource: s\nfix: x\n", "fix"),
    ("title: t\nchecks: lane\nseverity: maybe\nwhen: {a: {is: 1}}\nevidence: e\nremedy: r\nsource: s\n", "severity"),
])
def test_a_broken_rule_file_is_named_with_its_key(tmp_path, text, said):
    (tmp_path / "bad-rule.yaml").write_text(text)
    with pytest.raises(rules.RuleError, match=rf"bad-rule\.yaml: {said}"):
        rules.load(tmp_path)


def test_the_listing_names_each_rule_with_what_it_checks_its_remedy_and_source():
    done = subprocess.run([sys.executable, "-m", "sparkinfra.rules"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{len(SHIPPED)} rules (rules/*.yaml)")
    for rule in SHIPPED.values():
        block = done.stdout.split(f"\n{rule.id} ({rule.checks}, {rule.severity}): {rule.title}\n", 1)[1].split("\n\n")[0]
        assert "  checks: " in block and f"  remedy: {rule.remedy}" in block and f"  source: {rule.source}" in block


def test_an_images_nccl_conf_is_read_as_nccl_reads_it_and_judged_in_the_image(tmp_path, monkeypatch, capsys):
    """node/vllm_check.py in the lane's image (issue 41, image rules): what NCCL's configuration
    files set that the rank's environment does not (the user file first, then /etc/nccl.conf; the
    environment always wins), judged by the rules the request carries; check_report says it."""
    from sparkinfra.node import check_report, vllm_check

    user = tmp_path / "nccl.conf"
    user.write_text("# a comment\nNCCL_IB_HCA=mlx5_0\nNCCL_DEBUG = WARN\n")
    env = {"NCCL_CONF_FILE": str(user), "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0"}
    monkeypatch.setattr(vllm_check, "_conf_files", lambda env: [str(user), str(tmp_path / "etc-nccl.conf")])
    (tmp_path / "etc-nccl.conf").write_text("NCCL_DEBUG=INFO\nNCCL_SOCKET_IFNAME=eth0\n")
    facts = vllm_check.image_facts(env)
    assert facts == {"nccl_conf_applies": f"NCCL_DEBUG=WARN ({user}), NCCL_SOCKET_IFNAME=eth0 ({tmp_path}/etc-nccl.conf)"}
    image_rules = rules.image_rules()
    assert [r["id"] for r in image_rules] == ["image-nccl-conf-applies"]
    result = vllm_check.judged({"ok": True, "vllm": "0.32.0", "rank": None, "error": None}, image_rules, facts)
    assert result["ok"] and result["warnings"] == [SHIPPED["image-nccl-conf-applies"].said(facts)]
    ok, line = check_report.say([json.dumps(result)])
    assert ok and line.startswith("vLLM 0.32.0 accepts every rank\nwarning: rule image-nccl-conf-applies (warn): "
                                  f"NCCL_DEBUG=WARN ({user}), NCCL_SOCKET_IFNAME=eth0")
    refusing = [{**image_rules[0], "severity": "refuse"}]
    failed = vllm_check.judged({"ok": True, "vllm": "0.32.0", "rank": None, "error": None}, refusing, facts)
    assert not failed["ok"] and check_report.say([json.dumps(failed)])[1].startswith(
        "the lane's image: rule image-nccl-conf-applies (refuse): NCCL_DEBUG=WARN")
    clean = vllm_check.judged({"ok": True, "vllm": "0.32.0", "rank": None, "error": None}, image_rules,
                              vllm_check.image_facts({**env, "NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "enp1s0f0np0"}))
    assert clean == {"ok": True, "vllm": "0.32.0", "rank": None, "error": None}


def test_a_failed_in_image_check_shows_the_end_of_vllms_own_lines(tmp_path):
    log = tmp_path / "check.log"
    log.write_text("".join(f"vllm line {i}\n" for i in range(50)))
    report = json.dumps({"ok": False, "vllm": "0.32.0", "rank": 1, "error": "bad flag"})
    done = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[2] / "sparkinfra/node/check_report.py"),
                           str(log)], input=f"a mod's line\n{report}\n", capture_output=True, text=True, check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == ["a mod's line", *(f"vllm line {i}" for i in range(20, 50)),
                                        "vLLM 0.32.0 refuses rank 1: bad flag"]


def test_the_slowest_of_the_lanes_recorded_starts_is_held_against_the_bound_on_a_start(pair):
    """The head's probe reads the ready seconds of the lane's last starts (its restart history)."""
    facts = rules.node_facts(PORT, {"starts": "412 1650.5 980 "}, pair)
    assert (facts["slowest_start"], facts["lane_ready_timeout"]) == (1650, pair.config.lane_ready_timeout)
    assert facts["start_margin_pct"] == round(100 * (pair.config.lane_ready_timeout - 1650.5) / pair.config.lane_ready_timeout)
    assert rules.node_facts(PORT, {}, pair)["start_margin_pct"] is None  # no start yet: nothing to judge


# ``ip -o -4 addr show`` as iproute2 prints it (a node on a 192.168.0.0/16 LAN, its fabric port up,
# the twin's link-local address, Docker's bridge): the probe's awk keeps the netdev and the CIDR.
IP_ADDR = """1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: eno1    inet 192.168.3.17/16 brd 192.168.255.255 scope global dynamic eno1\\       valid_lft 86032sec preferred_lft 86032sec
3: enp1s0f0np0    inet 192.168.192.1/24 brd 192.168.192.255 scope global enp1s0f0np0\\       valid_lft forever
5: enP2p1s0f0np0    inet 169.254.192.1/16 brd 169.254.255.255 scope link enP2p1s0f0np0\\       valid_lft forever
7: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\\       valid_lft forever preferred_lft forever
"""


def test_a_fabric_subnet_inside_another_network_of_the_node_is_refused_by_name(tmp_path, pair):
    probe = (Path(__file__).resolve().parents[2] / "sparkinfra/scripts/preflight_probe.sh").read_text()
    program = re.search(r"ip -o -4 addr show 2>/dev/null \| awk '([^']*)'", probe)[1]
    (tmp_path / "ip").write_text(IP_ADDR)
    lines = subprocess.run(["awk", program, str(tmp_path / "ip")], capture_output=True, text=True, check=True).stdout
    assert lines.splitlines()[:2] == ["addr=lo 127.0.0.1/8", "addr=eno1 192.168.3.17/16"]
    addrs = [line.split("=", 1)[1] for line in lines.splitlines()]
    facts = rules.node_facts(PORT, {"addrs": addrs}, pair)
    assert facts["fabric_overlaps"] == "eno1 192.168.3.17/16" and facts["fabric_subnet"] == "192.168.192.0/24"
    (rule, said), = rules.node_tripped(facts)
    assert rule.severity == "refuse" and "eno1 192.168.3.17/16 overlaps fabric_subnet 192.168.192.0/24" in said
    apart = [a.replace("192.168.3.17/16", "10.1.3.17/16") for a in addrs]
    assert rules.node_facts(PORT, {"addrs": apart}, pair)["fabric_overlaps"] == ""
