"""
The lane schema and loader: ``lanes/<name>.yaml`` as validated data, every error naming the file,
the key and the line.

Over 400 lines: the schema's rules, the YAML line tracker that places their errors and the reader
that bounds every YAML file the user gives (``read_yaml``: size, depth, count, no aliases or tags)
belong together; an error without its line sends the user hunting.
"""

from __future__ import annotations

import codecs
import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pyinfra.api.exceptions import PyinfraError

from .. import node, project
from ..settings import SERVE_KEYS, nearest

LANES_DIR = project.LANES
CHECK_SCRIPT = node.DIR / "vllm_check.py"
CHECK_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparkinfra" / "vllm-check"

# The start of the note ``validate_with_vllm`` returns when the given python has no vLLM.
NO_VLLM = "vLLM is not importable"

# What a lane's env values may refer to; filled per rank by ``launch``.
PLACEHOLDERS = ("rank", "fabric_ip", "head_ip")
PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

# ``vllm serve`` settings sparkinfra renders itself, and where each one comes from: the lane's keys,
# each rank's place, and every setting whose Field names its flag (``settings.SERVE_KEYS``).
RESERVED = {
    **{flag: f"the cluster's `{key}` setting" for flag, key in SERVE_KEYS.items()},
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
    "gpu_memory_utilization": "the lane's `gpu_memory_utilization` (the cluster's setting over it)",
    "host": "sparkinfra (rank 0 serves on 0.0.0.0)",
    "port": "`api_port` (lane, else cluster setting)",
    "headless": "sparkinfra (every rank above 0)",
    "speculative_config": "the lane's `speculative` (its model from `drafter`)",
    "api_key": "the site's API key (`api_key_env`, else the one its first converge generates), never on a "
               "command line",
}
# A lane is a plain file people commit and share as a recipe: a secret never is in one.
SECRET_ENV = {
    "VLLM_API_KEY": "the site's API key (`api_key_env`, else the one its first converge generates)",
    "HF_TOKEN": "the site's `hf_token_env` (the head's download reads it; serving runs offline)",
    "HUGGING_FACE_HUB_TOKEN": "the site's `hf_token_env` (the head's download reads it; serving runs offline)",
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
    rdma: bool = Field(
        True,
        description="The fabric's RDMA in the container: the node's RDMA devices (``--device /dev/infiniband``), "
        "``IPC_LOCK`` and unlimited ``memlock``, as NCCL over IB/RoCE needs (without them it falls back to "
        "TCP sockets, or fails); false: a lane that does not use RDMA says so (a CPU lane).",
    )
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
    def _check(self) -> Container:
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
    def _check(self) -> Warmup:
        if (self.prompt is None) == (self.messages is None):
            raise _rule("give exactly one of prompt (completions) or messages (chat)", "prompt")
        if self.prompt is not None:
            for key in ("chat_template_kwargs", "response_format"):
                if getattr(self, key) is not None:
                    raise _rule("only for a chat request (messages)", key)
        return self


class Thinking(BaseModel):
    """How the model's chat template turns thinking off and on (a ``chat_template_kwargs`` key)."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field("enable_thinking", min_length=1, description="The template's switch (MiniMax-M3: thinking_mode).")
    # Not "off"/"on": YAML reads those keys as booleans.
    off_value: bool | str = Field(False, description="Its value for thinking off (MiniMax-M3: disabled).")
    on_value: bool | str = Field(True, description="Its value for thinking on (MiniMax-M3: enabled).")


# vLLM's speculative methods that draft with a separate model (``drafter``); ngram, suffix and the
# MTP methods draft from the prompt or the target model itself.
DRAFTER_METHODS = ("eagle", "eagle3", "draft_model", "medusa", "mlp_speculator")


class CanaryTolerance(BaseModel):
    """How much worse a changed lane's canary may measure than its baseline before it is rolled back."""

    model_config = ConfigDict(extra="forbid")

    decode_tolerance: float = Field(0.10, ge=0, lt=1, description="Decode tok/s may fall by this share.")
    ttft_tolerance: float = Field(0.25, ge=0, description="TTFT may rise by this share.")


class ImageRecipe(BaseModel):
    """A lane's image made by a recipe: ``images/<recipe>/recipe.yaml`` (``sparkinfra.lanes.images``)."""

    model_config = ConfigDict(extra="forbid")

    recipe: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", description="The recipe's folder under images/.")


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
    image: Annotated[str, Field(min_length=1)] | ImageRecipe | None = Field(
        None, description="Container image: a reference (pin it by digest: name@sha256:...), or {recipe: NAME} "
        "(built on the head from images/NAME/); null: the cluster's `image`.",
    )

    nodes: int = Field(ge=1)
    tensor_parallel: int = Field(ge=1)
    pipeline_parallel: int = Field(1, ge=1)
    launch: Literal["mp", "ray"] = Field("mp", description="mp: torch.distributed (--nnodes); ray: a Ray cluster.")
    ray_port: int = Field(6379, ge=1, le=65535)
    ray_object_store_gb: float = Field(
        2.0, gt=0, description="Ray's object store on each node (GiB); Ray's own default, 30% of RAM, would "
        "take unified memory the GPU needs.",
    )

    served_model_name: str | None = Field(None, min_length=1, description="null: the model's repo id.")
    gpu_memory_utilization: float = Field(gt=0, le=1)
    api_port: int | None = Field(None, ge=1, le=65535, description="null: the cluster's `api_port`.")
    master_port: int | None = Field(None, ge=1, le=65535, description="null: the cluster's `master_port`.")

    serve: dict[str, Any] = Field(default_factory=dict, description="Further `vllm serve` settings.")
    speculative: dict[str, Any] | None = Field(None, description="Speculative config; `model` comes from drafter.")
    env: dict[str, str] = Field(default_factory=dict, description="Lane environment; {rank} {fabric_ip} {head_ip}.")
    nccl_env: dict[str, str | None] = Field(
        default_factory=dict, description="NCCL variables this lane sets (a value) or removes (null) over the "
        "cluster's NCCL environment (nccl_env, nccl_env_overrides and what prepare found on each node).",
    )
    image_flags: list[str] = Field(default_factory=list, description="Flags only the lane's image knows.")
    container: Container = Field(default_factory=Container)
    mods: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]] = Field(
        default_factory=list, description="Mods (eugr v1: a folder mods/<name>/ with run.sh and its files, or a "
        "mod group: a folder with mod-group.yaml naming other mods), applied in order in every rank's container "
        "before its command (and before the head's in-image validation)."
    )
    mods_from: Literal["project", "image"] = Field(
        "project", description="Where `mods` are: project (mods/ next to the lane's lanes/ folder) or image (the "
        "mods/ folder of the lane's image recipe's build repository, at its locked commit).",
    )
    warmup: list[Warmup] = Field(default_factory=list)
    thinking: Thinking = Field(default_factory=Thinking, description="The bench's thinking switch.")
    canary: CanaryTolerance = Field(
        default_factory=CanaryTolerance, description="A change's canary: how much slower than the baseline it may be."
    )
    startup_checks: list[str] = Field(default_factory=list, description="Regexes rank 0's start-up log shows.")
    worker_startup_checks: list[str] = Field(
        default_factory=list, description="Regexes every other rank's start-up log shows."
    )

    _source: str | None = PrivateAttr(None)  # the file it was read from

    @property
    def served_name(self) -> str:
        """The model's name in the API: ``served_model_name``, else the model's repo id."""
        return self.served_model_name or self.model

    @model_validator(mode="after")
    def _check(self) -> Lane:
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
        method = (self.speculative or {}).get("method")
        if method in DRAFTER_METHODS and not self.drafter:
            raise _rule(f"method {method} drafts with a model of its own: give the lane's `drafter`", "speculative",
                        "method")
        for key, value in self.env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise _rule("not an environment variable name", "env", key)
            if key in SECRET_ENV:
                raise _rule(f"a secret in a lane (a plain file, shared as a recipe): it comes from {SECRET_ENV[key]}; "
                            "remove it", "env", key)
            if "$" in value:
                raise _rule("values are passed as they are (no shell expansion): remove the '$'", "env", key)
            for name in PLACEHOLDER_RE.findall(value):
                if name not in PLACEHOLDERS:
                    raise _rule(
                        f"placeholder {{{name}}} is not allowed (only {', '.join('{%s}' % p for p in PLACEHOLDERS)})",
                        "env", key,
                    )
        for key, value in self.nccl_env.items():
            if not re.fullmatch(r"NCCL_[A-Z0-9_]+", key):
                why = ("not an NCCL variable (NCCL_ and capitals, digits, '_'): nccl_env changes the cluster's NCCL "
                       "environment; a lane's other variables go in env")
                raise _rule(why, "nccl_env", key)
            if key in self.env:
                raise _rule("also set in env: give it once, here (two env files giving one variable: "
                            "which one the container keeps is docker's choice)", "nccl_env", key)
            if value is None:
                continue  # removed from the node's NCCL environment in this lane's containers
            if "$" in value:
                raise _rule("values are passed as they are (no shell expansion): remove the '$'", "nccl_env", key)
            if any(ord(char) < 32 or ord(char) == 127 for char in value):
                raise _rule("a control character (a line break?): an env file holds one variable a line",
                            "nccl_env", key)
            if PLACEHOLDER_RE.search(value):
                raise _rule("no placeholders in nccl_env: the same on every rank (what differs per node, the HCAs "
                            "and the GID index, is read there by prepare)", "nccl_env", key)
        for i, flag in enumerate(self.image_flags):
            if not re.fullmatch(r"--?[A-Za-z][A-Za-z0-9_.-]*", flag):
                raise _rule(f"{flag!r} is not a flag (e.g. --attention-backend)", "image_flags", i)
        for key in ("startup_checks", "worker_startup_checks"):
            for i, pattern in enumerate(getattr(self, key)):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise _rule(f"not a regular expression: {exc}", key, i) from None
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


