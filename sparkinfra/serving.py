"""
A lane on a cluster, node by node: what each rank's unit runs (its plan), its environment, its
unit file's values, and one digest of all ranks, so a change on any node restarts the lane as a
whole. Decided here; ``deploys/lane.py`` places it, ``scripts/lane_ctl.py`` runs it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from pyinfra.api import QuoteString, StringCommand

from . import lanes, project, scripts
from .operations.nccl import NCCL_ENV_FILE, NCCL_IDENTITY, NCCL_IDENTITY_SCRIPT
from .settings import Cluster, Node

LANE_CTL = "/usr/local/lib/sparkinfra/lane_ctl.py"
LANE_CTL_SOURCE = scripts.path("lane_ctl.py")
# Every rank's container is checked before vLLM starts (NCCL pin, RDMA devices, GID row): the
# script on the node, mounted read-only into a throwaway container of the rank's own options.
CONTAINER_CHECK = "/usr/local/lib/sparkinfra/container_check.py"
CONTAINER_CHECK_SOURCE = scripts.path("container_check.py")
CONTAINER_CHECK_IN = "/run/sparkinfra/container_check.py"
NCCL_IDENTITY_SOURCE = scripts.path(NCCL_IDENTITY_SCRIPT)
NCCL_IDENTITY_IN = "/run/sparkinfra/nccl_identity.py"
PLANS_DIR = "/etc/sparkinfra/lanes"
STATE_DIR = "/var/lib/sparkinfra/lanes"  # the head's validation marks and restart history (kept over reboots)
MARKS_DIR = "/run/sparkinfra/lanes"  # lane_ctl's runtime marks (lost at reboot, as the lane is)
# lane_ctl's marks, ``MARKS_DIR/<lane>.<name>``
MARK_NAMES = ("started", "warm", "failures", "stop-reason", "start-reason", "nccl-copies", "trial.env", "nccl.env")
LANE_UNITS = "sparkinfra-lane-*.service"  # every lane's unit: one lane runs at a time
UNIT_TEMPLATE = project.TEMPLATES / "etc/systemd/system/sparkinfra-lane.service.j2"
CONTAINER_HF = "/root/.cache/huggingface/hub"  # where a lane's container finds the HF cache
# The compile caches outlive each container, one folder per lane and image ID on each node
# (``COMPILE_CACHE/<lane>/<image>/<kind>``, mounted by lane_ctl at each kind's default path in the
# container): every start after the first skips what it compiled (seed 004: 15-18 minutes cold),
# and a new image starts clean (lane_ctl removes the folders of the lane's other images).
COMPILE_CACHE = "/var/cache/sparkinfra/compile"
COMPILE_CACHES = {
    "vllm": "/root/.cache/vllm",  # torch.compile artifacts, model-class inspections
    "inductor": "/tmp/torchinductor_root",  # torch inductor's (TORCHINDUCTOR_CACHE_DIR's default)
    "triton": "/root/.triton",  # Triton's kernels
    "flashinfer": "/root/.cache/flashinfer",  # FlashInfer's JIT
    "nv": "/root/.nv",  # CUDA's ComputeCache (PTX compiled for the GPU)
}
# A lane's mods on each node (MODS_DIR/<lane>/<mod>/), mounted read-only into every rank's container,
# where apply_mods.sh runs each mod's run.sh in order before the lane's command.
MODS_DIR = "/var/lib/sparkinfra/mods"
CONTAINER_MODS = "/run/sparkinfra/mods"
APPLY_MODS = "/usr/local/lib/sparkinfra/apply_mods.sh"
APPLY_MODS_SOURCE = scripts.path("apply_mods.sh")
CONTAINER_APPLY_MODS = "/run/sparkinfra/apply_mods.sh"
CONTAINER_API_KEY = "/run/sparkinfra/api.env"  # the head's secret env file, mounted read-only
# Exports VLLM_API_KEY from the mounted file, literally (shell builtins, no quoting rules), then runs
# the lane's command: the key is in the engine's environment, not in the container's configuration
# (``docker inspect``, which anyone with the docker socket can read). No key, no start.
WITH_API_KEY = (
    'while IFS= read -r line || [ -n "$line" ]; do case "$line" in VLLM_API_KEY=*) '
    'export VLLM_API_KEY="${line#VLLM_API_KEY=}";; esac; done < ' + CONTAINER_API_KEY + "; "
    '[ -n "${VLLM_API_KEY:-}" ] || { echo "no VLLM_API_KEY in ' + CONTAINER_API_KEY + '" >&2; exit 1; }; '
    'exec "$@"'
)


def compile_cache_mounts(lane: str, image: str) -> list[str]:
    """The ``-v`` options of ``lane``'s compile caches for the short image ID ``image`` (lane_ctl adds
    them on the node, where the image ID is known)."""
    return [x for kind, path in COMPILE_CACHES.items() for x in ("-v", f"{COMPILE_CACHE}/{lane}/{image}/{kind}:{path}")]


def unit_name(lane: str) -> str:
    return f"sparkinfra-lane-{lane}.service"


def plan_path(lane: str) -> str:
    return f"{PLANS_DIR}/{lane}.json"


def env_path(lane: str) -> str:
    return f"{PLANS_DIR}/{lane}.env"


def nccl_env_path(lane: str) -> str:
    """
    The NCCL env file of a lane that changes the node's (its ``nccl_env``): the node's
    ``NCCL_ENV_FILE`` with the lane's variables set and removed, written by lane_ctl (root-only)
    right before each ``docker run`` of the rank, and passed instead of the node's file
    (docker's ``--env-file`` cannot unset a variable). Lost at reboot, written again at the start.
    """
    return f"{MARKS_DIR}/{lane}.nccl.env"


# Where a lane leaves a file or folder besides the shared runner: ``folder/<prefix><lane><suffix>``.
# The one list ``lane_paths`` and ``lane_of_path`` read (a longer suffix before one it ends with).
LANE_PLACES = (
    ("/etc/systemd/system", "sparkinfra-lane-", ".service"),  # its unit
    (PLANS_DIR, "", ".json"), (PLANS_DIR, "", ".env"), (PLANS_DIR, "", ".secret.env"),  # plan, env files
    (STATE_DIR, "", ".validated"), (STATE_DIR, "", ".check.json"), (STATE_DIR, "", ".history"),  # the head's
    (MODS_DIR, "", ""),  # its mods
    *((MARKS_DIR, "", f".{name}") for name in MARK_NAMES),  # lane_ctl's runtime marks
)


def lane_paths(lane: str) -> list[str]:
    """Every file and folder a lane leaves on a node besides the shared runner: its unit, plan, env
    files, the head's validation marks and restart history, its mods, its runtime marks (what goes
    when it is not the cluster's lane any more)."""
    return [f"{folder}/{prefix}{lane}{suffix}" for folder, prefix, suffix in LANE_PLACES]


def lane_of_path(path: str) -> str | None:
    """The lane a path of ``lane_paths`` belongs to (None: not a lane's)."""
    folder, _, name = path.rstrip("/").rpartition("/")
    places = sorted((p for p in LANE_PLACES if p[0] == folder), key=lambda p: -len(p[2]))
    for _, prefix, suffix in places:
        if name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix) + len(suffix):
            return name[len(prefix):len(name) - len(suffix)]
    return None


