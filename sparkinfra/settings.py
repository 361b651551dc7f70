"""
The settings model: every key the deploys read, validated before any host is touched.

Settings come from pyinfra's own layering (``--data`` > inventory host data > group data
> ``all``), one flat dict per host. ``HostSettings`` is the schema of that dict;
``Cluster`` is the per-cluster view the deploys use, with the cross-host rules; ``Node`` holds
the rules of how a node is reached (its name, SSH host and user). A value that goes into a shell
command, a unit file, a path or an ssh_config is checked for where it goes (``*_problem``). An
error names the file (or ``--data``), the key and the host, and says what is wrong in words:
pydantic's are reworded (``in_words``), a bound says why (``WHY``), a typo gets the nearest key.

Over 400 lines: every setting lives in this one model, each key with its description and rule
(the settings table in docs/settings.md is checked against it), beside the loader that names
the file of each key; split, a new setting would touch two places.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

# Keys pyinfra's SSH connector reads from host data (``ssh_user``, ``ssh_key`` ...).
from pyinfra.connectors.ssh import connector_data_meta as _SSH_KEYS


class SettingsError(Exception):
    """Bad settings: one message naming the file and the key."""


def _rule(key: str, message: str, host: str | None = None, source: str | None = None) -> PydanticCustomError:
    """A broken rule about ``key``; ``source``: the key whose file (or ``--data``) the error names,
    when not ``key``'s own (a rule one key breaks by being left unset)."""
    return PydanticCustomError("settings", message, {"key": key, "host": host or "", "source": source or key})


# What a value must look like where it goes
# ------------------------------------------
# Each rule says, in words, what is wrong with a value (None: nothing). Values are still quoted
# where they are used; these rules keep out what quoting cannot make right (a path for a name, a
# space in an ssh_config line, a name the kernel or docker refuses).

ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"  # an environment variable's name
SAFE = "letters, digits, '_', '.' and '-'"
_SAFE = re.compile(r"[A-Za-z0-9_.-]+")


def _odd_character(value: str, allowed: re.Pattern[str]) -> str | None:
    """The first character of ``value`` outside ``allowed`` (one-character matches), shown."""
    for char in value:
        if not allowed.fullmatch(char):
            return "a space" if char == " " else f"{char!r}"
    return None


def name_problem(value: str, what: str, limit: int, goes: str) -> str | None:
    """
    A name that becomes a file or folder name, a unit name or a word of a command: ``SAFE``
    characters, starting with a letter or digit, no ``..``, at most ``limit`` characters.

    + what: the thing named (``a lane's name``); goes: where it goes, said in the refusal
    """
    if not value:
        return f"{what} cannot be empty ({goes})"
    if "/" in value:
        return f"{value!r} is a path, not a name: {what} has no '/' ({goes})"
    odd = _odd_character(value, _SAFE)
    if odd:
        return f"{value!r} holds {odd}: {what} takes {SAFE} ({goes})"
    if not value[0].isalnum():
        return f"{value!r} starts with {value[0]!r}: {what} starts with a letter or digit ({goes})"
    if ".." in value:
        return f"{value!r} holds '..': {what} is a name, not a path ({goes})"
    if len(value) > limit:
        return f"{value!r} is {len(value)} characters: {what} takes at most {limit} ({goes})"
    return None


def device_problem(value: str, what: str, limit: int, why_limit: str, goes: str) -> str | None:
    """
    A kernel device's name: Linux's rules (at most ``limit`` characters, no '/', ':' or
    whitespace, not ``.`` or ``..``), then ``SAFE`` characters only.

    + what: ``a network interface's name``; why_limit: the kernel's constant; goes: where it goes
    """
    if not value or value in (".", ".."):
        return f"{value!r} cannot be {what}: Linux refuses an empty name, '.' and '..'"
    if len(value) > limit:
        return f"{value!r} is {len(value)} characters: Linux takes at most {limit} in {what} ({why_limit})"
    for char in "/:":
        if char in value:
            return f"{value!r} holds {char!r}: Linux refuses it in {what}"
    if any(char.isspace() for char in value):
        return f"{value!r} holds whitespace: Linux refuses it in {what}"
    odd = _odd_character(value, _SAFE)
    if odd:
        return f"{value!r} holds {odd}: {what} takes {SAFE} here ({goes})"
    return None


def interface_problem(value: str) -> str | None:
    return device_problem(
        value, "a network interface's name", 15, "IFNAMSIZ", "it goes into the fabric unit, netplan and ip commands"
    )


def rdma_device_problem(value: str) -> str | None:
    return device_problem(
        value, "an RDMA device's name", 63, "IB_DEVICE_NAME_MAX", "it names a folder of /sys/class/infiniband"
    )


def twin_problem(value: str) -> str | None:
    if value in ("", "none"):
        return None
    return interface_problem(value)


def wheel_problem(value: str) -> str | None:
    if value and not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", value):
        return f"{value!r} is not a package name (PEP 508: letters, digits, '.', '_', '-')"
    return None


def url_problem(value: str) -> str | None:
    if not re.fullmatch(r"https?://[^\s'\"]+", value):
        return f"{value!r} is not an http(s) URL"
    return None


def container_problem(value: str) -> str | None:
    return name_problem(value, "a container's name", 128, "docker's rule: [a-zA-Z0-9][a-zA-Z0-9_.-]*")


def cluster_problem(value: str) -> str | None:
    return name_problem(value, "a cluster's name", 64, "it names results folders and the mesh key")


def lane_problem(value: str) -> str | None:
    if not value:
        return None
    return name_problem(value, "a lane's name", 100, "it names the file lanes/<lane>.yaml")


