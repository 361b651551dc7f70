"""
The plan one rank's runner (``lane_ctl``) reads: written as JSON by the controller
(``serving.RankPlan.runner_plan``, at ``paths.plan_path(lane)``) and read back by the same
classes on the node (``RunnerPlan.read``). Stdlib only.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Worker:
    ip: str  # its fabric address
    rank: int


@dataclass(frozen=True)
class Rendezvous:
    host: str  # rank 0's fabric address
    port: int  # Ray's GCS or torch.distributed's store: open while rank 0 runs


@dataclass(frozen=True)
class ContainerCheck:
    programs: str  # the node programs' folder on the node (``container_check`` among them)
    mount: str  # where it is mounted, read-only, in the check's container
    args: list[str] = field(default_factory=list)  # container_check's: the pinned NCCL, whether RDMA is checked


@dataclass(frozen=True)
class NcclEnv:
    node: str  # the node's NCCL env file
    file: str  # the rank's, written from it with ``changes`` before each start
    changes: dict[str, str | None] = field(default_factory=dict)  # a value sets, None removes


@dataclass(frozen=True)
class DropCaches:
    every: int  # seconds between two drops while the weights load
    at_most: int  # seconds
    until: str  # the health URL that ends it


@dataclass(frozen=True)
class Mod:
    name: str
    sha256: str


@dataclass(frozen=True)
class CompileCache:
    root: str  # ``root/<image ID>/<kind>`` on the node
    mounts: dict[str, str]  # kind: its default path in the container


@dataclass(frozen=True)
class RunnerPlan:
    """What one rank's runner needs: the lane's unit and files, the container, the watch's timings."""

    lane: str
    unit: str
    lane_units: str  # the pattern of every lane's units (one lane runs at a time)
    env_file: str
    marks_dir: str  # the runner's runtime marks (lost at reboot)
    history: str  # the head's restart history ("" on a worker)
    rank: int
    container: str
    image: str
    docker_options: list[str]
    command: list[str]
    api_port: int
    served_model_name: str
    api_key_file: str  # the head's secret env file ("": no key)
    workers: list[Worker]  # the head's
    warmup: list[dict]  # the head's: one request per workload shape
    watch_interval: int
    stop_seconds: int
    watch_grace: int
    liveness_interval: int
    liveness_timeout: int
    unreachable_grace: int
    head_lost_timeout: int
    start_timeout: int
    rendezvous: Rendezvous | None  # a worker's
    container_check: ContainerCheck | None
    nccl_pin: str = ""  # mounted over every other libnccl.so* in the container
    nccl_wheel: str = ""
    nccl_env: NcclEnv | None = None  # None: the node's NCCL env file as it is
    drop_caches: DropCaches | None = None
    mods: list[Mod] = field(default_factory=list)
    compile_cache: CompileCache | None = None
    digest: str = ""  # one hash of every rank's plan: any change restarts the lane

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict) -> RunnerPlan:
        """The plan of ``data`` (``to_dict``'s), each part as its class; an unknown key is refused."""
        d = dict(data)

        def part(kind, key):
            return kind(**d[key]) if d.get(key) else None

        d.update(
            workers=[Worker(**w) for w in d.get("workers", [])],
            mods=[Mod(**m) for m in d.get("mods", [])],
            rendezvous=part(Rendezvous, "rendezvous"),
            container_check=part(ContainerCheck, "container_check"),
            nccl_env=part(NcclEnv, "nccl_env"),
            drop_caches=part(DropCaches, "drop_caches"),
            compile_cache=part(CompileCache, "compile_cache"),
        )
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> RunnerPlan:
        return cls.from_dict(json.loads(text))

    @classmethod
    def read(cls, path: str) -> RunnerPlan:
        return cls.from_json(Path(path).read_text())

    def replace(self, **changes) -> RunnerPlan:
        return dataclasses.replace(self, **changes)
