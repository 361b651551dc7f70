"""
The settings model: every key the deploys read, validated before any host is touched.

Settings come from pyinfra's own layering (``--data`` > inventory host data > group data
> ``all``), one flat dict per host. ``HostSettings`` is the schema of that dict;
``Cluster`` is the per-cluster view the deploys use, with the cross-host rules.
An error names the file (or ``--data``) and the key it came from.

Over 400 lines: every setting lives in this one model, each key with its description and rule
(the README's settings table is checked against it), beside the loader that names the file of
each key; split, a new setting would touch two places.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

# Keys pyinfra's SSH connector reads from host data (``ssh_user``, ``ssh_key`` ...).
from pyinfra.api.exceptions import PyinfraError
from pyinfra.connectors.ssh import connector_data_meta as _SSH_KEYS


class SettingsError(Exception):
    """Bad settings: one message naming the file and the key."""


class InventorySettingsError(PyinfraError):
    """Bad settings found while pyinfra loads the inventory (no host contacted yet)."""


def _rule(key: str, message: str, host: str | None = None, source: str | None = None) -> PydanticCustomError:
    """A broken rule about ``key``; ``source``: the key whose file (or ``--data``) the error names,
    when not ``key``'s own (a rule one key breaks by being left unset)."""
    return PydanticCustomError("settings", message, {"key": key, "host": host or "", "source": source or key})


# What several keys' values must look like.
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"  # an environment variable's name
CONTAINER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # docker's rule for a container's name
ABSOLUTE = r"^/"  # a path on the nodes