def host_name_problem(value: str) -> str | None:
    return name_problem(value, "a node's name", 253, "it is the SSH host too, unless ssh_hostname is set")


def ssh_user_problem(value: str) -> str | None:
    """A login name as ssh_config's ``User`` line and ``authorized_keys`` take it."""
    goes = "it goes into ssh_config's User line and the worker's authorized_keys"
    if not value:
        return f"a login name cannot be empty ({goes})"
    odd = _odd_character(value, _SAFE)
    if odd:
        return f"{value!r} holds {odd}: a login name takes {SAFE} ({goes})"
    if value[0] in "-.":
        return f"{value!r} starts with {value[0]!r}: a login name starts with a letter, digit or '_' ({goes})"
    if len(value) > 32:
        return f"{value!r} is {len(value)} characters: Linux login names take at most 32"
    return None


_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?")


def ssh_host_problem(value: str) -> str | None:
    """An IPv4 address or a DNS name (or an ssh_config alias of the same shape)."""
    said = f"{value!r} is neither an IPv4 address nor a DNS name"
    if not value or len(value) > 253:
        return said
    labels = value.rstrip(".").split(".")
    if all(label.isdigit() for label in labels):
        try:
            IPv4Address(value)
        except ValueError:
            return f"{value!r} is not an IPv4 address"
        return None
    bad = next((label for label in labels if len(label) > 63 or not _LABEL.fullmatch(label)), None)
    if bad is not None:
        part = f": {bad!r} is not a DNS label" if bad != value else ""
        return f"{said}{part} (letters, digits, '-' and '_', not starting or ending with '-', at most 63)"
    return None


_HUB_PART = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def model_id_problem(value: str) -> str | None:
    """A Hub repository id, ``owner/name``, as the Hub allows it (huggingface_hub's rules)."""
    if not value:
        return None
    if value.count("/") != 1:
        return f"{value!r} is not a Hub repository id: owner/name, one '/'"
    for part in value.split("/"):
        if not _HUB_PART.fullmatch(part) or len(part) > 96 or "--" in part or ".." in part:
            return (
                f"{value!r}: {part!r} is not a Hub name ({SAFE}, at most 96, not starting or ending with "
                "'-' or '.', no '--' or '..')"
            )
    if value.endswith(".git"):
        return f"{value!r} ends with '.git': the Hub refuses it"
    return None


_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./-]*")


def revision_problem(value: str) -> str | None:
    """A commit, branch or tag of a Hub repository (a git ref's name)."""
    tidy = ".." not in value and "//" not in value and not value.endswith(("/", ".lock"))
    if _REVISION.fullmatch(value) and tidy:
        return None
    return (
        f"{value!r} is not a revision: a commit (40 hex), branch or tag of letters, digits and '/', '_', '.', '-', "
        "starting with a letter or digit, no '..' (it names a folder of the HF cache)"
    )


# docker's image reference grammar (distribution/reference): [domain[:port]/]path[:tag][@digest]
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL_OF_DOMAIN = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_LABEL_OF_DOMAIN}(?:\.{_LABEL_OF_DOMAIN})*(?::[0-9]+)?"
_IMAGE = re.compile(
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)


def image_problem(value: str) -> str | None:
    if _IMAGE.fullmatch(value):
        return None
    return (
        f"{value!r} is not an image reference docker takes: [registry/]name[:tag][@sha256:digest], "
        "the name in lowercase letters, digits and '.', '_', '-' separators"
    )


_PATH = re.compile(r"[A-Za-z0-9_.+@/-]")


def node_path_problem(value: str) -> str | None:
    """A path on the nodes, as docker's ``-v``, ``LD_PRELOAD`` and shell commands take it."""
    goes = "it goes into docker's -v, LD_PRELOAD and commands, where ':', ',' and spaces separate"
    if not value.startswith("/"):
        return f"{value!r} is not an absolute path (a path on the nodes starts with '/')"
    odd = _odd_character(value, _PATH)
    if odd:
        said = "a path on the nodes takes letters, digits and '/', '_', '.', '-', '+', '@'"
        return f"{value!r} holds {odd}: {said} ({goes})"
    if ".." in value.split("/"):
        return f"{value!r} holds '..': give the folder itself"
    return None


def tarball_problem(value: str) -> str | None:
    return node_path_problem(value) if value else None


def env_value_problem(value: str) -> str | None:
    """A value of an env file line (docker's ``--env-file``, systemd's ``EnvironmentFile=``)."""
    if any(ord(char) < 32 or ord(char) == 127 for char in value):
        return f"{value!r} holds a control character (a line break?): an env file holds one variable a line"
    return None


def _checked(problem: Callable[[str], str | None]) -> AfterValidator:
    """A str field's rule: ``problem(value)`` says what is wrong, in words."""

    def check(value: str) -> str:
        said = problem(value)
        if said:
            raise PydanticCustomError("settings", said)
        return value

    return AfterValidator(check)


EnvName = Annotated[str, Field(pattern=f"^{ENV_NAME}$")]
EnvValue = Annotated[str, _checked(env_value_problem)]

# Every lane's NCCL environment: the transport (IB on, no net plugin), what eugr's launcher gives
# every container (seeds 001 and 002) and the logging verify reads; per-node values are added by
# prepare. Tuning is a lane's (its nccl_env): seed 001 measured NCCL levers per model, and seed
# 004's RoCE tuning is quad-nvfp4's.
DEFAULT_NCCL_ENV = {
    "NCCL_IB_DISABLE": "0",
    "NCCL_NET": "ib",
    "NCCL_NET_PLUGIN": "none",
    "NCCL_IGNORE_CPU_AFFINITY": "1",
    # every rank's log says its NCCL version, network, HCAs and GID index (sparkinfra.nccl_log)
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
}


