"""
The known-bad rules (``rules/*.yaml``, ``sparkinfra.rules``): each shipped rule loads, trips on the
facts it names and not once its remedy is applied; no shipped lane trips a refusing rule on its
shipped cluster; a broken rule file is named with its key; ``python -m sparkinfra.rules`` lists
them. The real command line refusing each one is in the bad-input corpus (``*-rule-*`` cases).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from sparkinfra import rules
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


def test_a_nodes_facts_name_the_fabric_netdevs_that_are_not_eui64():
    gens = {"enp1s0f0np0": "0", "enP2p1s0f0np0": "3", "enp1s0f1np1": "1", "x": "-"}
    assert rules.node_facts(["enp1s0f0np0", "enP2p1s0f0np0"], gens) == {"addr_gen_not_eui64": "enP2p1s0f0np0 3"}
    assert rules.node_facts(["enp1s0f0np0", "x"], gens) == {"addr_gen_not_eui64": ""}  # unreadable: not judged
    (rule, said), = rules.node_tripped(rules.node_facts(["enP2p1s0f0np0"], gens))
    assert rule.id == "fabric-addr-gen-not-eui64" and rule.severity == "warn" and "enP2p1s0f0np0 3" in said


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
    ("title: t\nchecks: image\nseverity: refuse\nwhen: {a: {is: 1}}\nevidence: e\nremedy: r\nsource: s\n", "checks"),
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