def failures_path(lane: str) -> str:
    """lane_ctl's count of the lane's failures in a row, which its next start backs off by."""
    return f"{MARKS_DIR}/{lane}.failures"


def history_path(lane: str) -> str:
    """
    The head's restart history of the lane: one JSON line per start, ready and stop, each with its
    reason (``lane_ctl.py history``); root-only, the last 200 events, kept over reboots (a boot
    is one of the reasons it tells).
    """
    return f"{STATE_DIR}/{lane}.history"


def runner(lane: str, verb: str, *args: str) -> StringCommand:
    """
    The command that runs ``lane_ctl.py VERB PLAN ARGS…`` for ``lane`` on a node (the unit's
    lines are the same, rendered from ``unit_values``).

    .. code:: python

        runner("sim", "wait-ready", "300")
        # -> python3 /usr/local/lib/sparkinfra/lane_ctl.py wait-ready /etc/sparkinfra/lanes/sim.json 300
    """
    return StringCommand("python3", LANE_CTL, verb, QuoteString(plan_path(lane)), *(QuoteString(a) for a in args))


def validated_path(lane: str) -> str:
    """The head's mark that vLLM in the lane's image accepted this lane's arguments."""
    return f"{STATE_DIR}/{lane}.validated"


def secret_env_path(lane: str) -> str:
    """The head's root-only env file holding ``VLLM_API_KEY`` (when the settings name a key)."""
    return f"{PLANS_DIR}/{lane}.secret.env"


