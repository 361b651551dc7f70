"""
A lane on a cluster, node by node: what each rank's unit runs (its plan), its environment, its
unit file's values, and one digest of all ranks, so a change on any node restarts the lane as a
whole. Decided here; ``deploys/lane.py`` places it, ``node/lane_ctl.py`` runs it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from pyinfra.api import QuoteString, StringCommand

from . import lanes, node, project
from .node import docker, paths, plan
from .node.paths import (
    CONTAINER_API_KEY,
    CONTAINER_HF,
    CONTAINER_MODS,
    CONTAINER_PROGRAMS,
    MODS_DIR,
    NCCL_ENV_FILE,
    env_path,
    nccl_env_path,
    plan_path,
    secret_env_path,
    unit_name,
)
from .settings import Cluster, Node

UNIT_TEMPLATE = project.TEMPLATES / "etc/systemd/system/sparkinfra-lane.service.j2"
CONTAINER_APPLY_MODS = f"{CONTAINER_PROGRAMS}/apply_mods.sh"  # in the node programs, mounted in the container
# Exports VLLM_API_KEY from the mounted file, literally (shell builtins, no quoting rules), then runs
# the lane's command: the key is in the engine's environment, not in the container's configuration
# (``docker inspect``, which anyone with the docker socket can read). No key, no start.
WITH_API_KEY = (
    'while IFS= read -r line || [ -n "$line" ]; do case "$line" in VLLM_API_KEY=*) '
    'export VLLM_API_KEY="${line#VLLM_API_KEY=}";; esac; done < ' + CONTAINER_API_KEY + "; "
    '[ -n "${VLLM_API_KEY:-}" ] || { echo "no VLLM_API_KEY in ' + CONTAINER_API_KEY + '" >&2; exit 1; }; '
    'exec "$@"'
)


def compile_cache(lane: str) -> plan.CompileCache:
    """The lane's compile caches on a node (one folder per image ID and kind), which its ranks, its
    trials and the head's in-image check mount."""
    return plan.CompileCache(root=paths.compile_cache_root(lane), mounts=dict(paths.COMPILE_CACHES))


def wedge_bound(config) -> int:
    """Seconds within which the head's watch restarts a wedged lane (``/health`` answers, completions
    do not): a liveness interval, two failed completions of ``lane_liveness_timeout``, and two watches
    (the one that asks again, and the worker checks between; measured on the bed: 39 s of 40)."""
    return config.lane_liveness_interval + 2 * config.lane_liveness_timeout + 2 * RankPlan.watch_interval


def runner(lane: str, verb: str, *args: str) -> StringCommand:
    """
    The command that runs ``lane_ctl VERB PLAN ARGS…`` for ``lane`` on a node (the unit's lines are
    the same, rendered from ``unit_values``).

    .. code:: python

        runner("sim", "wait-ready", "300")
        # -> python3 /usr/local/lib/sparkinfra/node lane_ctl wait-ready /etc/sparkinfra/lanes/sim.json 300
    """
    return StringCommand(*paths.program("lane_ctl", verb), QuoteString(plan_path(lane)), *(QuoteString(a) for a in args))


