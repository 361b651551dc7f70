"""
What the field already learned, as data: each known-bad state is one file under ``rules/`` (the
project's folder, beside ``lanes/``) saying what it checks, the evidence it prints, the remedy,
where the field met it and whether it refuses or warns. A new rule is a new file and its test.

A rule's ``when`` holds conditions on named facts, every one of which must hold for the rule to
trip. The facts of a ``lane`` rule are what the settings and the lane decide, read on the
controller before any connection (``lane_facts``):

    nodes, launch, nccl_version, rdma, lane_ready_timeout, engine_ready_timeout (what vLLM's API
    process gives its engine), env.NAME (rank 0's environment as the lane renders it: the lane's,
    the site's lane_env over it, the tool's defaults), nccl_env.NAME (the cluster's NCCL
    environment with the lane's changes)

The facts of an ``image`` rule are read in the lane's image, with a rank's environment, by the
head's vLLM check before any rank starts (``node/vllm_check.py``: a refusal fails the check):

    nccl_conf_applies (what NCCL's configuration files in the image set that the rank's environment
    does not, so NCCL applies it: "NCCL_SOCKET_IFNAME=eth0 (/etc/nccl.conf)"; empty when nothing)

The facts of a ``node`` rule are read on each node by preflight's probe, before any change
(``node_facts``): a refusing rule fails the node's preflight, a warning passes it, said.

    addr_gen_not_eui64 (the fabric port's and its twin's netdevs whose IPv6 addr_gen_mode is not
    eui64, with it: "enp1s0f1np1 1"; empty when none), kernel (its release), cma_total_kib (the
    kernel's CMA area, /proc/meminfo's CmaTotal; None when the kernel shows none), narrow_links (the
    port's RDMA devices whose PCIe link trained narrower than it can: "roceP2p1s0f0 x2 of x4"),
    hca_missing (the port's RDMA devices that NCCL_IB_HCA, as the node's ranks get it, leaves out),
    ib_hca (that value), fabric_overlaps (the node's other IPv4 networks that overlap the fabric
    subnet: "eno1 192.168.0.10/16"), fabric_subnet, slowest_start (the head: the slowest of the
    lane's last ten starts to get ready, in s, from its restart history; None before one),
    lane_ready_timeout, start_margin_pct (how much of lane_ready_timeout that start left, in %)

    python -m sparkinfra.rules            # every rule: what it checks, its remedy, its source
"""

from __future__ import annotations

import functools
from ipaddress import ip_interface
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .. import roce
from ..lanes import Lane, LaneError, check_lane, find_lane, lane_source, launch
from ..node import rule_eval
from ..operations.nccl import nccl_env, nccl_variables
from ..settings import Cluster

RULES_DIR = Path(__file__).resolve().parents[2] / "rules"
VLLM_ENGINE_READY_TIMEOUT_S = 600  # vLLM's own default, where nothing sets it


class Condition(BaseModel):
    """One test of a fact: exactly one of its keys. A fact that is not set is ``None``."""

    model_config = ConfigDict(extra="forbid")

    is_: str | int | bool | None = Field(None, alias="is")
    is_not: str | int | bool | None = None
    at_least: int | None = None
    below: int | None = None
    below_fact: str | None = Field(None, description="another fact's name: this one is below it")

    @model_validator(mode="after")
    def _one(self) -> Condition:
        given = [k for k in self.model_fields_set]
        if len(given) != 1:
            raise ValueError(f"a condition is exactly one of is, is_not, at_least, below, below_fact (has {given})")
        return self

    def plain(self) -> dict:
        """The condition as ``rule_eval`` reads it: ``{"is": 1}``."""
        key = next(iter(self.model_fields_set))
        return {key.rstrip("_"): getattr(self, key)}