class HostSettings(BaseModel):
    """
    What one host's data may hold, after pyinfra's layering. Unknown keys are errors.
    """

    model_config = ConfigDict(extra="forbid", strict=False)

    # Identity of the node in its cluster
    cluster: Annotated[str, _checked(cluster_problem)] = Field(
        "spark", description="Cluster the node belongs to (one head per cluster)."
    )
    rank: int = Field(ge=0, description="Node rank: 0 is the head (serves the API), >0 are workers.")
    fabric_ip: IPv4Address = Field(description="The node's static address on the RoCE fabric.")

    # The fabric (the same on every node of a cluster)
    fabric_interface: Annotated[str, _checked(interface_problem)] = Field(
        "enp1s0f0np0", description="Ethernet side of the ConnectX-7 port."
    )
    fabric_subnet: IPv4Network = Field(description="Fabric subnet; every fabric_ip lies in it.")
    fabric_mtu: int = Field(4200, ge=1280, le=9216, description="MTU of the fabric port: the fabric interface and its twin.")
    fabric_twin_interface: Annotated[str, _checked(twin_problem)] = Field(
        "", description="The other PCIe function (\"twin\") of the fabric port: its own netdev, RDMA device "
        "and GID table, the same MTU (docs/fabric.md). Empty: found on each node, the netdev named as "
        "fabric_interface in another PCI domain (enp1s0f0np0 -> enP2p1s0f0np0); `none`: a port without one.",
    )
    fabric_twin_subnet: Literal["link-local"] | IPv4Network = Field(
        "link-local", description="Where the twin's IPv4 lies (its GID table needs one for RoCE v2): "
        "`link-local`, 169.254.X.Y/16 from the node's fabric_ip's last two bytes (the common netplan's "
        "`link-local: [ipv4]`, made stable); or a subnet of its own, never the fabric subnet, the twin's "
        "address then at the node's offset in it.",
    )
    rdma_devices: list[Annotated[str, _checked(rdma_device_problem)]] = Field(
        [], description="RDMA devices NCCL uses (NCCL_IB_HCA); empty: those of the fabric port's twins, "
        "read from each node (ibdev2netdev's sysfs), fabric_interface's first.",
    )
    rdma_port: int = Field(1, ge=1, description="Port of the RDMA devices.")
    fabric_min_gbps: float = Field(
        160.0, gt=0, description="Least RDMA write bandwidth, head to each worker with every HCA at once "
        "(Gb/s), that `pytest tests/verify --fabric-bandwidth` accepts: 80% of a 200G port by default.",
    )

    gpu_clock_cap: str = Field(
        "", pattern=r"^(\d{2,4},\d{2,4})?$",
        description="Lock the GPU clock to MIN,MAX MHz at boot and now (`nvidia-smi -lgc`; the eugr README's "
        "200,2150 stops shutdowns under load); empty: the driver's own clocks (a lock set earlier is reset).",
    )
    fabric_persist: bool = Field(
        True,
        description="Keep address and MTU in boot-time config (netplan where present, else a "
        "unit of ours); false: the site persists them, ours is removed.",
    )

    # NCCL (deploys/prepare.py renders it to /etc/sparkinfra/nccl.env on every node)
    nccl_env: dict[EnvName, EnvValue] = Field(
        default_factory=lambda: dict(DEFAULT_NCCL_ENV),
        description="NCCL/transport variables for every lane (a lane's nccl_env sets or removes over them); "
        "per-node ones (GID index, HCAs, interfaces, pin) are added.",
    )
    nccl_env_overrides: dict[EnvName, EnvValue | None] = Field(
        default_factory=dict,
        description="Site changes on top of everything rendered: a value replaces, null removes.",
    )
    nccl_version: str = Field(
        "2.30.7", pattern=r"^\d+\.\d+\.\d+$", description="NCCL version every node must load."
    )
    nccl_library: Annotated[str, _checked(node_path_problem)] = Field(
        "/opt/nccl/lib/libnccl.so.2",
        description="The pinned libnccl.so.2 on each node (mounted at the same path into lanes).",
    )
    nccl_library_upload: str = Field(
        "", description="The site's own NCCL build: a controller file placed at nccl_library on every node; "
        "empty: the head fetches nccl_wheel.",
    )
    nccl_wheel: Annotated[str, _checked(wheel_problem)] = Field(
        "nvidia-nccl-cu13", description="The package whose wheel (nccl_version, the nodes' platform) holds the pin's "
        "libnccl.so.2: fetched once by the head from nccl_index, copied to every node over the fabric; "
        "empty: nccl_library must already be on every node.",
    )
    nccl_index: Annotated[str, _checked(url_problem)] = Field(
        "https://pypi.org/simple", description="The package index (PEP 503) the head fetches nccl_wheel from.",
    )

    container_name: Annotated[str, _checked(container_problem)] = Field(
        "vllm_node", description="Name of a lane's container on every node (stale ones are removed)."
    )

    # Preflight (deploys/preflight.py)
    model_dir: Annotated[str, _checked(node_path_problem)] = Field(
        "/var/lib/sparkinfra/hf", description="Where model snapshots live on every node."
    )
    preflight_free_gb: float = Field(
        240, ge=0, description="Free disk needed under model_dir (the staged models' size)."
    )
    api_port: int = Field(8000, ge=1, le=65535, description="Port the head serves the API on.")
    master_port: int = Field(
        29501, ge=1, le=65535, description="torch.distributed rendezvous port on the head."
    )

    # Staging (deploys/stage.py)
    image: Annotated[str, _checked(image_problem)] = Field(
        "vllm-node:latest", description="The site's base image on the head (model downloads run in it); the image "
        "of a lane that names none. Pin it by digest (name@sha256:...) and the head pulls it.",
    )
    image_id: str = Field(
        "", pattern=r"^(sha256:[0-9a-f]{64})?$", description="Expected image ID; empty: the head's."
    )
    image_build: str = Field(
        "", description="Command run on the head to make `image` when it is missing (a site without a registry); "
        "a lane's own image is built from its recipe (images/NAME).",
    )
    image_tarball: Annotated[str, _checked(tarball_problem)] = Field(
        "", description="docker-save tarball on the head, loaded when missing."
    )
    model: Annotated[str, _checked(model_id_problem)] = Field("", description="Target model repository id.")
    model_revision: Annotated[str, _checked(revision_problem)] = Field(
        "main", description="Revision of the target model: a commit (40 hex), or a branch or tag the site's lock "
        "pins to its commit (resolved once where the network is: `python -m sparkinfra lock`).",
    )
    drafter: Annotated[str, _checked(model_id_problem)] = Field(
        "", description="Drafter model repository id; empty: none."
    )
    drafter_revision: Annotated[str, _checked(revision_problem)] = Field(
        "main", description="Revision of the drafter: a commit, or a branch or tag the lock pins."
    )
    lock_file: str = Field(
        "", pattern=r"^(\S.*\.ya?ml)?$", description="The site's lock, on the controller (a path from the project "
        "root); empty: group_data/<cluster>.lock.yaml beside the inventory's group data.",
    )
    hf_token_env: str = Field(
        "HF_TOKEN", pattern=f"^{ENV_NAME}$", description="Controller environment variable holding the Hugging Face token."
    )
    hf_endpoint: str = Field(
        "", pattern=r"^(https?://[^\s/@]+(/\S*)?)?$", description="Hub the head downloads from (HF_ENDPOINT, e.g. a "
        "mirror), without credentials (`user:password@` would reach a command line: a token goes in `hf_token_env`); "
        "empty: huggingface.co."
    )
    stage_verify: Literal["size", "deep"] = Field(
        "size", description="How workers are compared to the manifest: sizes, or sha256 of every file."
    )
    stage_port: int = Field(8730, ge=1, le=65535, description="Port of the head's transfer daemon (fabric only).")
    stage_streams: int = Field(8, ge=1, le=64, description="Parallel transfer streams per worker.")

    # Serving (deploys/lane.py)
    api_key_env: str = Field(
        "", pattern=f"^({ENV_NAME})?$",
        description="Controller environment variable holding the API key the head serves with; empty: no key.",
    )
    lane: Annotated[str, _checked(lane_problem)] = Field(
        "", description="Lane (recipe) to serve, a file lanes/<lane>.yaml; empty: none."
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="This cluster's GMU for every lane; empty: the lane's own value."
    )
    lane_env: dict[EnvName, EnvValue] = Field(
        {}, description="Environment of every lane on this cluster, over the lane's own env (e.g. a tuned "
        "VLLM_CPU_KVCACHE_SPACE)."
    )
    lane_ready_timeout: int = Field(
        1800, ge=10, description="Seconds a (re)started lane may take to answer a completion."
    )
    lane_liveness_interval: int = Field(
        30, ge=5, description="Seconds between the head's one-token liveness completions."
    )
    lane_liveness_timeout: int = Field(
        60, ge=5, description="Seconds a liveness completion may take; two failed in a row restart the lane."
    )
    lane_unreachable_grace: int = Field(
        900, ge=0, description="Seconds a worker the head cannot reach (fabric or SSH down, unit state "
        "unknown) may stay so while the API still completes, before the lane restarts; 0: at once."
    )
    lane_head_lost_timeout: int = Field(
        60, ge=10, description="Seconds a worker rank runs on once rank 0's rendezvous port stopped "
        "answering; then it stops itself, so no worker outlives its lane."
    )
    page_cache_dropper: int = Field(
        5, ge=0, description="While a lane's weights load, every node drops its page cache this often "
        "(seconds) until the API answers (seed 001: the load thrashes below 2 GB free); 0: off. Never "
        "for a lane loading with instanttensor."
    )

    # Benchmarks (deploys/bench.py), from the controller against the head's API
    bench_probes: int = Field(5, ge=1, le=100, description="Probes per workload and thinking mode (seed 001).")
    bench_max_tokens: int = Field(256, ge=1, description="Completion tokens per probe.")
    bench_workloads: list[Literal["json", "code"]] = Field(
        ["json", "code"], min_length=1, description="Probe workloads."
    )
    bench_thinking: list[bool] = Field(
        [False, True], min_length=1, description="Thinking modes of the probes (chat_template_kwargs)."
    )
    bench_pp: list[Annotated[int, Field(ge=1)]] = Field([2048], description="llama-benchy prompt sizes; empty: no sweep.")
    bench_tg: list[Annotated[int, Field(ge=1)]] = Field([32], min_length=1, description="llama-benchy generation sizes.")
    bench_depth: list[Annotated[int, Field(ge=0)]] = Field(
        [0, 4096, 8192, 16384, 32768], min_length=1, description="llama-benchy context depths."
    )
    bench_concurrency: list[Annotated[int, Field(ge=1)]] = Field(
        [1, 2, 4], min_length=1, description="llama-benchy concurrent users."
    )
    bench_runs: int = Field(3, ge=1, description="llama-benchy runs per measurement.")
    bench_book: str = Field(
        "", description="Local text file llama-benchy draws prompts from (offline); empty: its default book."
    )
    bench_coherence: bool = Field(
        True, description="llama-benchy's coherence check first (a real model must answer it)."
    )
    results_dir: str = Field("results", description="Controller folder of bench and tune results.")

    # GMU bracketing (deploys/tune.py)
    tune_knob: Literal["gpu_memory_utilization", "VLLM_CPU_KVCACHE_SPACE"] = Field(
        "gpu_memory_utilization",
        description="Knob to bracket: GMU (GPU), or the KV cache GiB of vLLM's CPU build.",
    )
    tune_start: float | None = Field(None, gt=0, description="First value tried; empty: the lane's value.")
    tune_max: float | None = Field(
        None, gt=0, description="Highest value tried; empty: 0.95 (GMU) or 16 GiB (CPU KV cache)."
    )
    tune_max_starts: int = Field(6, ge=1, le=20, description="Most lane starts one bracketing makes.")

    # Teardown (deploys/teardown.py)
    teardown: Literal["lanes", "full"] = Field(
        "lanes",
        description="What teardown removes: the lanes (units stopped, container removed), or also "
        "everything else sparkinfra installed but images, model snapshots and the NCCL pin.",
    )
    teardown_confirm: str = Field(
        "", description="The cluster's name, which teardown=full requires (a full teardown is confirmed)."
    )

    @model_validator(mode="after")
    def _head_ports_differ(self) -> HostSettings:
        # The head binds all three; blame the one set explicitly (the other may be a default).
        seen: dict[int, str] = {}
        for key in ("api_port", "master_port", "stage_port"):
            port = getattr(self, key)
            if port in seen:
                odd, other = key, seen[port]
                if odd not in self.model_fields_set and other in self.model_fields_set:
                    odd, other = other, odd
                raise _rule(odd, f"port {port} is also {other}: the head binds both")
            seen[port] = key
        return self

    @model_validator(mode="after")
    def _twin_apart(self) -> HostSettings:
        # The twin is another netdev; its own address is never in the fabric subnet (routing and
        # NCCL's interface discovery break with one subnet on two netdevs).
        if self.fabric_twin_interface == self.fabric_interface:
            raise _rule("fabric_twin_interface", f"{self.fabric_twin_interface} is fabric_interface itself: "
                        "the twin is the port's other PCIe function (enP2p1s0f0np0 for enp1s0f0np0)")
        twin = self.fabric_twin_subnet
        if twin != "link-local" and (twin.overlaps(self.fabric_subnet) or twin.overlaps(IPv4Network("169.254.0.0/16"))):
            clash = self.fabric_subnet if twin.overlaps(self.fabric_subnet) else "169.254.0.0/16 (link-local)"
            raise _rule("fabric_twin_subnet", f"{twin} overlaps {clash}: the twin's subnet must be its own "
                        "(or `link-local`)")
        return self

    @model_validator(mode="after")
    def _lane_env_not_nccl(self) -> HostSettings:
        # A lane's container gets NCCL's variables from the node's NCCL file with the lane's changes:
        # one in lane_env too would be given twice, and docker's choice is not the operator's.
        nccl = sorted(k for k in self.lane_env if k.startswith("NCCL_"))
        if nccl:
            raise _rule("lane_env", f"{', '.join(nccl)}: NCCL's variables go in nccl_env_overrides (every lane) or "
                        "a lane's nccl_env")
        return self

    @model_validator(mode="after")
    def _gpu_clock_range(self) -> HostSettings:
        if self.gpu_clock_cap:
            low, high = (int(x) for x in self.gpu_clock_cap.split(","))
            if low > high:
                raise _rule("gpu_clock_cap", f"{self.gpu_clock_cap}: MIN above MAX (MHz, as nvidia-smi -lgc MIN,MAX)")
        return self

    @model_validator(mode="after")
    def _full_teardown_confirmed(self) -> HostSettings:
        # Refused before any connection: a full teardown takes the fabric and the mesh away.
        if self.teardown == "full" and self.teardown_confirm != self.cluster:
            got = f"got {self.teardown_confirm!r}" if self.teardown_confirm else "not set"
            raise _rule(
                "teardown_confirm",
                f"teardown=full removes what sparkinfra installed on cluster {self.cluster}: "
                f"confirm with teardown_confirm={self.cluster} ({got})",
                # Left unset: name where the full teardown was asked for.
                source="teardown_confirm" if "teardown_confirm" in self.model_fields_set else "teardown",
            )
        return self