# The field reports' NCCL environment (seed 004); per-node values are added by prepare.
DEFAULT_NCCL_ENV = {
    "NCCL_IB_DISABLE": "0",
    "NCCL_NET": "ib",
    "NCCL_NET_PLUGIN": "none",
    "NCCL_IB_MERGE_NICS": "1",
    "NCCL_IB_QPS_PER_CONNECTION": "8",
    "NCCL_IB_SPLIT_DATA_ON_QPS": "1",
    "NCCL_IB_PCI_RELAXED_ORDERING": "1",
    "NCCL_NET_GDR_LEVEL": "LOC",
    "NCCL_CUMEM_ENABLE": "0",
    "NCCL_IGNORE_CPU_AFFINITY": "1",
    "NCCL_ASYNC_ERROR_HANDLING": "1",
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
    cluster: str = Field("spark", description="Cluster the node belongs to (one head per cluster).")
    rank: int = Field(ge=0, description="Node rank: 0 is the head (serves the API), >0 are workers.")
    fabric_ip: IPv4Address = Field(description="The node's static address on the RoCE fabric.")

    # The fabric (the same on every node of a cluster)
    fabric_interface: str = Field(
        "enp1s0f0np0", pattern=r"^[^\s/:]{1,15}$", description="Ethernet side of the ConnectX-7 port."
    )
    fabric_subnet: IPv4Network = Field(description="Fabric subnet; every fabric_ip lies in it.")
    fabric_mtu: int = Field(4200, ge=1280, le=9216, description="MTU of the fabric interface.")
    rdma_devices: list[str] = Field(
        ["rocep1s0f0", "roceP2p1s0f0"], min_length=1, description="RDMA devices on the fabric port."
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
    nccl_env: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_NCCL_ENV),
        description="NCCL/transport variables for every lane; per-node ones (GID index, HCAs, "
        "interfaces, pin) are added.",
    )
    nccl_env_overrides: dict[str, str | None] = Field(
        default_factory=dict,
        description="Site changes on top of everything rendered: a value replaces, null removes.",
    )
    nccl_version: str = Field(
        "2.30.7", pattern=r"^\d+\.\d+\.\d+$", description="NCCL version every node must load."
    )
    nccl_library: str = Field(
        "/opt/nccl/lib/libnccl.so.2", pattern=ABSOLUTE,
        description="The pinned libnccl.so.2 on each node (mounted at the same path into lanes).",
    )
    nccl_library_upload: str = Field(
        "", description="Controller file placed at nccl_library on every node; empty: already there."
    )

    container_name: str = Field(
        "vllm_node", pattern=CONTAINER_NAME, description="Name of a lane's container on every node (stale ones are removed)."
    )

    # Preflight (deploys/preflight.py)
    model_dir: str = Field(
        "/var/lib/sparkinfra/hf", pattern=ABSOLUTE, description="Where model snapshots live on every node."
    )
    preflight_free_gb: float = Field(
        240, ge=0, description="Free disk needed under model_dir (the staged models' size)."
    )
    api_port: int = Field(8000, ge=1, le=65535, description="Port the head serves the API on.")
    master_port: int = Field(
        29501, ge=1, le=65535, description="torch.distributed rendezvous port on the head."
    )

    # Staging (deploys/stage.py)
    image: str = Field(
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
    image_tarball: str = Field("", description="docker-save tarball on the head, loaded when missing.")
    model: str = Field("", description="Target model repository id.")
    model_revision: str = Field("main", description="Pinned revision (commit) of the target model.")
    drafter: str = Field("", description="Drafter model repository id; empty: none.")
    drafter_revision: str = Field("main", description="Pinned revision (commit) of the drafter.")
    allow_branch_revisions: bool = Field(
        False, description="Let a served lane's model_revision/drafter_revision name a branch or tag (main): "
        "two stages a week apart may then serve different weights. Off: commits (40 hex) only.",
    )
    hf_token_env: str = Field(
        "HF_TOKEN", pattern=f"^{ENV_NAME}$", description="Controller environment variable holding the Hugging Face token."
    )
    hf_endpoint: str = Field(
        "", pattern=r"^(https?://\S+)?$", description="Hub the head downloads from (HF_ENDPOINT, e.g. a mirror); empty: huggingface.co."
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
    lane: str = Field("", description="Lane (recipe) to serve, a file lanes/<lane>.yaml; empty: none.")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="This cluster's GMU for every lane; empty: the lane's own value."
    )
    lane_env: dict[Annotated[str, Field(pattern=f"^{ENV_NAME}$")], str] = Field(
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
    def _head_ports_differ(self) -> "HostSettings":
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
    def _gpu_clock_range(self) -> "HostSettings":
        if self.gpu_clock_cap:
            low, high = (int(x) for x in self.gpu_clock_cap.split(","))
            if low > high:
                raise _rule("gpu_clock_cap", f"{self.gpu_clock_cap}: MIN above MAX (MHz, as nvidia-smi -lgc MIN,MAX)")
        return self

    @model_validator(mode="after")
    def _full_teardown_confirmed(self) -> "HostSettings":
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


class Node(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    ssh_host: str
    ssh_user: str
    rank: int
    fabric_ip: IPv4Address


class Fabric(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    interface: str
    subnet: IPv4Network
    mtu: int
    rdma_devices: tuple[str, ...]
    rdma_port: int


class Cluster(BaseModel):
    """
    One cluster: its nodes (by rank) and what they share. Holds the cross-node rules.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    nodes: tuple[Node, ...]
    fabric: Fabric
    config: HostSettings  # the cluster-wide keys (every node agrees on them)

    @model_validator(mode="after")
    def _check_nodes(self) -> "Cluster":
        seen_ranks: dict[int, str] = {}
        seen_ips: dict[IPv4Address, str] = {}
        subnet = self.fabric.subnet
        for node in self.nodes:
            ip = node.fabric_ip
            rules = (  # (key, broken, why), in the order they are reported
                ("rank", node.rank in seen_ranks, f"rank {node.rank} is given to both {seen_ranks.get(node.rank)} and {node.name}"),
                ("fabric_ip", ip not in subnet, f"{ip} is outside the fabric subnet {subnet}"),
                ("fabric_ip", ip in (subnet.network_address, subnet.broadcast_address), f"{ip} is not a host address of {subnet}"),
                ("fabric_ip", ip in seen_ips, f"{ip} is given to both {seen_ips.get(ip)} and {node.name}"),
            )
            for key, broken, why in rules:
                if broken:
                    raise _rule(key, why, node.name)
            seen_ranks[node.rank] = node.name
            seen_ips[ip] = node.name
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


def _first_error(exc: ValidationError) -> tuple[str, str, str]:
    err = exc.errors()[0]
    ctx = err.get("ctx") or {}
    key = ctx.get("key") or ".".join(str(p) for p in err["loc"][:1])
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        message = "unknown key"
    elif err["type"] == "missing":
        message = "required key is missing"
    elif "input" in err and err["type"] != "settings":
        message = f"{message} (got {err['input']!r})"
    return key, ctx.get("host", ""), message


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
            f"{sources.inventory_file}: no hosts (a group of (name, data) tuples, as in inventory/pair.py)"
        )
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
        nodes = [
            Node(
                name=host.name,
                ssh_host=connection[host.name][0],
                ssh_user=connection[host.name][1],
                rank=per_host[host.name].rank,
                fabric_ip=per_host[host.name].fabric_ip,
            )
            for host in members
        ]
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