class Rule(BaseModel):
    """One known-bad state (a file ``rules/<id>.yaml``; ``id`` is its stem)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    title: str = Field(min_length=1)
    checks: Literal["lane", "node", "image"]
    severity: Literal["refuse", "warn"]
    when: dict[str, Condition] = Field(min_length=1)
    evidence: str = Field(min_length=1, description="What it prints, {fact} filled in.")
    remedy: str = Field(min_length=1)
    source: str = Field(min_length=1, description="Where the field met it.")

    def plain(self) -> dict:
        """The rule as ``rule_eval`` reads it (and the in-image check receives it)."""
        return {"id": self.id, "title": self.title, "severity": self.severity, "evidence": self.evidence,
                "remedy": self.remedy, "when": {name: c.plain() for name, c in self.when.items()}}

    def trips(self, facts: dict) -> bool:
        return rule_eval.trips(self.plain(), facts)

    def said(self, facts: dict) -> str:
        """``rule ID (refuse): <evidence>. <title>; remedy: <remedy>``."""
        return rule_eval.said(self.plain(), facts)


class RuleError(ValueError):
    """A rule file that does not parse, named with its key."""


def load(folder: Path = RULES_DIR) -> list[Rule]:
    """Every rule of ``folder``, by id. Raises ``RuleError`` naming the file and the key."""
    rules = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
            rules.append(Rule.model_validate({**(data or {}), "id": path.stem}))
        except yaml.YAMLError as exc:
            raise RuleError(f"{path}: {exc}") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise RuleError(f"{path}: {where}: {first['msg']}") from None
    return rules


@functools.cache
def shipped() -> tuple[Rule, ...]:
    """The rules of ``RULES_DIR``, read once per process (a run checks every lane and every node)."""
    return tuple(load())


def image_rules() -> list[dict]:
    """The shipped ``image`` rules as the head's in-image check receives them (``rule_eval``)."""
    return [rule.plain() for rule in shipped() if rule.checks == "image"]


def lane_facts(lane: Lane, cluster: Cluster) -> dict:
    """The facts a ``lane`` rule reads, as the settings and the lane decide them."""
    config = cluster.config
    env = launch(lane, cluster, 0).env
    # The lane's changes go over the site's overrides (a value sets, None removes), as the runner applies them.
    nccl = nccl_env(nccl_variables(cluster), {**config.nccl_env_overrides, **lane.nccl_env},
                    list(cluster.fabric.rdma_devices), "")
    facts = {
        "nodes": len(cluster.nodes), "launch": lane.launch, "nccl_version": config.nccl_version,
        "rdma": lane.container.rdma, "lane_ready_timeout": config.lane_ready_timeout,
        "engine_ready_timeout": int(env.get("VLLM_ENGINE_READY_TIMEOUT_S") or VLLM_ENGINE_READY_TIMEOUT_S),
    }
    facts.update({f"env.{k}": v for k, v in env.items()})
    facts.update({f"nccl_env.{k}": v for k, v in nccl.items()})
    return facts


def tripped(lane: Lane, cluster: Cluster, rules: list[Rule] | None = None) -> list[tuple[Rule, str]]:
    """The ``lane`` rules ``lane`` on ``cluster`` trips, each with what it says (none for a lane that
    does not render on the cluster: ``lanes.check_lane`` says why)."""
    try:
        facts = lane_facts(lane, cluster)
    except LaneError:
        return []
    return [(rule, rule.said(facts)) for rule in (shipped() if rules is None else rules)
            if rule.checks == "lane" and rule.trips(facts)]


def node_facts(port: roce.Port, probe: dict, cluster: Cluster, lane: Lane | None = None) -> dict:
    """
    The facts a ``node`` rule reads, from preflight's probe of the node.

    + port: the node's fabric port (its interface, its twin, the HCAs NCCL uses)
    + probe: ``gens`` (each netdev's IPv6 addr_gen_mode, ``-``: not readable), ``widths`` (each RDMA
      device's current and max PCIe link width), ``kernel``, ``cma`` (kB, "" when none), ``addrs``
      ("NETDEV CIDR" each), ``starts`` (the head: its lane's last starts' seconds)
    + cluster, lane: the NCCL environment the node's ranks get (the lane's changes over the site's)
    """
    gens, cma = probe.get("gens", {}), probe.get("cma", "")
    overrides = {**cluster.config.nccl_env_overrides, **(lane.nccl_env if lane else {})}
    ib_hca = nccl_env({}, overrides, list(cluster.fabric.rdma_devices) or port.devices, "").get("NCCL_IB_HCA", "")
    return {
        "addr_gen_not_eui64": ", ".join(f"{n} {gens[n]}" for n in port.netdevs if gens.get(n, "-") not in ("0", "-")),
        "kernel": probe.get("kernel") or None,
        "cma_total_kib": int(cma) if cma.isdigit() else None,
        "narrow_links": ", ".join(_narrow(port, probe.get("widths", {}))),
        "ib_hca": ib_hca,
        "hca_missing": ", ".join(_left_out(port, ib_hca)),
        "fabric_overlaps": ", ".join(_overlapping(port, probe.get("addrs", []), cluster)),
        "fabric_subnet": str(cluster.fabric.subnet),
        **_start_margin(probe.get("starts", ""), cluster.config.lane_ready_timeout),
    }