# Keys every node of a cluster must agree on: all but the node's own.
CLUSTER_KEYS = tuple(k for k in HostSettings.model_fields if k not in ("cluster", "rank", "fabric_ip"))

# Why a key's bounds are where they are, said when a value is outside them (obvious ones left out);
# by bound (ge, gt, le, lt, min_length) where the two ends have different reasons.
WHY: dict[str, str | dict[str, str]] = {
    "rank": "0 is the head, workers count up from 1",
    "fabric_mtu": {
        "ge": "1280 is IPv6's minimum link MTU",
        "le": "9216 is the largest jumbo frame Ethernet switches commonly carry",
    },
    "rdma_port": "an HCA numbers its ports from 1",
    "api_port": "a TCP port is 1..65535",
    "master_port": "a TCP port is 1..65535",
    "stage_port": "a TCP port is 1..65535",
    "stage_streams": "each stream is an rsync process on the head and on the worker",
    "gpu_memory_utilization": "the fraction of the GPU's memory vLLM may take",
    "lane_ready_timeout": "a start loads the model's weights: under 10 s is never enough",
    "lane_liveness_interval": "each check is a completion on the head's API",
    "lane_liveness_timeout": "a one-token completion on a busy engine takes seconds",
    "lane_head_lost_timeout": "shorter, a worker would stop over a brief pause of rank 0",
    "bench_probes": "each probe decodes bench_max_tokens tokens, one stream at a time",
    "tune_max_starts": "each start loads the weights (minutes on a Spark)",
}


