"""
The cluster's lane serving: validated by vLLM (on the controller, then in the image), one unit per
node (rank 0 serves the API, the others run headless), no other lane running, ready and warm.

    pyinfra inventory/pair.py deploys/lane.py            # lane = "..." in group_data, or --data lane=...
"""

from pyinfra import host, inventory, state
from pyinfra.operations import systemd

from sparkinfra import facts, lanes, lock, operations, reads, serving, settings, ssh

ssh.prompt_replies(state)  # no delayed-ACK wait on each command
lock.hold(state, inventory, settings.current())  # one converge at a time
cluster = settings.current().cluster_of(host.name)
config = cluster.config
is_head = host.name == cluster.head.name
lane = lanes.find_lane(config.lane) if config.lane else None
start = is_head and host.data.get("lane_start", True)  # deploys/tune.py places the lane only
facts.read_ahead(host, reads.lane_reads(  # one command, not one per fact
    cluster, host.name, lane.name if lane else "", (lane and lane.image) or config.image, start,
))

operations.other_lanes_stopped(
    name=f"No lane but {config.lane or '(none)'} runs on this node",
    lane=config.lane,
)

if lane:
    if is_head:  # once per cluster, before any operation runs: the controller's vLLM, cached
        lanes.refuse_invalid(lane, cluster)
    plans = serving.rank_plans(lane, cluster)
    mine = next(p for p in plans if p.node.name == host.name)
    name, digest = lane.name, mine.plan["digest"]

    operations.file_content(
        name=f"Lane runner is at {serving.LANE_CTL}",
        path=serving.LANE_CTL,
        src=str(serving.LANE_CTL_SOURCE),
        mode="755",
    )
    operations.file_content(
        name=f"This node's environment for lane {name} is in {serving.env_path(name)} (root only)",
        path=serving.env_path(name),
        content=operations.render(
            "etc/sparkinfra/lanes/lane.env.j2", lane=name, rank=mine.rank, variables=sorted(mine.env.items())
        ),
        mode="600",
    )
    if is_head:
        operations.secret_env_file(
            name=f"The API key is in {serving.secret_env_path(name)} (root only)"
            if config.api_key_env else "No API key file is left from an earlier setting",
            path=serving.secret_env_path(name),
            variable="VLLM_API_KEY",
            env=config.api_key_env,
            present=bool(config.api_key_env),
        )
    operations.file_content(
        name=f"This node's plan for lane {name} is in {serving.plan_path(name)}",
        path=serving.plan_path(name),
        content=serving.plan_json(mine),
        mode="600",
    )
    unit = operations.file_content(
        name=f"Unit {serving.unit_name(name)} runs this node's rank of lane {name}",
        path=f"/etc/systemd/system/{serving.unit_name(name)}",
        content=operations.render("etc/systemd/system/sparkinfra-lane.service.j2", **mine.unit),
    )
    systemd.daemon_reload(
        name="systemd has read the lane's unit",
        _if=unit.did_change,
    )
    if is_head:
        operations.lane_validated(
            name=f"vLLM in {lane.image or config.image} accepts lane {name}'s arguments for every rank",
            lane=name,
            image=lane.image or config.image,
            request=lanes.vllm_request(lane, cluster, engine=True, gmu=config.gpu_memory_utilization, in_image=True),
            docker_options=mine.plan["docker_options"],
        )
    if start:
        operations.service_enabled(  # starting is lane_running's: once, all ranks, workers first
            name=f"Lane {name} starts with the head at boot",
            service=serving.unit_name(name),
            enabled=True,
        )
        operations.lane_running(
            name=f"Lane {name} serves on every node (plan {digest})",
            lane=name,
            digest=digest,
            ready_timeout=config.lane_ready_timeout,
        )
        operations.lane_warm(
            name=f"Lane {name} is warm (one request per workload shape)",
            lane=name,
            digest=digest,
        )
