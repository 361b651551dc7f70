"""deploys/lane.py: the lane's units on every node, one plan, the right env and pin in the containers, an API that completes."""

import json
import re
import shlex

import pytest

from sparkinfra import lanes, nccl_log, serving
from sparkinfra.facts.firewall import FirewallTable
from sparkinfra.facts.lane import LaneStatus, LaneUnits
from sparkinfra.lanes.ports import firewalled, left_open, merged
from sparkinfra.facts.nccl import NcclPin
from sparkinfra.node import paths
from sparkinfra.node.paths import FIREWALL_FILE, FIREWALL_UNIT, NCCL_IDENTITY, NCCL_PIN_RECORD
from sparkinfra.operations.firewall import wanted_table


def _lane(target):
    name = target.cluster.config.lane
    if not name:
        pytest.skip(f"cluster {target.cluster.name} serves no lane")
    return lanes.find_lane(name)


def _head(cluster):
    return next(t for t in cluster if t.node.rank == 0)


def _inspect(target, container):
    out = target.root(f"docker inspect {container}")
    assert out.rc == 0, f"{target}: no container {container}: {out.stderr}"
    return json.loads(out.stdout)[0]


def _rank_nccl_env(target, lane) -> dict[str, str]:
    """The NCCL environment a rank's container gets: the node's file, with the lane's ``nccl_env``
    applied (a value set, null removed) as the runner writes it."""
    env = {k: v for k, v in target.nccl_env().items() if k not in lane.nccl_env}
    env.update({k: v for k, v in lane.nccl_env.items() if v is not None})
    return env


def test_lane_unit_is_active(node):
    lane = _lane(node)
    units = node.fact(LaneUnits)
    assert lane.name in units, f"{node}: {paths.unit_name(lane.name)} is not installed"
    assert units[lane.name]["active"] == "active", f"{node}: {paths.unit_name(lane.name)} is {units[lane.name]}"


def test_no_other_lane_runs(node):
    lane = _lane(node)
    others = {n: s for n, s in node.fact(LaneUnits).items() if n != lane.name and s["active"] != "inactive"}
    assert not others, f"{node}: other lanes are not stopped: {others}"


def test_the_lanes_ports_answer_the_fabric_only(node):
    """The live table inet sparkinfra is exactly the tool's (its ports, the node's ephemeral range, the
    fabric subnet, SSH and the API left open, no rule of anyone else's in it), loaded at boot."""
    lane = _lane(node)
    live = node.fact(FirewallTable)
    if not node.cluster.config.firewall:
        assert live["table"] is None, f"{node}: firewall is false, but the table inet sparkinfra is live"
        return
    assert live["nft"], f"{node}: nft is missing"
    ranges = merged([*firewalled(lane, node.cluster), tuple(live["ephemeral"])])
    api = lanes.effective_ports(lane, node.cluster)["api_port"]
    wanted = wanted_table(ranges, str(node.cluster.fabric.subnet), left_open(api, node.host.backend.host.port))
    assert live["table"] == wanted, f"{node}: the live table differs from the tool's"
    enabled = node.root(f"systemctl is-enabled {FIREWALL_UNIT}").stdout.strip()
    assert enabled == "enabled", f"{node}: {FIREWALL_UNIT} is {enabled}: the rules would not come back at boot"
    assert node.root(f"nft -c -f {FIREWALL_FILE}").rc == 0, f"{node}: {FIREWALL_FILE} does not load"


def test_every_rank_runs_the_current_plan(cluster):
    lane = _lane(cluster[0])
    planned = {t.node.name: t.fact(LaneStatus, lane=lane.name).get("planned") for t in cluster}
    assert len(set(planned.values())) == 1 and None not in planned.values(), f"plans differ: {planned}"
    head = _head(cluster).fact(LaneStatus, lane=lane.name)
    assert head["started"] == head["planned"], f"the head runs plan {head['started']}, {head['planned']} is placed"
    assert all(state == "active" for state in head["workers"].values()), f"workers: {head['workers']}"


def test_the_lane_is_a_known_good_set_on_every_node(cluster):
    """A lane that served after a converge (and passed its canary) is kept on every node, its files as
    placed, to return to: the newest set, or, after a rollback to an older one, that set."""
    lane = _lane(cluster[0])
    planned = _head(cluster).fact(LaneStatus, lane=lane.name).get("planned")
    for target in cluster:
        out = target.root(shlex.join(paths.program("lane_ctl", "known", paths.plan_path(lane.name))))
        assert out.rc == 0, f"{target}: lane_ctl known: {out.stderr}"
        kept = [(k["lane"], k["digest"]) for k in json.loads(out.stdout)]
        assert (lane.name, planned) in kept, (
            f"{target}: lane {lane.name} plan {planned} is no known good set here (kept: {kept or 'none'})")