class Node(BaseModel):
    """One node of a cluster: its name in the inventory, how pyinfra reaches it, its place."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, _checked(host_name_problem)]
    ssh_host: Annotated[str, _checked(ssh_host_problem)]
    ssh_user: Annotated[str, _checked(ssh_user_problem)]
    rank: int
    fabric_ip: IPv4Address


# The host data key each of Node's connection fields comes from ("": the host's own name).
NODE_KEYS = {"name": "", "ssh_host": "ssh_hostname", "ssh_user": "ssh_user"}


class Fabric(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    interface: str
    subnet: IPv4Network
    mtu: int
    rdma_devices: tuple[str, ...]  # empty: the twins' own, read from each node
    rdma_port: int
    twin: str = ""  # the twin's netdev; "": found on each node; "none": no twin
    twin_subnet: Literal["link-local"] | IPv4Network = "link-local"

    def twin_address(self, fabric_ip: IPv4Address) -> str:
        """The twin's IPv4 with its prefix on the node whose fabric address is ``fabric_ip``:
        169.254.X.Y/16 from its last two bytes (X kept off IPv4LL's reserved 0 and 255), or the
        same offset in ``twin_subnet``."""
        if self.twin_subnet == "link-local":
            third, fourth = fabric_ip.packed[2], fabric_ip.packed[3]
            return f"169.254.{min(max(third, 1), 254)}.{fourth}/16"
        offset = int(fabric_ip) - int(self.subnet.network_address)
        return f"{self.twin_subnet.network_address + offset}/{self.twin_subnet.prefixlen}"


class Cluster(BaseModel):
    """
    One cluster: its nodes (by rank) and what they share. Holds the cross-node rules.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    nodes: tuple[Node, ...]
    fabric: Fabric
    config: HostSettings  # the cluster-wide keys (every node agrees on them; revisions as the lock pins them)
    lock_file: str = ""  # the site's lock on the controller (sparkinfra.lock), set when its pins are read
    pins: tuple[tuple[str, str], ...] = ()  # (entry, pin) of every reference the lock pins (sparkinfra.lock)

    def pin(self, name: str) -> str | None:
        """The lock's pin of reference ``name`` (``model``, ``recipe/NAME``, ``nccl``...), if locked."""
        return dict(self.pins).get(name)

    @model_validator(mode="after")
    def _check_nodes(self) -> Cluster:
        seen_ranks: dict[int, str] = {}
        seen_ips: dict[IPv4Address, str] = {}
        seen_twins: dict[IPv4Address, str] = {}
        subnet = self.fabric.subnet
        for node in self.nodes:
            ip = node.fabric_ip
            rules = (  # (key, broken, why), in the order they are reported
                ("rank", node.rank in seen_ranks,
                 f"rank {node.rank} is given to both {seen_ranks.get(node.rank)} and {node.name}"),
                ("fabric_ip", ip not in subnet, f"{ip} is outside the fabric subnet {subnet}"),
                ("fabric_ip", ip in (subnet.network_address, subnet.broadcast_address),
                 f"{ip} is not a host address of {subnet}"),
                ("fabric_ip", ip in seen_ips, f"{ip} is given to both {seen_ips.get(ip)} and {node.name}"),
            )
            for key, broken, why in rules:
                if broken:
                    raise _rule(key, why, node.name)
            seen_ranks[node.rank] = node.name
            seen_ips[ip] = node.name
            twin = IPv4Interface(self.fabric.twin_address(ip))
            net = IPv4Network(self.fabric.twin_subnet) if self.fabric.twin_subnet != "link-local" else twin.network
            if self.fabric.twin != "none" and (twin.ip in seen_twins or twin.ip not in net or twin.ip in (
                    net.network_address, net.broadcast_address)):
                why = (f"{node.name}'s twin address {twin.ip} is also {seen_twins[twin.ip]}'s"
                       if twin.ip in seen_twins else f"{node.name}'s twin address {twin.ip} is not a host of {net}")
                raise _rule("fabric_twin_subnet", why, node.name)
            seen_twins[twin.ip] = node.name
        if 0 not in seen_ranks:
            raise _rule("rank", f"cluster {self.name} has no rank 0 (head)", self.nodes[0].name)
        missing = sorted(set(range(len(self.nodes))) - set(seen_ranks))
        if missing:
            worst = max(self.nodes, key=lambda n: n.rank)
            raise _rule(
                "rank",
                f"ranks of cluster {self.name} must be 0..{len(self.nodes) - 1}; "
                f"{worst.rank} given, {missing[0]} missing",
                worst.name,
            )
        return self

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> tuple[Node, ...]:
        return self.nodes[1:]

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)


