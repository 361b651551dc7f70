"""
Lanes on a node: the lane container, the lane units, the lane runner's status.
"""

from __future__ import annotations

import json

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from ..node import paths
from .stage import docker_answer


class DockerContainer(FactBase):
    """
    Returns a container's state by name (``{"status": "exited", "running": False}``), or
    ``None`` when there is no such container. Docker's other errors (no daemon) are the fact's
    error, on this host (``docker_answer``).

    + container: the container name
    """

    @override
    def command(self, container: str) -> StringCommand:
        return StringCommand(
            # container inspect: a plain ``inspect`` of a missing name goes on to look for an image,
            # network, volume... of that name, one API call each
            "docker", "container", "inspect", "--format", QuoteString("{{.State.Status}} {{.State.Running}}"),
            QuoteString(container), "2>&1", "||", "true",
        )

    @override
    def process(self, output):
        line = docker_answer(output, lambda text: len(text.split()) == 2 and text.split()[1] in ("true", "false"))
        if line is None:
            return None
        status, running = line.split()
        return {"status": status, "running": running == "true"}


class LaneUnits(FactBase):
    """
    Returns the lane units installed on a node: ``{lane: {"active": str, "enabled": str}}``.
    """

    @staticmethod
    def default():
        return {}

    @override
    def command(self) -> str:
        return (
            f"for f in {paths.unit_path(paths.LANE_UNITS)}; do [ -e \"$f\" ] || continue; "
            "u=$(basename \"$f\"); echo \"$u $(systemctl is-active \"$u\") $(systemctl is-enabled \"$u\" 2>/dev/null)\"; "
            "done"
        )

    @override
    def process(self, output):
        units = {}
        for line in output:
            words = line.split()
            if len(words) >= 2 and words[0].startswith(paths.LANE_UNIT_PREFIX):
                lane = words[0][len(paths.LANE_UNIT_PREFIX):-len(".service")]
                units[lane] = {"active": words[1], "enabled": words[2] if len(words) > 2 else "unknown"}
        return units


class LaneFiles(FactBase):
    """
    Returns the lanes that left files on this node (``paths.lane_paths``), each with its paths:
    ``{"sim-b": ["/etc/sparkinfra/lanes/sim-b.json", ...]}``.
    """

    @staticmethod
    def default():
        return {}

    @override
    def command(self) -> str:
        patterns = [paths.unit_path(paths.LANE_UNITS),
                    *(f"{folder}/*" for folder in (paths.PLANS_DIR, paths.STATE_DIR, paths.MODS_DIR,
                                                   paths.MARKS_DIR))]
        return "for f in " + " ".join(patterns) + '; do [ -e "$f" ] && echo "$f"; done; true'

    @override
    def process(self, output):
        found: dict[str, list[str]] = {}
        for path in output:
            lane = paths.lane_of_path(path.strip())
            if lane:
                found.setdefault(lane, []).append(path.strip())
        return {lane: sorted(paths) for lane, paths in sorted(found.items())}


class LaneStatus(FactBase):
    """
    Returns a lane's state on this node, as ``lane_ctl status`` reports it, or ``{}`` before the
    lane is placed. On the head: the workers' units and whether the API completes a request.

    .. code:: python

        {
            "lane": "sim", "unit": "active", "planned": "9f2c...", "started": "9f2c...", "warm": "9f2c...",
            "container": "true sha256:...", "workers": {"10.0.0.2": "active"},
            "api": "ok",                  # or "down", or the failing HTTP answer
            "others": [],                 # other lanes' units active here
            "age": 310,                   # seconds since this start (None: not started)
            "api_key": "current",         # or "changed" (the key the start used is not the settings'), None
            "history": [{"event": "start", "why": "a converge: ...", "at": 1764999000.0}, ...],
                                          # the head's last 5 starts, readies and stops (head only)
            "failures": None,             # the head's count of failures in a row (with probe)
            "known": [{"number": 1, "lane": "sim", "digest": "9f2c...", "image": "...", "at": 1764999000.0,
                       "why": "...", "canary": {...}}],  # the head's known good sets, oldest first (``lane_known``)
            "rejected": None,             # the plan a rollback turned away ({digest, why, at, number})
            "rollback_to": None,          # the set a rollback by hand goes to by default (its number)
        }

    + lane: the lane's name
    + probe: on the head, also ask the workers' units and the API (else ``workers`` stays empty and
      ``api`` None: the marks and this node's unit only)
    """

    @staticmethod
    def default():
        return {}

    @override
    def command(self, lane: str, probe: bool = True) -> StringCommand:
        status = paths.program("lane_ctl", "status", paths.plan_path(lane), *([] if probe else ["--local"]))
        return StringCommand(
            "test", "-f", f"{paths.PROGRAMS}/lane_ctl.py", "&&", *map(QuoteString, status), "||", "echo", "'{}'"
        )

    @override
    def process(self, output):
        return json.loads("\n".join(output) or "{}")


class LaneRejected(FactBase):
    """
    Returns the head's mark of the lane's plan that a rollback turned away (``paths.rejected_path``),
    or ``None``:

    .. code:: python

        {"digest": "9f2c...", "why": "it failed its canary: decode tok/s (json) 9.1, baseline 41.2 ...",
         "at": 1764999000.0, "number": 3}   # number: the known good set it went back to

    + lane: the lane's name
    """

    @override
    def command(self, lane: str) -> StringCommand:
        path = QuoteString(paths.rejected_path(lane))
        return StringCommand("cat", path, "2>/dev/null", "||", "true")

    @override
    def process(self, output):
        try:
            found = json.loads("\n".join(output) or "null")
        except ValueError:
            return None
        return found if isinstance(found, dict) and found.get("digest") else None