def display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def locate(source: str, key: str = "", line: int | None = None) -> str:
    out = source
    if line:
        out += f", line {line}"
    if key:
        out += f", key '{key}'"
    return out


def key_text(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# Reading YAML within limits
# --------------------------
#
# Every YAML file sparkinfra reads from the user (lanes, image recipes, eugr recipes) goes through
# ``read_yaml``: one parse, bounded while it composes, before anything is built from it. The limits
# are far above any real file (the shipped lanes: < 4 KiB, 160 values, 5 levels) and far below what
# hurts the controller: a deep file no longer exhausts Python's stack (RecursionError), and aliases,
# which let a 3 KB file stand for billions of values ("billion laughs"), are not read at all.

MAX_BYTES = 256 * 1024
MAX_DEPTH = 32
MAX_VALUES = 10_000
MAX_NUMBER = 64  # characters of an int or float; Python refuses ints of over 4,300 digits, slowly
PLAIN_TAGS = {"!"} | {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map")}


class _Refused(yaml.MarkedYAMLError):
    """A limit of ``_Reader``: its message is the tool's own (no "YAML syntax:")."""

    def __init__(self, message: str, mark: yaml.Mark | None):
        super().__init__(problem=message, problem_mark=mark)


class _Reader(yaml.SafeLoader):
    """The safe loader, refusing while it composes: nesting deeper than ``MAX_DEPTH``, more than
    ``MAX_VALUES`` values, anchors and aliases, tags other than the plain ones, a second document,
    and numbers longer than ``MAX_NUMBER`` characters."""

    def __init__(self, text: str):
        super().__init__(text)
        self.depth = 0
        self.values = 0

    def get_single_node(self):
        self.get_event()  # stream start
        node = None
        if not self.check_event(yaml.StreamEndEvent):
            node = self.compose_document()
        if not self.check_event(yaml.StreamEndEvent):
            raise _Refused("a second YAML document (after ---); the file holds one", self.peek_event().start_mark)
        return node

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(
                f"YAML alias *{event.anchor}: anchors and aliases are not read (write each value out)",
                event.start_mark,
            )
        if event.anchor is not None:
            raise _Refused(
                f"YAML anchor &{event.anchor}: anchors and aliases are not read (write each value out)",
                event.start_mark,
            )
        if event.tag not in (None, *PLAIN_TAGS):
            tag = event.tag.replace("tag:yaml.org,2002:", "!!")
            raise _Refused(
                f"YAML tag {tag} is not read (plain values only: text, numbers, true/false, lists, mappings)",
                event.start_mark,
            )
        self.values += 1
        if self.values > MAX_VALUES:
            raise _Refused(f"more than {MAX_VALUES:,} keys and values (a lane holds a few hundred)", event.start_mark)
        nested = isinstance(event, yaml.CollectionStartEvent)
        if nested and self.depth == MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        self.depth += nested
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= nested

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:  # e.g. a date 2024-13-01
            shown = repr(node.value)[:60] if isinstance(node, yaml.ScalarNode) else "the value"
            kind = node.tag.rpartition(":")[2]
            raise _Refused(f"{shown} is not a valid {kind} ({exc})", node.start_mark) from None

    def construct_number(self, node):
        if len(node.value) > MAX_NUMBER:
            raise _Refused(f"a number of {len(node.value):,} characters (at most {MAX_NUMBER})", node.start_mark)
        kind = "int" if node.tag.endswith(":int") else "float"
        return getattr(yaml.SafeLoader, f"construct_yaml_{kind}")(self, node)


_Reader.add_constructor("tag:yaml.org,2002:int", _Reader.construct_number)
_Reader.add_constructor("tag:yaml.org,2002:float", _Reader.construct_number)
_Reader.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_yaml_str)  # a plain "=": text


def _lines(node: yaml.Node, source: str, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Line of every key and list item of a composed YAML document, by key path; refuses duplicate keys
    and keys that are not plain values."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise LaneError(f"{locate(source, key_text(path), line)}: a key is a name, not a list or a mapping")
            key = (*path, key_node.value)
            if key in out:
                raise LaneError(f"{locate(source, key_text(key), line)}: key given twice (also line {out[key]})")
            out[key] = line
            _lines(value_node, source, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*path, i)] = item.start_mark.line + 1
            _lines(item, source, (*path, i), out)
    return out


def _read_text(path: Path, source: str) -> str:
    """The file's text: a regular file of at most ``MAX_BYTES``, UTF-8."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block, /dev/zero never end
            raise LaneError(f"{source}: not a regular file")
        with open(path, "rb") as file:
            raw = file.read(MAX_BYTES + 1)
            size = os.fstat(file.fileno()).st_size
    except OSError as exc:
        raise LaneError(f"{source}: cannot read ({exc.strerror})") from None
    if len(raw) > MAX_BYTES:
        raise LaneError(
            f"{source}: {max(size, len(raw)) / 1024:,.0f} KiB, over the {MAX_BYTES // 1024} KiB limit "
            "(lanes and recipes are a few KiB)"
        )
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise LaneError(f"{locate(source, line=1)}: UTF-16 text; save it as UTF-8")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise LaneError(f"{locate(source, line=line)}: not UTF-8 text ({exc.reason})") from None


def read_yaml(
    path: Path, source: str, holds: str = "a lane file holds one mapping (name, model, nodes...)"
) -> tuple[Any, dict[tuple, int]]:
    """
    (data, line of every key and list item) of one YAML file the user wrote, read within limits
    (``MAX_BYTES``, ``MAX_DEPTH``, ``MAX_VALUES``, no aliases, no tags): the one reader of lanes, image
    recipes and eugr recipes. Raises ``LaneError`` naming ``source`` and the line, never a YAML or
    Python error.
    """
    text = _read_text(path, source)
    reader = None
    try:
        reader = _Reader(text)  # checks the characters first
        node = reader.get_single_node()
        if node is None:
            raise LaneError(f"{locate(source, line=1)}: empty; {holds}")
        lines = _lines(node, source)
        data = reader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = locate(source, line=mark.line + 1 if mark else None)
        syntax = "" if isinstance(exc, _Refused) else "YAML syntax: "
        raise LaneError(f"{where}: {syntax}{exc.problem or exc.context}") from None
    except yaml.reader.ReaderError as exc:
        where = locate(source, line=text[: exc.position].count("\n") + 1)
        raise LaneError(f"{where}: control character #x{exc.character:04x} (is this a text file?)") from None
    except yaml.YAMLError as exc:
        raise LaneError(f"{source}: YAML syntax: {exc}") from None
    finally:
        if reader is not None:
            reader.dispose()
    if not isinstance(data, dict):
        raise LaneError(f"{locate(source, line=node.start_mark.line + 1)}: {holds}")
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


def line_of(lines: dict[tuple, int], path: tuple) -> int | None:
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def _field_names(model: type[BaseModel], seen: set | None = None) -> set[str]:
    """Every key ``model`` and the models of its fields take (a suggestion's candidates)."""
    seen = set() if seen is None else seen
    if model in seen:
        return set()
    seen.add(model)
    names = set(model.model_fields)

    def models_in(annotation) -> list[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for arg in get_args(annotation) for m in models_in(arg)]

    for field in model.model_fields.values():
        for inner in models_in(field.annotation):
            names |= _field_names(inner, seen)
    return names


def validation_error(exc: ValidationError, data: dict, model: type[BaseModel] | None = None) -> tuple[tuple, str]:
    """(key path, message) of the first error; an unknown key first (a misspelt key is also a
    missing one), with the closest key ``model`` takes when one is near."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    path = _data_path(data, tuple(err["loc"]), keep_last=kind in ("missing", "extra_forbidden"))
    path = (*path, *ctx.get("path", ()))
    if kind == "extra_forbidden":
        key = str(err["loc"][-1])
        near = nearest(key, sorted(_field_names(model))) if model else None
        message = f"unknown key — did you mean '{near}'?" if near else "unknown key"
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
        path, message = validation_error(exc, data, Lane)
        raise LaneError(f"{locate(source, key_text(path), line_of(lines, path))}: {message}") from None


def load_lane(path: str | Path) -> Lane:
    """
    Read and validate one lane file; its ``name`` must be the file's stem.

    Raises ``LaneError`` naming the file, the key and the line.
    """
    path = Path(path)
    source = display(path)
    data, lines = read_yaml(path, source)
    lane = _validate(data, source, lines)
    if lane.name != path.stem:
        raise LaneError(
            f"{locate(source, 'name', lines.get(('name',)))}: {lane.name!r} differs from the file name "
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
    where = " or ".join(display(folder) for folder in dirs)
    raise LaneError(f"no lane {name!r} in {where} (lanes: {known})")


def beside_lanes(lane: Lane, folder: str) -> Path:
    """The folder ``folder`` next to the ``lanes/`` folder ``lane`` was read from (its mods, its
    image recipes)."""
    return (Path(lane._source).resolve().parent if lane._source else LANES_DIR).parent / folder


def mods_dir(lane: Lane) -> Path:
    """Where ``lane``'s mods are: ``mods/`` next to the ``lanes/`` folder it was read from."""
    return beside_lanes(lane, "mods")


def lane_source(lane: Lane) -> str:
    """The file a lane was read from (``lanes/<name>.yaml`` when built in code)."""
    return lane._source or f"lanes/{lane.name}.yaml"