def test_container_has_the_nodes_env_and_pin(node):
    lane = _lane(node)
    config = node.cluster.config
    info = _inspect(node, config.container_name)
    assert info["State"]["Running"], f"{node}: {config.container_name} is not running"
    env = dict(item.split("=", 1) for item in info["Config"]["Env"])
    nccl = _rank_nccl_env(node, lane)
    for key in ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME", "VLLM_NCCL_SO_PATH", "LD_PRELOAD"):
        assert env.get(key) == nccl.get(key), (f"{node}: {key}={env.get(key)!r} in the container, {nccl.get(key)!r} "
                                               "in nccl.env with the lane's nccl_env")
    assert env["LD_PRELOAD"] == config.nccl_library
    assert env["VLLM_HOST_IP"] == str(node.node.fabric_ip)
    mounts = {m["Destination"]: m["Source"] for m in info["Mounts"]}
    assert mounts.get(config.nccl_library) == config.nccl_library, f"{node}: the pinned NCCL is not mounted: {mounts}"
    for key, value in {**lane.env, **config.lane_env}.items():  # the cluster's lane_env wins
        if "{" not in value:
            assert env.get(key) == value, f"{node}: lane env {key}={value!r}, container has {env.get(key)!r}"


def test_every_rank_has_the_lanes_nccl_changes(node):
    """The lane's ``nccl_env`` in each running rank's container (``docker inspect``: the environment its
    processes start with): each variable it sets has its value, given once; each it removes is absent;
    every other one of the node's NCCL environment is as the node's file has it. The file the runner
    wrote it from is root-only."""
    lane = _lane(node)
    if not lane.nccl_env:
        pytest.skip(f"lane {lane.name} changes none of the node's NCCL environment (nccl_env)")
    config = node.cluster.config
    items = [item.partition("=") for item in _inspect(node, config.container_name)["Config"]["Env"] or []]
    env = {key: value for key, _, value in items}
    for key, value in sorted(lane.nccl_env.items()):
        given = [v for k, _, v in items if k == key]
        if value is None:
            assert not given, f"{node}: the lane removes {key}, the container has {key}={given}"
        else:
            assert given == [value], f"{node}: the lane sets {key}={value}, the container has {given}"
    wanted = _rank_nccl_env(node, lane)
    differ = {k: f"{env.get(k)!r} (wanted {v!r})" for k, v in sorted(wanted.items()) if env.get(k) != v}
    assert not differ, f"{node}: the container's NCCL environment differs from the node's with the lane's: {differ}"
    path = paths.nccl_env_path(lane.name)
    mode = node.root(f"stat -c '%a %U' {path}")
    assert mode.stdout.strip() == "600 root", f"{node}: {path}: {mode.stdout.strip() or mode.stderr.strip()}"


def test_the_pin_is_mounted_over_every_nccl_copy(node):
    """LD_PRELOAD reaches what loads libnccl.so.2 by name; torch and Ray load their copies by path.
    Every libnccl.so* file the running container holds is the pin, mounted read-only."""
    _lane(node)
    config = node.cluster.config
    found = node.root(f"docker exec {config.container_name} find / -xdev -type f -name 'libnccl.so*'")
    assert found.rc == 0, f"{node}: {found.stderr}"
    copies = sorted(set(found.stdout.split()) - {config.nccl_library})
    mounts = {m["Destination"]: m for m in _inspect(node, config.container_name)["Mounts"]}
    bare = [c for c in copies if mounts.get(c, {}).get("Source") != config.nccl_library or mounts[c]["RW"]]
    assert not bare, f"{node}: the pin {config.nccl_library} is not mounted read-only over {bare}"


def test_every_ranks_live_vllm_processes_mapped_the_pin(node):
    """Identity, not version: each vLLM process running in the rank's container mapped the pinned
    build (its /proc/PID/maps, the mapped file's sha256), not the image's own copy of the same or
    another version (a rank started without the pin's mount maps the image's)."""
    _lane(node)
    config = node.cluster.config
    out = node.root(nccl_log.live_command(config.container_name, NCCL_IDENTITY))
    assert out.stdout.strip().startswith("{"), f"{node}: rank {node.node.rank}: {out.stdout}{out.stderr}"
    pin = node.fact(NcclPin, path=config.nccl_library, record=NCCL_PIN_RECORD)
    found = nccl_log.live_problems(json.loads(out.stdout), {
        "path": config.nccl_library, "sha256": pin["sha256"], "build_id": (pin["record"] or {}).get("build_id")})
    assert not found, f"{node}: rank {node.node.rank}: {'; '.join(found)}"