@dataclass(frozen=True)
class RankPlan:
    """
    What one node runs for a lane: every value its unit (``unit_values``) and its runner
    (``runner_plan``, read by ``node/lane_ctl.py``) use, decided here and nowhere else.
    """

    node: Node
    lane: str
    rank: int
    nodes: int  # the lane's node count
    head_ip: str  # the head's fabric address
    container: str
    image: str
    docker_options: tuple[str, ...]  # ``docker run`` options: network, env files, mounts, the lane's
    command: tuple[str, ...]  # after the image: the lane's command (behind the API key's wrapper on the head)
    env: dict[str, str]  # the rank's env file (root-only: may hold secrets)
    api_port: int
    served_model_name: str
    api_key_file: str  # the head's secret env file, when it serves with a key
    workers: tuple[tuple[str, int], ...]  # the head's: (fabric IP, rank) of each worker
    warmup: tuple[dict, ...]  # the head's: one request per workload shape
    liveness_interval: int  # seconds between the head's one-token completions
    check_args: tuple[str, ...] = ()  # container_check.py's: the pinned NCCL, whether RDMA is checked
    nccl_pin: str = ""  # the pinned library, mounted by lane_ctl over every other libnccl.so* in the container
    nccl_wheel: str = ""  # sha256 of the wheel the site's lock pins it from: a new pin restarts the lane
    # The lane's nccl_env: the node's NCCL variables it sets (a value) or removes (None), which lane_ctl
    # applies to NCCL_ENV_FILE in the rank's own file (nccl_env_path); empty: the node's file as it is.
    nccl_changes: dict[str, str | None] = dataclasses.field(default_factory=dict)
    drop_caches: dict | None = None  # while the weights load: every, at_most (seconds), until (health URL)
    mods: tuple[tuple[str, str], ...] = ()  # (name, digest) of each mod, applied in this order
    liveness_timeout: int = 60  # seconds a liveness completion may take
    unreachable_grace: int = 900  # the head's: seconds a worker it cannot reach may stay so while the API completes
    head_lost_timeout: int = 60  # a worker's: seconds rank 0's rendezvous may be gone before the rank stops itself
    rendezvous_port: int = 0  # a worker's: the port on the head every rank joined through (0: none)
    watch_interval: int = 5  # seconds between the head's checks of its workers
    watch_grace: int = 20  # seconds a worker may take to come up before the watch counts it
    start_timeout: int = 600  # systemd's TimeoutStartSec
    stop_seconds: int = 30  # docker stop's grace (rank 0: in-flight requests end)
    stop_timeout: int = 120  # systemd's TimeoutStopSec
    digest: str = ""  # one hash of every rank's plan: any change restarts the lane

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    def runner_plan(self) -> plan.RunnerPlan:
        """The plan ``lane_ctl`` runs (``/etc/sparkinfra/lanes/<lane>.json``)."""
        return plan.RunnerPlan(
            lane=self.lane,
            unit=unit_name(self.lane),
            lane_units=paths.LANE_UNITS,
            env_file=env_path(self.lane),
            marks_dir=paths.MARKS_DIR,
            history=paths.history_path(self.lane) if self.is_head else "",
            rank=self.rank,
            container=self.container,
            image=self.image,
            docker_options=list(self.docker_options),
            command=list(self.command),
            api_port=self.api_port,
            served_model_name=self.served_model_name,
            api_key_file=self.api_key_file,
            workers=[plan.Worker(ip=ip, rank=rank) for ip, rank in self.workers],
            warmup=list(self.warmup),
            watch_interval=self.watch_interval,
            stop_seconds=self.stop_seconds,
            watch_grace=self.watch_grace,
            liveness_interval=self.liveness_interval,
            liveness_timeout=self.liveness_timeout,
            unreachable_grace=self.unreachable_grace,
            head_lost_timeout=self.head_lost_timeout,
            start_timeout=self.start_timeout,
            rendezvous=plan.Rendezvous(host=self.head_ip, port=self.rendezvous_port) if self.rendezvous_port else None,
            container_check=plan.ContainerCheck(programs=paths.PROGRAMS, mount=CONTAINER_PROGRAMS,
                                                args=list(self.check_args)),
            nccl_pin=self.nccl_pin,
            nccl_wheel=self.nccl_wheel,
            nccl_env=plan.NcclEnv(node=NCCL_ENV_FILE, file=nccl_env_path(self.lane), changes=dict(self.nccl_changes))
            if self.nccl_changes else None,
            drop_caches=plan.DropCaches(**self.drop_caches) if self.drop_caches else None,
            mods=[plan.Mod(name=name, sha256=digest) for name, digest in self.mods],
            compile_cache=compile_cache(self.lane),
            digest=self.digest,
        )

    def docker_run(self, copies: list[str] = (), image: str = "") -> list[str]:
        """The rank's ``docker run`` argv, as ``lane_ctl run`` builds it (``docker.rank_run``) with the
        libnccl ``copies`` the pin goes over and the short image ID ``image`` of the compile caches."""
        return docker.rank_run(self.runner_plan(), list(copies), image)

    def unit_values(self) -> dict:
        """The values of ``templates/etc/systemd/system/sparkinfra-lane.service.j2``."""
        return {
            "lane": self.lane,
            "rank": self.rank,
            "nodes": self.nodes,
            "head": self.is_head,
            "role": "serves the API" if self.is_head else f"headless, joins {self.head_ip}",
            "role_note": (
                "Rank 0 starts the workers first, watches them and its API, and restarts the whole lane."
                if self.is_head else "Started and stopped by rank 0's unit; restarts only with the whole lane."
            ),
            "container": self.container,
            "ctl": "/usr/bin/" + " ".join(paths.program("lane_ctl")),
            "plan": plan_path(self.lane),
            "restart": "always" if self.is_head else "no",
            "start_timeout": self.start_timeout,
            "stop_seconds": self.stop_seconds,
            "stop_timeout": self.stop_timeout,
        }


