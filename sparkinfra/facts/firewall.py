"""
The node's host firewall as sparkinfra sees it: its own nftables table, and the kernel's ephemeral
port range (where every port the kernel picks for a listener lies). No other table is read.
"""

from __future__ import annotations

import json

from pyinfra.api import FactBase, StringCommand
from typing_extensions import override

from .. import scripts


class FirewallTable(FactBase):
    """
    Returns the kernel's ephemeral port range and the live table ``inet sparkinfra``, read from
    ``nft -j list table inet sparkinfra`` (nftables' JSON) into what it does:

    .. code:: python

        {"nft": True, "ephemeral": [32768, 60999],
         "table": {"chains": ["input: filter hook input priority 0 policy accept"],
                   "ports": [[29501, 29501], [32768, 60999]],
                   "rules": ["iif lo accept", "tcp dport {22,8000} accept",
                             "ip saddr 10.0.0.0/24 accept",
                             "tcp dport @cluster_ports ct state new reject tcp reset"]}}

    ``ports``: the set ``cluster_ports`` as (first, last) ranges; each rule in nft's words, an
    expression it does not know as its JSON (so any other rule differs). ``table`` is None without
    the table; ``nft`` is False on a node without nft.
    """

    @override
    def command(self) -> StringCommand:
        return scripts.command("firewall_table.sh")

    @override
    def process(self, lines):
        lines = list(lines)
        state = {"nft": True, "ephemeral": None, "table": None}
        body = []
        for line in lines:
            words = line.split()
            if words[:1] == ["ephemeral"] and len(words) == 3:
                state["ephemeral"] = [int(words[1]), int(words[2])]
            elif words == ["no-nft"]:
                state["nft"] = False
            else:
                body.append(line)
        text = "\n".join(body).strip()
        if text:
            state["table"] = table_rules(json.loads(text))
        return state


def table_rules(listing: dict) -> dict | None:
    """What ``nft -j list table inet sparkinfra``'s output holds: its chains, its set
    ``cluster_ports`` and each rule, in nft's words (see ``FirewallTable``); None without a table."""
    items = listing.get("nftables", [])
    if not any("table" in item for item in items):
        return None
    out = {"chains": [], "ports": [], "rules": [], "sets": []}
    for item in items:
        if "chain" in item:
            c = item["chain"]
            out["chains"].append(f"{c['name']}: {c.get('type')} hook {c.get('hook')} priority {c.get('prio')} "
                                 f"policy {c.get('policy')}")
        elif "set" in item:
            s = item["set"]
            if s["name"] == "cluster_ports":
                out["ports"] = [_range(e) for e in s.get("elem", [])]
            else:
                out["sets"].append(s["name"])
        elif "rule" in item:
            out["rules"].append(" ".join(_words(e) for e in item["rule"].get("expr", [])))
    if not out["sets"]:
        del out["sets"]  # a set other than ours is named, so that the table differs
    return out


def _range(element) -> list[int]:
    if isinstance(element, dict) and "range" in element:
        return [int(element["range"][0]), int(element["range"][1])]
    return [int(element), int(element)]


def _words(expression: dict) -> str:
    """One expression of a rule in nft's words; one this module does not know, as its JSON."""
    if "accept" in expression:
        return "accept"
    if "reject" in expression:
        kind = (expression["reject"] or {}).get("type")
        return f"reject {kind}" if kind else "reject"
    match = expression.get("match")
    if match:
        left, right = _side(match["left"]), _side(match["right"])
        if left is not None and right is not None:
            op = "" if match["op"] in ("==", "in") else f"{match['op']} "
            return f"{left} {op}{right}"
    return json.dumps(expression, sort_keys=True)


def _side(value) -> str | None:
    if isinstance(value, (str, int)):
        return str(value)
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if "meta" in value:
        return value["meta"]["key"]
    if "payload" in value and "protocol" in value["payload"]:
        return f"{value['payload']['protocol']} {value['payload']['field']}"
    if "ct" in value:
        return f"ct {value['ct']['key']}"
    if "prefix" in value:
        return f"{value['prefix']['addr']}/{value['prefix']['len']}"
    if "set" in value:
        items = ["-".join(str(p) for p in _range(v)) if isinstance(v, dict) else str(v) for v in value["set"]]
        return items[0] if len(items) == 1 else "{" + ",".join(items) + "}"
    return None