def test_compile_caches_are_kept_per_lane_and_image(node):
    """vLLM's, inductor's, Triton's, FlashInfer's and CUDA's caches come from the node, kept for this
    lane and the image the container runs: a restart finds what the last start compiled."""
    lane = _lane(node)
    info = _inspect(node, node.cluster.config.container_name)
    image = info["Image"].removeprefix("sha256:")[:12]
    mounts = {m["Destination"]: m["Source"] for m in info["Mounts"]}
    for kind, path in paths.COMPILE_CACHES.items():
        wanted = f"{paths.COMPILE_CACHE}/{lane.name}/{image}/{kind}"
        assert mounts.get(path) == wanted, f"{node}: {path} in the container is {mounts.get(path)!r}, not {wanted}"


def test_every_rank_passed_its_container_check(cluster):
    """The head's unit checked every rank's container before this start (its journal, this run)."""
    lane = _lane(cluster[0])
    head = _head(cluster)
    unit = paths.unit_name(lane.name)
    run = head.root(f"systemctl show -p InvocationID --value {unit}").stdout.strip()
    log = head.root(f"journalctl _SYSTEMD_INVOCATION_ID={run} -o cat --no-pager").stdout
    checks = ["nccl", *(("rdma", "gid") if lane.container.rdma else ())]
    for target in cluster:
        where = "this node" if target.node.rank == 0 else str(target.node.fabric_ip)
        for check in checks:
            line = f"rank {target.node.rank} on {where}: container check: PASS {check}: "
            assert line in log, f"{unit}'s journal of this start lacks {line!r}:\n{log[-3000:]}"
    assert "container check: FAIL" not in log, log[-3000:]


def test_rank_role(node):
    lane = _lane(node)
    info = _inspect(node, node.cluster.config.container_name)
    config = node.cluster.config
    args = info["Config"]["Cmd"] or []
    wanted = lanes.launch(lane, node.cluster, node.node.rank)  # the cluster's GMU over the lane's, as the plan renders it
    with_key = node.node.rank == 0 and bool(config.api_key_env)
    mods = [m.name for m in lanes.lane_mods(lane, dict(node.cluster.pins))]
    command = serving.container_command(wanted.command, api_key=with_key, mods=mods)
    assert args == command, f"{node}: runs {args}, the lane renders {command}"
    env = [item.split("=", 1)[0] for item in info["Config"]["Env"] or []]
    assert "VLLM_API_KEY" not in env, f"{node}: the API key is in the container's configuration (docker inspect)"
    if lane.launch == "mp":
        headless = "--headless" in wanted.command
        assert headless == (node.node.rank > 0), f"{node}: rank {node.node.rank} args {wanted.command}"


def test_api_completes(cluster):
    lane = _lane(cluster[0])
    status = _head(cluster).fact(LaneStatus, lane=lane.name)
    assert status["api"] == "ok", f"the head's API does not complete a request: {status['api']}"


def test_startup_log_checks(node):
    """The lane's own start-up lines: ``startup_checks`` in rank 0's log, ``worker_startup_checks`` in the others'."""
    lane = _lane(node)
    checks = lane.startup_checks if node.node.rank == 0 else lane.worker_startup_checks
    log = node.root(f"docker logs {node.cluster.config.container_name} 2>&1").stdout
    missing = [pattern for pattern in checks if not re.search(pattern, log, re.M)]
    assert not missing, f"{node}: rank {node.node.rank}'s start-up log lacks: {missing}"


def test_every_rank_applied_the_lanes_mods_in_order(node):
    """Each mod's run.sh ran in this rank's container, in the lane's order (a mod group's in its own),
    before its command."""
    lane = _lane(node)
    if not lane.mods:
        pytest.skip(f"lane {lane.name} has no mods")
    wanted = [m.name for m in lanes.lane_mods(lane, dict(node.cluster.pins))]  # groups expanded, at the locked commit
    log = node.root(f"docker logs {node.cluster.config.container_name} 2>&1").stdout
    applied = re.findall(r"^mod (\S+): applied$", log, re.M)
    assert applied == wanted, f"{node}: rank {node.node.rank} applied {applied}, the lane has {wanted} ({lane.mods})"


def test_every_ranks_nccl_started_on_the_pin_and_the_fabric(node):
    """NCCL's own lines in each rank's log (NCCL_DEBUG=INFO): the pinned version (rank 0 prints it),
    the IB network over the cluster's HCAs, this node's GID index."""
    lane = _lane(node)
    if lane.container.gpus is None:
        pytest.skip(f"lane {lane.name} runs vLLM on CPU (gloo): NCCL never starts there; "
                    "the container check proved the pin and the fabric in every rank")
    config, fabric = node.cluster.config, node.cluster.fabric
    log = node.root(f"docker logs {config.container_name} 2>&1").stdout
    found = nccl_log.problems(
        nccl_log.parse(log), pin=config.nccl_version if node.node.rank == 0 else None, rdma=lane.container.rdma,
        hcas=node.port().devices, port=fabric.rdma_port,
        gid_index=_rank_nccl_env(node, lane).get("NCCL_IB_GID_INDEX", ""),
    )
    assert not found, f"{node}: rank {node.node.rank}: {'; '.join(found)}"