def _env(lane: lanes.Lane, cluster: Cluster, node: Node, launch: lanes.Launch) -> dict[str, str]:
    env = {
        # vLLM and gloo talk over the fabric only (vLLM otherwise picks the first interface).
        "VLLM_HOST_IP": str(node.fabric_ip),
        "HF_HUB_CACHE": CONTAINER_HF,
        "HF_HUB_OFFLINE": "1",
    }
    env.update(launch.env)
    return dict(sorted(env.items()))


def container_command(command: list[str], api_key: bool, mods: list[str] = ()) -> list[str]:
    """The container's command: the lane's, after its ``mods`` (``apply_mods.sh``), behind
    ``WITH_API_KEY`` when the rank serves with a key."""
    command = ["sh", CONTAINER_APPLY_MODS, CONTAINER_MODS, *mods, "--", *command] if mods else list(command)
    return ["sh", "-c", WITH_API_KEY, "sparkinfra-api-key", *command] if api_key else command


def mod_digests(mods: list[lanes.Mod]) -> tuple[tuple[str, str], ...]:
    """(name, sha256 of its files' paths and contents) of each mod: a changed mod moves the lane's
    digest, so the lane restarts with it."""
    return tuple((mod.name, lanes.mod_digest(mod)) for mod in mods)


def _docker_options(lane: lanes.Lane, cluster: Cluster, with_key: bool) -> list[str]:
    config = cluster.config
    secret = ["-v", f"{secret_env_path(lane.name)}:{CONTAINER_API_KEY}:ro"] if with_key else []
    return [
        "--network", "host",
        "--env-file", nccl_env_path(lane.name) if lane.nccl_env else NCCL_ENV_FILE,  # lane_ctl derives the first
        "--env-file", env_path(lane.name),
        *secret,
        "-v", f"{config.nccl_library}:{config.nccl_library}:ro",
        "-v", f"{config.model_dir}:{CONTAINER_HF}:ro",
        *(["-v", f"{MODS_DIR}/{lane.name}:{CONTAINER_MODS}:ro", "-v", f"{paths.PROGRAMS}:{CONTAINER_PROGRAMS}:ro"]
          if lane.mods else []),
        *lanes.container_options(lane),
    ]


def _page_cache_dropper(lane: lanes.Lane, config, api_host: str, api_port: int) -> dict | None:
    """What a rank's runner does about the page cache while the weights load (None: nothing).
    Never under instanttensor: seed 001's dropper thrashed that loader instead of helping it."""
    if not config.page_cache_dropper or lane.serve.get("load_format") == "instanttensor":
        return None
    return {"every": config.page_cache_dropper, "at_most": config.lane_ready_timeout,
            "until": f"http://{api_host}:{api_port}/health"}


