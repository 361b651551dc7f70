"""
The steps of a lane on its cluster, shared by ``deploys/lane.py`` (placed, then serving) and
``deploys/tune.py`` (placed only: its trials start the lane themselves).

.. code:: python

    here = run.start()
    plan = lane_steps.placed(here)                # every node: files, unit (the head validates); then no other lane
    if plan and here.is_head:
        lane_steps.serving_from_head(here, plan)  # the head starts every rank, waits until ready, warms

``of_run(here)`` is the cluster's lane on it (``cluster_lane.ClusterLane``), built once per run and
cluster, which every step (and ``deploys/tune.py``, ``deploys/bench.py``) reads.
"""

from __future__ import annotations

import time
import weakref

from pyinfra import host, inventory
from pyinfra.api import State, deploy
from pyinfra.context import ctx_state
from pyinfra.operations import systemd
from pyinfra.operations.util import any_changed

from . import lanes, rules, serving
from .bench import canary
from .cluster_lane import ClusterLane, cluster_lane
from .facts.lane import LaneRejected
from .facts.reading import unproxied
from .node.paths import PROGRAMS
from .lanes.ports import firewalled, left_open
from .operations.files import file_content, render, secret_env_file
from .operations.firewall import fabric_only_ports
from .operations.lane import (
    lane_known_good,
    lane_running,
    lane_validated,
    lane_warm,
    other_lanes_absent,
    other_lanes_stopped,
)
from .operations.node import programs_present
from .operations.units import service_enabled
from .run import Here


# The run's lanes, by its own state (as ``run.start`` keeps its settings): cluster name -> its lane.
_built: weakref.WeakKeyDictionary[State, dict[str, ClusterLane | None]] = weakref.WeakKeyDictionary()


def of_run(here: Here) -> ClusterLane | None:
    """The lane ``here``'s cluster serves, on it (None: none), built by the first host that asks."""
    built = _built.setdefault(unproxied(ctx_state.get()), {})
    if here.cluster.name not in built:
        built[here.cluster.name] = cluster_lane(here.cluster)
    return built[here.cluster.name]


def placed(here: Here, to_serve: bool = True) -> serving.RankPlan | None:
    """
    Place the cluster's lane on this node (runner, env files, plan, unit; validated by vLLM in the
    image on the head), then stop and remove every other lane: the old lane serves until the new one
    is placed and validated on the head (a head that failed leaves it serving). This node's plan,
    or None when the cluster has no lane. ``to_serve``: refuse a plan a rollback turned away
    (``refuse_rejected``; a bracketing, which looks for what makes it start, places it anyway).
    """
    on = of_run(here)
    mine = None
    if on:
        if here.is_head:  # once per cluster, before any operation runs: the controller's vLLM, cached
            lanes.refuse_invalid(on.lane, on.cluster)
            if to_serve:
                refuse_rejected(on)
        mine = on.plan(host.name)
    _ports_to_fabric(here, on)
    if on:
        _files(here, on, mine)
    _no_other_lane(here, here.cluster.config.lane)
    return mine


def refuse_rejected(on: ClusterLane) -> None:
    """
    Raise ``LaneError`` when the plan the settings ask for is one a rollback turned away on the
    cluster's head (its start or canary failed, or an operator rolled back from it), unless
    ``retry_rejected``: a converge with unchanged settings never silently undoes a rollback. Read
    before any operation runs.
    """
    mark = host.get_fact(LaneRejected, lane=on.lane.name)
    if not mark or mark["digest"] != on.digest or on.cluster.config.retry_rejected:
        return
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(mark.get("at") or 0))
    back = f"known good #{mark['number']}" if mark.get("number") else "a known good set"
    raise lanes.LaneError(
        f"cluster {on.cluster.name}: the site and the cluster differ. The settings ask for lane {on.lane.name} "
        f"plan {on.digest}, which was rolled back on {when}: {mark.get('why')}. The cluster serves {back} "
        f"(python -m sparkinfra status INVENTORY). Change the settings, or start that plan once more with "
        f"--data retry_rejected=true."
    )


def head_in_run(here: Here):
    """For ``_if=``: whether this cluster's head is in the run and has not failed (checked when the
    operation runs, after the operations before it ran on every host)."""
    head = inventory.get_host(here.cluster.head.name)

    def _head_ok() -> bool:
        state = host.state
        return head in state.activated_hosts and head not in state.failed_hosts

    return _head_ok