def _narrow(port: roce.Port, widths: dict[str, tuple[str, ...]]) -> list[str]:
    """The port's RDMA devices whose PCIe link trained narrower than its max: "DEV xCUR of xMAX"."""
    found = []
    for device in port.devices:
        width = widths.get(device, ())
        if len(width) == 2 and all(w.isdigit() for w in width) and int(width[0]) < int(width[1]):
            found.append(f"{device} x{width[0]} of x{width[1]}")
    return found


def _left_out(port: roce.Port, ib_hca: str) -> list[str]:
    """The port's RDMA devices ``NCCL_IB_HCA`` leaves out (its ``^`` excludes, ``=`` exact, ``:port``
    suffixes; unset or empty: NCCL takes every device)."""
    named = {item.split(":")[0] for item in ib_hca.lstrip("^=").split(",") if item}
    excluded = ib_hca.startswith("^")
    return [d for d in port.devices if ib_hca and (d in named) == excluded]


def _overlapping(port: roce.Port, addrs: list[str], cluster: Cluster) -> list[str]:
    """The node's addresses on other netdevs whose network overlaps the fabric subnet."""
    found = []
    for line in addrs:
        netdev, _, cidr = line.partition(" ")
        try:
            network = ip_interface(cidr).network
        except ValueError:
            continue
        if netdev not in (*port.netdevs, "lo") and network.overlaps(cluster.fabric.subnet):
            found.append(f"{netdev} {cidr}")
    return found


def _start_margin(starts: str, timeout: int) -> dict:
    """``slowest_start`` (s) of the recorded ``starts``, ``lane_ready_timeout`` and how much of it that
    start left (``start_margin_pct``); None where no start was recorded."""
    seconds = [float(x) for x in starts.split() if x.replace(".", "", 1).isdigit()]
    slowest = max(seconds) if seconds else None
    return {"slowest_start": None if slowest is None else round(slowest), "lane_ready_timeout": timeout,
            "start_margin_pct": None if slowest is None else round(100 * (timeout - slowest) / timeout)}


def node_tripped(facts: dict, rules: list[Rule] | None = None) -> list[tuple[Rule, str]]:
    """The ``node`` rules a node's ``facts`` trip, each with what it says."""
    return [(rule, rule.said(facts)) for rule in (shipped() if rules is None else rules)
            if rule.checks == "node" and rule.trips(facts)]


def refusals(lane: Lane, cluster: Cluster) -> list[str]:
    """What the refusing rules ``lane`` on ``cluster`` trips say, each after the lane's file (a
    converge refuses before connecting)."""
    return [f"{lane_source(lane)}: {said}" for rule, said in tripped(lane, cluster) if rule.severity == "refuse"]


def warnings(lane: Lane, cluster: Cluster) -> list[str]:
    """What the warning rules ``lane`` on ``cluster`` trips say, each after the lane's file
    (``lanes show`` prints them)."""
    return [f"{lane_source(lane)}: {said}" for rule, said in tripped(lane, cluster) if rule.severity == "warn"]


def lane_problems(cluster: Cluster, project: str | Path | None = None) -> list[str]:
    """What keeps the cluster's lane setting from serving on it: a missing or bad file,
    ``lanes.check_lane``, and the refusing rules it trips."""
    try:
        lane = find_lane(cluster.config.lane, project=project)
    except LaneError as exc:
        return [str(exc)]
    return check_lane(lane, cluster) + refusals(lane, cluster)


def listing(rules: list[Rule]) -> str:
    """What ``python -m sparkinfra.rules`` prints: each rule, what it checks, its remedy and source."""
    out = []
    for rule in rules:
        checks = "; ".join(f"{name} {_condition(c)}" for name, c in rule.when.items())
        out += [f"{rule.id} ({rule.checks}, {rule.severity}): {rule.title}",
                f"  checks: {checks}", f"  remedy: {rule.remedy}", f"  source: {rule.source}", ""]
    return "\n".join(out)


def _condition(c: Condition) -> str:
    key = next(iter(c.model_fields_set))
    value = getattr(c, key)
    return {"is_": f"is {value!r}", "is_not": f"is not {value!r}", "at_least": f">= {value}",
            "below": f"< {value}", "below_fact": f"< {value}"}[key]