def rank_plans(lane: lanes.Lane, cluster: Cluster) -> list[RankPlan]:
    """Every rank's plan; all carry the lane's digest."""
    config = cluster.config
    mods = lanes.lane_mods(lane, dict(cluster.pins))  # groups expanded, in order
    draft = []
    for member in cluster.nodes:
        launch = lanes.launch(lane, cluster, member.rank)
        is_head = member.rank == 0
        with_key = is_head and bool(config.api_key_env)  # the key's mount, the command's wrapper, lane_ctl's file
        draft.append(RankPlan(
            node=member,
            lane=lane.name,
            rank=member.rank,
            nodes=len(cluster.nodes),
            head_ip=str(cluster.head.fabric_ip),
            container=config.container_name,
            image=launch.image,
            docker_options=tuple(_docker_options(lane, cluster, with_key)),
            command=tuple(container_command(launch.command, api_key=with_key, mods=[m.name for m in mods])),
            mods=mod_digests(mods),
            env=_env(lane, cluster, member, launch),
            api_port=lane.api_port or config.api_port,
            served_model_name=lane.served_name,
            api_key_file=secret_env_path(lane.name) if with_key else "",
            workers=tuple((str(w.fabric_ip), w.rank) for w in cluster.workers) if is_head else (),
            warmup=tuple(w.model_dump(exclude_none=True) for w in lane.warmup) if is_head else (),
            liveness_interval=config.lane_liveness_interval,
            liveness_timeout=config.lane_liveness_timeout,
            unreachable_grace=config.lane_unreachable_grace,
            head_lost_timeout=config.lane_head_lost_timeout,
            rendezvous_port=0 if is_head else rendezvous_port(lane, cluster),
            drop_caches=_page_cache_dropper(lane, config, "127.0.0.1" if is_head else str(cluster.head.fabric_ip),
                                            lane.api_port or config.api_port),
            nccl_pin=config.nccl_library,
            nccl_wheel=cluster.pin("nccl") or "",
            nccl_changes=dict(sorted(lane.nccl_env.items())),
            check_args=("--nccl-version", config.nccl_version, "--nccl-pin", config.nccl_library,
                        *(("--rdma", "--rdma-port", str(cluster.fabric.rdma_port)) if lane.container.rdma else ())),
            # A headless rank has no request to finish, and once rank 0 is gone vLLM's executor
            # waits 5 s for its worker process, then TERMs it, then KILLs it (about 11 s in all):
            # docker stops it at that first grace instead.
            stop_seconds=30 if is_head else 5,
        ))
    digest = lane_digest(draft)
    return [dataclasses.replace(p, digest=digest) for p in draft]


def rendezvous_port(lane: lanes.Lane, cluster: Cluster) -> int:
    """The port on the head every rank of ``lane`` joined through and which stays open while rank 0
    runs: Ray's GCS for a Ray lane, else torch.distributed's store (the master port)."""
    ports = lanes.effective_ports(lane, cluster)
    return ports["ray_port"] if lane.launch == "ray" else ports["master_port"]


def lane_digest(plans: list[RankPlan]) -> str:
    """One hash of every rank's plan, env, unit values, unit template and the node programs: any change
    restarts."""
    digest = hashlib.sha256()
    for part in (UNIT_TEMPLATE, *node.files()):
        digest.update(hashlib.sha256(part.read_bytes()).digest())
    for p in plans:
        digest.update(json.dumps([p.runner_plan().to_dict(), p.env, p.unit_values()], sort_keys=True).encode())
    return digest.hexdigest()[:16]


def plan_json(rank: RankPlan) -> str:
    return rank.runner_plan().to_json()