@deploy("No other lane")
def _no_other_lane(here: Here, lane: str) -> None:
    stopped = other_lanes_stopped(
        name=f"No lane but {lane or '(none)'} runs on this node",
        lane=lane,
        _if=head_in_run(here),
    )
    removed = other_lanes_absent(
        name=f"No files of a lane but {lane or '(none)'} are left on this node",
        lane=lane,
        _if=head_in_run(here),
    )
    systemd.daemon_reload(
        name="systemd has forgotten the other lanes' units",
        _if=any_changed(stopped, removed),
    )


@deploy("The cluster's ports")
def _ports_to_fabric(here: Here, on: ClusterLane | None) -> None:
    subnet = str(here.cluster.fabric.subnet)
    if not (on and here.cluster.config.firewall):
        fabric_only_ports(name="No firewall table of sparkinfra's is on this node", present=False)
        return
    fabric_only_ports(
        name=f"Lane {on.lane.name}'s ports on this node answer the fabric subnet {subnet} only (SSH and the API: anyone)",
        ports=firewalled(on.lane, on.cluster),
        subnet=subnet,
        open_ports=left_open(on.api_port, host.data.get("ssh_port")),
    )


@deploy("Lane files")
def _files(here: Here, on: ClusterLane, mine: serving.RankPlan) -> None:
    cluster, config, lane = on.cluster, on.cluster.config, on.lane
    name = lane.name
    programs_present(name=f"The node programs (the lane runner, the container check, the mod runner) are at {PROGRAMS}")
    for mod in on.mods:  # each file as it is on the controller: the plan holds their digest
        for relative, path in lanes.mod_files(mod):
            file_content(
                name=f"Mod {mod.name} of lane {name} has {relative}",
                path=f"{serving.MODS_DIR}/{name}/{mod.name}/{relative}",
                src=str(path),
                mode="755" if path.stat().st_mode & 0o100 else "644",
            )
    file_content(
        name=f"This node's environment for lane {name} is in {serving.env_path(name)} (root only)",
        path=serving.env_path(name),
        content=render(
            "etc/sparkinfra/lanes/lane.env.j2", lane=name, rank=mine.rank, variables=sorted(mine.env.items())
        ),
        mode="600",
    )
    if here.is_head:
        secret_env_file(
            name=f"The API key is in {serving.secret_env_path(name)} (root only)"
            if config.api_key_env else "No API key file is left from an earlier setting",
            path=serving.secret_env_path(name),
            variable="VLLM_API_KEY",
            env=config.api_key_env,
            present=bool(config.api_key_env),
        )
    file_content(
        name=f"This node's plan for lane {name} is in {serving.plan_path(name)}",
        path=serving.plan_path(name),
        content=serving.plan_json(mine),
        mode="600",
    )
    unit = file_content(
        name=f"Unit {serving.unit_name(name)} runs this node's rank of lane {name}",
        path=f"/etc/systemd/system/{serving.unit_name(name)}",
        content=render("etc/systemd/system/sparkinfra-lane.service.j2", **mine.unit_values()),
    )
    systemd.daemon_reload(
        name="systemd has read the lane's unit",
        _if=unit.did_change,
    )
    if here.is_head:
        lane_validated(
            name=f"vLLM in {mine.image} accepts lane {name}'s arguments for every rank",
            lane=name,
            image=mine.image,
            request={**lanes.vllm_request(lane, cluster, engine=True, in_image=True), "rules": rules.image_rules()},
            docker_options=list(mine.docker_options),
            mods=list(mine.mods),
            compile_cache=serving.compile_cache(name),
        )


@deploy("Lane serving")
def serving_from_head(here: Here, plan: serving.RankPlan) -> None:
    """On the head: the lane of ``plan`` (``placed``'s) enabled at boot, every rank started
    (workers first), ready, warm, then its canary against the baseline: known good on every node,
    or rolled back."""
    name, digest = plan.lane, plan.digest
    service_enabled(  # starting is lane_running's: once, all ranks, workers first
        name=f"Lane {name} starts with the head at boot",
        service=serving.unit_name(name),
        enabled=True,
    )
    lane_running(
        name=f"Lane {name} serves on every node (plan {digest})",
        lane=name,
        digest=digest,
        ready_timeout=here.cluster.config.lane_ready_timeout,
    )
    lane_warm(
        name=f"Lane {name} is warm (one request per workload shape)",
        lane=name,
        digest=digest,
    )
    lane_known_good(
        name=f"Lane {name}'s plan {digest} passed its canary and is known good on every node (kept to return to)",
        lane=name,
        digest=digest,
        keep=here.cluster.config.known_good_keep,
        canary=canary.of_lane(of_run(here)),
        ready_timeout=here.cluster.config.lane_ready_timeout,
    )