class Settings(BaseModel):
    """
    All clusters of an inventory, keyed by cluster name.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    clusters: dict[str, Cluster]

    def cluster_of(self, host_name: str) -> Cluster:
        for cluster in self.clusters.values():
            for node in cluster.nodes:
                if node.name == host_name:
                    return cluster
        raise KeyError(host_name)

    def node(self, host_name: str) -> Node:
        return self.cluster_of(host_name).node(host_name)


# Loading from a pyinfra inventory
# --------------------------------


def _assigned_names(path: Path) -> set[str]:
    """Names a group_data file assigns anywhere at module level (read, not executed)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return set()
    return {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
    }


class _Sources:
    """Says where a host's key came from, following pyinfra's layering."""

    # How specific each layer is: the more specific side of a disagreement is the odd one out.
    HOST, GROUP, ALL, DEFAULT = 3, 2, 1, 0

    def __init__(self, inventory, inventory_file: str | None, group_data_dirs: list[Path], cwd: Path):
        self.inventory = inventory
        self.inventory_file = inventory_file or "the inventory"
        self.dirs = group_data_dirs
        self.cwd = cwd

    def _group_file(self, group: str, key: str) -> str | None:
        for folder in reversed(self.dirs):
            path = folder / f"{group}.py"
            if path.is_file() and key in _assigned_names(path):
                return display(path, self.cwd)
        return None

    def layer(self, host, key: str) -> tuple[int, str]:
        """(specificity, file) of the layer the host's value of ``key`` comes from."""
        inv = self.inventory
        if key in (inv.get_override_data() or {}):
            return self.HOST + 1, "--data"
        if key in inv.get_host_data(host.name):
            return self.HOST, self.inventory_file
        for group in reversed(host.groups):
            if key in inv.get_group_data(group):
                return self.GROUP, self._group_file(group, key) or self.inventory_file
        if key in inv.get_data():
            return self.ALL, self._group_file("all", key) or self.inventory_file
        # Not set anywhere: the inventory that declares the host is where it belongs.
        return self.DEFAULT, self.inventory_file

    def of(self, host, key: str) -> str:
        return self.layer(host, key)[1]