@dataclass(frozen=True)
class RankPlan:
    """
    What one node runs for a lane: every value its unit (``unit_values``) and its runner
    (``runner_plan``, read by ``scripts/lane_ctl.py``) use, decided here and nowhere else.
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

    def runner_plan(self) -> dict:
        """The JSON plan ``lane_ctl.py`` runs (``/etc/sparkinfra/lanes/<lane>.json``)."""
        plan = {
            "lane": self.lane,
            "unit": unit_name(self.lane),
            "lane_units": LANE_UNITS,
            "env_file": env_path(self.lane),
            "marks_dir": MARKS_DIR,
            "history": history_path(self.lane) if self.is_head else "",
            "rank": self.rank,
            "container": self.container,
            "image": self.image,
            "docker_options": list(self.docker_options),
            "command": list(self.command),
            "api_port": self.api_port,
            "served_model_name": self.served_model_name,
            "api_key_file": self.api_key_file,
            "workers": [{"ip": ip, "rank": rank} for ip, rank in self.workers],
            "warmup": list(self.warmup),
            "watch_interval": self.watch_interval,
            "stop_seconds": self.stop_seconds,
            "watch_grace": self.watch_grace,
            "liveness_interval": self.liveness_interval,
            "liveness_timeout": self.liveness_timeout,
            "unreachable_grace": self.unreachable_grace,
            "head_lost_timeout": self.head_lost_timeout,
            "start_timeout": self.start_timeout,
            "rendezvous": {"host": self.head_ip, "port": self.rendezvous_port} if self.rendezvous_port else None,
            "container_check": {"script": CONTAINER_CHECK, "mount": CONTAINER_CHECK_IN, "args": list(self.check_args),
                                # beside the check in the container: it compares NCCL builds by identity
                                "identity": {"script": NCCL_IDENTITY, "mount": NCCL_IDENTITY_IN}},
            "nccl_pin": self.nccl_pin,
            "nccl_wheel": self.nccl_wheel,
            "nccl_env": {"node": NCCL_ENV_FILE, "file": nccl_env_path(self.lane), "changes": dict(self.nccl_changes)}
            if self.nccl_changes else None,
            "drop_caches": self.drop_caches,
            "mods": [{"name": name, "sha256": digest} for name, digest in self.mods],
            "compile_cache": {"root": f"{COMPILE_CACHE}/{self.lane}", "mounts": COMPILE_CACHES},
        }
        return {**plan, "digest": self.digest} if self.digest else plan

    def docker_run(self) -> list[str]:
        """The rank's ``docker run`` argv, as ``lane_ctl.py run`` builds it from ``runner_plan`` (which
        also mounts ``nccl_pin`` over each other ``libnccl.so*`` it finds in the container)."""
        return ["docker", "run", "--rm", "--name", self.container, *self.docker_options, self.image, *self.command]

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
            "ctl": f"/usr/bin/python3 {LANE_CTL}",
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
        *(["-v", f"{MODS_DIR}/{lane.name}:{CONTAINER_MODS}:ro", "-v", f"{APPLY_MODS}:{CONTAINER_APPLY_MODS}:ro"]
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
    for node in cluster.nodes:
        launch = lanes.launch(lane, cluster, node.rank)
        is_head = node.rank == 0
        with_key = is_head and bool(config.api_key_env)  # the key's mount, the command's wrapper, lane_ctl's file
        draft.append(RankPlan(
            node=node,
            lane=lane.name,
            rank=node.rank,
            nodes=len(cluster.nodes),
            head_ip=str(cluster.head.fabric_ip),
            container=config.container_name,
            image=launch.image,
            docker_options=tuple(_docker_options(lane, cluster, with_key)),
            command=tuple(container_command(launch.command, api_key=with_key, mods=[m.name for m in mods])),
            mods=mod_digests(mods),
            env=_env(lane, cluster, node, launch),
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
    """One hash of every rank's plan, env, unit values, unit template and lane_ctl: any change restarts."""
    digest = hashlib.sha256()
    for part in (UNIT_TEMPLATE.read_bytes(), LANE_CTL_SOURCE.read_bytes(), CONTAINER_CHECK_SOURCE.read_bytes(),
                 NCCL_IDENTITY_SOURCE.read_bytes()):
        digest.update(hashlib.sha256(part).digest())
    for p in plans:
        digest.update(json.dumps([p.runner_plan(), p.env, p.unit_values()], sort_keys=True).encode())
    return digest.hexdigest()[:16]


def plan_json(plan: RankPlan) -> str:
    return json.dumps(plan.runner_plan(), indent=2, sort_keys=True) + "\n"
