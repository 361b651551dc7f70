"""
How a known-bad rule (``rules/<id>.yaml``, read by ``sparkinfra.rules``) judges facts, stdlib only:
the controller uses it for lane and node rules, and the head's in-image check
(``vllm_check.py``) for image rules, which travel in its request as plain dicts.

A rule dict: ``id``, ``title``, ``severity`` (refuse | warn), ``when`` (fact name: one condition,
``{"is" | "is_not" | "at_least" | "below" | "below_fact": value}``), ``evidence`` (``{fact}``
filled in), ``remedy``. A fact that is not set is None.
"""

from __future__ import annotations

import re


def holds(condition: dict, value, facts: dict) -> bool:
    """Whether ``value`` (a fact) meets ``condition`` (one key of it)."""
    (key, wanted), = condition.items()
    if key == "is":
        return _same(value, wanted)
    if key == "is_not":
        return not _same(value, wanted)
    number = _number(value)
    if key == "at_least":
        return number is not None and number >= wanted
    if key == "below":
        return number is not None and number < wanted
    other = _number(facts.get(wanted))  # below_fact
    return number is not None and other is not None and number < other


def trips(rule: dict, facts: dict) -> bool:
    """Whether every condition of ``rule`` holds on ``facts``."""
    return all(holds(condition, facts.get(name), facts) for name, condition in rule["when"].items())


def said(rule: dict, facts: dict) -> str:
    """``rule ID (SEVERITY): <evidence>. <title>; remedy: <remedy>``."""
    evidence = re.sub(r"\{([\w.]+)\}", lambda m: _shown(facts.get(m[1])), rule["evidence"])
    return f"rule {rule['id']} ({rule['severity']}): {evidence}. {rule['title']}; remedy: {rule['remedy']}"


def _same(value, wanted) -> bool:
    if value is None or wanted is None:
        return value is wanted
    if isinstance(wanted, bool) or isinstance(value, bool):
        return str(value).lower() == str(wanted).lower()
    return str(value) == str(wanted)


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _shown(value) -> str:
    return "unset" if value is None else str(value)