def display(path: Path, cwd: Path | None = None) -> str:
    try:
        return str(path.resolve().relative_to((cwd or Path.cwd()).resolve()))
    except ValueError:
        return str(path)


def _host_data(inventory, host) -> dict[str, Any]:
    """The host's merged data, as pyinfra layers it (lowest layer first)."""
    merged: dict[str, Any] = {}
    merged.update(inventory.get_data())
    merged.update(inventory.get_groups_data(host.groups))
    merged.update(inventory.get_host_data(host.name))
    merged.update(inventory.get_override_data() or {})
    return merged


def _error(source: str, key: str, host: str, message: str) -> SettingsError:
    where = f"{source}, key '{key}'" if key else source
    who = f" (host {host})" if host else ""
    return SettingsError(f"{where}{who}: {message}")


# pydantic's errors, in the tool's words ({name}: from the error's context).
SAID = {
    "missing": "required key is missing",
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be text (a quoted string)",
    "list_type": "must be a list",
    "dict_type": "must be a mapping (a dict)",
    "literal_error": "must be {expected}",
    "greater_than_equal": "must be {ge} or more",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be {le} or less",
    "less_than": "must be less than {lt}",
    "too_short": "must hold at least {min_length} item(s)",
    "too_long": "must hold at most {max_length} item(s)",
    "ip_v4_address": "must be an IPv4 address (four numbers 0-255)",
    "ip_v4_network": "must be an IPv4 network: address/prefix, the prefix 0..32, no host bits set (10.0.0.0/24)",
}
# What a key with a pattern must look like (others say it with their rule, or their description).
FORM = {
    "nccl_version": "x.y.z, as NCCL reports it (2.30.7)",
    "image_id": "sha256: and 64 hex digits, as docker reports an image ID, or empty",
    "gpu_clock_cap": "MIN,MAX in MHz, as nvidia-smi -lgc takes it (200,2150), or empty",
    "hf_token_env": "an environment variable's name (letters, digits and '_', not starting with a digit)",
    "api_key_env": "an environment variable's name (letters, digits and '_', not starting with a digit), or empty",
    "hf_endpoint": "an http(s) URL without user:password@ (a token goes in hf_token_env), or empty",
}
ENV_NAME_FORM = "an environment variable's name (letters, digits and '_', not starting with a digit)"


def _within(loc: tuple) -> str:
    """Where inside a key's value an error is: ``item 2: ``, ``'NCCL_X': ``, ``name 'X-Y': ``."""
    rest = loc[1:]
    if not rest:
        return ""
    if rest[-1] == "[key]":
        return f"name {rest[0]!r}: "
    if isinstance(rest[0], int):
        return f"item {rest[0] + 1}: "
    return f"{rest[0]!r}: "


def unknown_key(key: str) -> str:
    """The refusal of an unknown key, with the nearest known one (a typo)."""
    near = difflib.get_close_matches(key, [*HostSettings.model_fields, *_SSH_KEYS], n=1, cutoff=0.75)
    if near:
        return f"unknown key — did you mean '{near[0]}'?"
    return "unknown key: neither a setting (docs/settings.md) nor one of pyinfra's ssh_* keys"


# Settings whose refused value is not repeated in the message: it may hold a credential.
UNECHOED = frozenset({"hf_endpoint"})


def in_words(err: dict) -> tuple[str, str, str]:
    """(key, host, what is wrong) of one pydantic error of the settings' models, said for a person."""
    ctx = err.get("ctx") or {}
    key = ctx.get("key") or (str(err["loc"][0]) if err["loc"] else "")
    kind = err["type"]
    if kind == "settings":  # a rule of ours: already in words
        return key, ctx.get("host", ""), _within(err["loc"]) + err["msg"]
    if kind == "extra_forbidden":
        return key, "", unknown_key(key)
    if kind == "missing":
        return key, "", SAID[kind]
    if kind == "string_pattern_mismatch":
        form = ENV_NAME_FORM if len(err["loc"]) > 1 else FORM.get(key)
        field = HostSettings.model_fields.get(key)
        said = f"must be {form}" if form else f"does not fit: {field.description if field else ctx['pattern']}"
    elif kind in SAID:
        said = SAID[kind].format(**ctx)
    else:  # a kind no setting has met yet: pydantic's own words
        said = err["msg"]
    got = "" if key in UNECHOED else f" (got {err['input']!r})"
    said = f"{_within(err['loc'])}{said}{got}"
    bound = next((name for name in ("ge", "gt", "le", "lt", "min_length") if name in ctx), None)
    why = WHY.get(key) if bound else None
    why = why.get(bound) if isinstance(why, dict) else why
    return key, "", f"{said}: {why}" if why else said


def _first_error(exc: ValidationError) -> tuple[str, str, str]:
    return in_words(exc.errors()[0])


def load_settings(
    inventory,
    inventory_file: str | None = None,
    cwd: str | None = None,
    group_data_dirs: list[str] | tuple[str, ...] = (),
    check_lane: Callable[[Cluster], list[str]] | None = None,
) -> Settings:
    """
    Validate every host's data of a pyinfra ``Inventory`` and build the ``Settings``.

    + inventory_file, cwd, group_data_dirs: where the data came from, as given to pyinfra
      (the same search order as its CLI), so an error can name the file
    + check_lane: a cluster's problems with its lane (``lanes.lane_problems``), blamed on the
      file that sets ``lane``

    Raises ``SettingsError`` naming the file (or ``--data``) and the key.
    """
    base = Path(cwd or Path.cwd())
    dirs = [base / "group_data"]
    if inventory_file:
        inv_dir = (base / inventory_file).resolve().parent / "group_data"
        if inv_dir != dirs[0].resolve():
            dirs.append(inv_dir)
    dirs += [base / d for d in group_data_dirs]
    sources = _Sources(inventory, inventory_file, dirs, base)

    hosts = list(inventory)
    if not hosts:
        raise SettingsError(
            f"inventory {sources.inventory_file} has no hosts: give a group of (name, data) tuples, "
            "as inventory/pair.py does"
        )
    seen: dict[str, str] = {}
    for host in hosts:
        said = host_name_problem(host.name)
        if not said and host.name.lower() in seen:
            said = (
                f"its name differs from {seen[host.name.lower()]}'s only in case: SSH, DNS and the "
                "cluster's files would take them for one node"
            )
        if said:
            raise _error(sources.inventory_file, "", host.name, said)
        seen[host.name.lower()] = host.name
    per_host: dict[str, HostSettings] = {}
    connection: dict[str, tuple[str, str]] = {}
    for host in hosts:
        data = _host_data(inventory, host)
        ours = {k: v for k, v in data.items() if not k.startswith("_") and k not in _SSH_KEYS}
        try:
            per_host[host.name] = HostSettings.model_validate(ours)
        except ValidationError as exc:
            key, _, message = _first_error(exc)
            source = (exc.errors()[0].get("ctx") or {}).get("source") or key
            raise _error(sources.of(host, source), key, host.name, message) from None
        ssh_host = data.get("ssh_hostname") or host.name
        ssh_user = data.get("ssh_user") or "root"
        connection[host.name] = (str(ssh_host), str(ssh_user))

    by_cluster: dict[str, list] = {}
    for host in hosts:
        by_cluster.setdefault(per_host[host.name].cluster, []).append(host)

    clusters: dict[str, Cluster] = {}
    for name, members in by_cluster.items():
        first = per_host[members[0].name]
        for host in members[1:]:
            for key in CLUSTER_KEYS:
                if getattr(per_host[host.name], key) != getattr(first, key):
                    # Blame the side set in the more specific layer (the odd one out).
                    odd, other = host, members[0]
                    if sources.layer(members[0], key)[0] > sources.layer(host, key)[0]:
                        odd, other = members[0], host
                    raise _error(
                        sources.of(odd, key),
                        key,
                        odd.name,
                        f"{getattr(per_host[odd.name], key)!r} differs from "
                        f"{getattr(per_host[other.name], key)!r} on {other.name}: every node of "
                        f"cluster {name} must agree",
                    )
        nodes = []
        for host in members:
            try:
                nodes.append(Node(
                    name=host.name,
                    ssh_host=connection[host.name][0],
                    ssh_user=connection[host.name][1],
                    rank=per_host[host.name].rank,
                    fabric_ip=per_host[host.name].fabric_ip,
                ))
            except ValidationError as exc:
                field, _, message = _first_error(exc)
                key = NODE_KEYS.get(field, field)
                source = sources.of(host, key) if key else sources.inventory_file
                raise _error(source, key, host.name, message) from None
        try:
            clusters[name] = Cluster(
                name=name,
                nodes=tuple(sorted(nodes, key=lambda n: n.rank)),
                fabric=Fabric(
                    interface=first.fabric_interface,
                    subnet=first.fabric_subnet,
                    mtu=first.fabric_mtu,
                    rdma_devices=tuple(first.rdma_devices),
                    rdma_port=first.rdma_port,
                    twin=first.fabric_twin_interface,
                    twin_subnet=first.fabric_twin_subnet,
                ),
                config=first,
            )
        except ValidationError as exc:
            key, host_name, message = _first_error(exc)
            host = inventory.get_host(host_name) if host_name else members[0]
            raise _error(sources.of(host, key), key, host.name, message) from None
        problems = check_lane(clusters[name]) if check_lane and first.lane else []
        if problems:
            head = inventory.get_host(clusters[name].head.name)
            raise _error(sources.of(head, "lane"), "lane", head.name, "; ".join(problems))
    return Settings(clusters=clusters)
