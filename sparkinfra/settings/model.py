"""
The settings model: ``HostSettings``, every key one host's data may hold (unknown keys are errors),
each with its type, default, description and rule; ``Cluster`` (its ``Node``s and ``Fabric``), the
per-cluster view the deploys use, with the cross-node rules; ``Settings``, every cluster of an
inventory. A setting whose Field names a ``serve`` flag (``json_schema_extra``) reaches ``vllm serve``
of every lane (``serve_settings``): the lanes render it, refuse it in a lane's ``serve`` and
``docs/settings.md`` says so, from this model alone.

Over 400 lines: every setting is one Field here, with its description and rule (``docs/settings.md``
is generated from them), beside the cross-key rules that read them.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo

from .rules import (
    ClusterName,
    ContainerName,
    ControllerPath,
    ENV_NAME,
    EnvName,
    EnvValue,
    HostName,
    ImageRef,
    InterfaceName,
    LaneName,
    ModelId,
    NodePath,
    RdmaDeviceName,
    Revision,
    ShellCommand,
    SshHost,
    SshUser,
    Tarball,
    TwinName,
    Url,
    WheelName,
    rule,
)

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
    cluster: ClusterName = Field(
        "spark", description="Cluster the node belongs to (one head per cluster)."
    )
    rank: int = Field(ge=0, description="Node rank: 0 is the head (serves the API), >0 are workers.")
    fabric_ip: IPv4Address = Field(description="The node's static address on the RoCE fabric.")

    # The fabric (the same on every node of a cluster)
    fabric_interface: InterfaceName = Field(
        "enp1s0f0np0", description="Ethernet side of the ConnectX-7 port."
    )
    fabric_subnet: IPv4Network = Field(description="Fabric subnet; every fabric_ip lies in it.")
    fabric_mtu: int = Field(4200, ge=1280, le=9216, description="MTU of the fabric port: the fabric interface and its twin.")
    fabric_twin_interface: TwinName = Field(
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
    rdma_devices: list[RdmaDeviceName] = Field(
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
    nccl_library: NodePath = Field(
        "/opt/nccl/lib/libnccl.so.2",
        description="The pinned libnccl.so.2 on each node (mounted at the same path into lanes).",
    )
    nccl_library_upload: ControllerPath = Field(
        "", description="The site's own NCCL build: a controller file placed at nccl_library on every node; "
        "empty: the head fetches nccl_wheel.",
    )
    nccl_wheel: WheelName = Field(
        "nvidia-nccl-cu13", description="The package whose wheel (nccl_version, the nodes' platform) holds the pin's "
        "libnccl.so.2: fetched once by the head from nccl_index, copied to every node over the fabric; "
        "empty: nccl_library must already be on every node.",
    )
    nccl_index: Url = Field(
        "https://pypi.org/simple", description="The package index (PEP 503) the head fetches nccl_wheel from.",
    )

    container_name: ContainerName = Field(
        "vllm_node", description="Name of a lane's container on every node (stale ones are removed)."
    )

    # Preflight (deploys/preflight.py)
    model_dir: NodePath = Field(
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
    image: ImageRef = Field(
        "vllm-node:latest", description="The site's base image on the head (model downloads run in it); the image "
        "of a lane that names none. Pin it by digest (name@sha256:...) and the head pulls it.",
    )
    image_id: str = Field(
        "", pattern=r"^(sha256:[0-9a-f]{64})?$", description="Expected image ID; empty: the head's."
    )
    image_build: ShellCommand = Field(
        "", description="Command run on the head to make `image` when it is missing (a site without a registry); "
        "a lane's own image is built from its recipe (images/NAME).",
    )
    image_tarball: Tarball = Field(
        "", description="docker-save tarball on the head, loaded when missing."
    )
    model: ModelId = Field("", description="Target model repository id.")
    model_revision: Revision = Field(
        "main", description="Revision of the target model: a commit (40 hex), or a branch or tag the site's lock "
        "pins to its commit (resolved once where the network is: `python -m sparkinfra lock`).",
    )
    drafter: ModelId = Field(
        "", description="Drafter model repository id; empty: none."
    )
    drafter_revision: Revision = Field(
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
        "size", description="How copies are compared to the head's manifest: sizes and the sha256 recorded while a "
        "file's size and mtime hold, or `deep`: every file on every node hashed again first."
    )
    stage_port: int = Field(8730, ge=1, le=65535, description="Port of the head's transfer daemon (fabric only).")
    stage_streams: int = Field(8, ge=1, le=64, description="Parallel transfer streams per worker.")

    # Serving (deploys/lane.py)
    api_key_env: str = Field(
        "", pattern=f"^({ENV_NAME})?$",
        description="Controller environment variable holding the API key the head serves with; empty: a key "
        "the first converge generates, kept in group_data/<cluster>.api-key (0600, ignored by git). serve, "
        "lane, bench and tune refuse to start while a variable named here is unset or empty.",
    )
    api_open: bool = Field(
        False, description="Serve the API without any key (anyone who reaches the head's API port may use "
        "it); every converge says so in its last lines. Not with api_key_env.",
    )
    firewall: bool = Field(
        True, description="Keep the ports a lane opens for its ranks (torch's rendezvous, Ray's GCS, client "
        "server and worker ports, the ephemeral range where vLLM, NCCL, gloo and Ray bind the rest) to the fabric "
        "subnet: an nftables table of sparkinfra's own (`inet sparkinfra`, /etc/sparkinfra/firewall.nft, loaded "
        "at boot by sparkinfra-firewall.service) refuses new TCP connections to them from anywhere else; SSH and "
        "the API port are never matched, nor is any other table. false: none (the site keeps them off its LAN).",
    )
    lane: LaneName = Field(
        "", description="Lane (recipe) to serve, a file lanes/<lane>.yaml; empty: none."
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="This cluster's GMU for every lane; empty: the lane's own value.",
        json_schema_extra={"serve": "gpu_memory_utilization"},
    )
    api_unlogged_paths: str | None = Field(
        None, pattern=r"^/[^\s,]*(,/[^\s,]*)*$",
        description="Paths of the head's API left out of its access log, comma-separated (`/health,/metrics`: "
        "the runner's health polls and a metrics scraper's, every few seconds); empty: every request is logged.",
        json_schema_extra={"serve": "disable_access_log_for_endpoints"},
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
    known_good_keep: int = Field(
        2, ge=1, description="Known good sets (a lane that served, every file that reproduces it) each node "
        "keeps, the newest first: 2 keeps the one before the current to return to."
    )
    canary_runs: int = Field(
        3, ge=1, le=20, description="Runs of each canary measure (a changed lane's probes and llama-benchy "
        "subset before it is promoted); each measure is their median."
    )
    canary_max_tokens: int = Field(
        256, ge=1, description="Completion tokens of each canary probe (seed 001's probes: 256); a bench "
        "result named by canary_baseline is compared only when its probes had as many."
    )
    canary_decode_tolerance: float | None = Field(
        None, ge=0, lt=1, description="Overrides every lane's canary.decode_tolerance on this cluster (a site "
        "whose numbers swing more, as a test bed sharing its cores); empty: the lane's."
    )
    canary_ttft_tolerance: float | None = Field(
        None, ge=0, description="Overrides every lane's canary.ttft_tolerance on this cluster; empty: the lane's."
    )
    canary_baseline: ControllerPath = Field(
        "", description="A bench result folder (results/<cluster>/<lane>/<time>) the canary compares with; "
        "empty: the canary of the lane's newest known good set."
    )
    retry_rejected: bool = Field(
        False, description="Start a plan a rollback turned away (its start or canary failed, or it was "
        "rolled back by hand) once more; else a converge that would start it refuses, saying why. Give it "
        "once, with --data."
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
    bench_sweep_thinking: bool = Field(
        False, description="Thinking in the llama-benchy sweep, set through the lane's switch as the probes set "
        "it (a template that thinks by default would otherwise measure another workload than the probes)."
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
    bench_book: ControllerPath = Field(
        "", description="Local text file llama-benchy draws prompts from (offline); empty: its default book."
    )
    bench_coherence: bool = Field(
        True, description="llama-benchy's coherence check first (a real model must answer it)."
    )
    results_dir: ControllerPath = Field("results", description="Controller folder of bench and tune results.")

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
                raise rule(odd, f"port {port} is also {other}: the head binds both")
            seen[port] = key
        return self

    @model_validator(mode="after")
    def _open_or_keyed(self) -> HostSettings:
        if self.api_open and self.api_key_env:
            raise rule("api_open", f"an open API takes no key, and api_key_env names {self.api_key_env}: "
                        "drop one of them")
        return self

    @model_validator(mode="after")
    def _twin_apart(self) -> HostSettings:
        # The twin is another netdev; its own address is never in the fabric subnet (routing and
        # NCCL's interface discovery break with one subnet on two netdevs).
        if self.fabric_twin_interface == self.fabric_interface:
            raise rule("fabric_twin_interface", f"{self.fabric_twin_interface} is fabric_interface itself: "
                        "the twin is the port's other PCIe function (enP2p1s0f0np0 for enp1s0f0np0)")
        twin = self.fabric_twin_subnet
        if twin != "link-local" and (twin.overlaps(self.fabric_subnet) or twin.overlaps(IPv4Network("169.254.0.0/16"))):
            clash = self.fabric_subnet if twin.overlaps(self.fabric_subnet) else "169.254.0.0/16 (link-local)"
            raise rule("fabric_twin_subnet", f"{twin} overlaps {clash}: the twin's subnet must be its own "
                        "(or `link-local`)")
        return self

    @model_validator(mode="after")
    def _lane_env_not_nccl(self) -> HostSettings:
        # A lane's container gets NCCL's variables from the node's NCCL file with the lane's changes:
        # one in lane_env too would be given twice, and docker's choice is not the operator's.
        nccl = sorted(k for k in self.lane_env if k.startswith("NCCL_"))
        if nccl:
            raise rule("lane_env", f"{', '.join(nccl)}: NCCL's variables go in nccl_env_overrides (every lane) or "
                        "a lane's nccl_env")
        return self

    @model_validator(mode="after")
    def _gpu_clock_range(self) -> HostSettings:
        if self.gpu_clock_cap:
            low, high = (int(x) for x in self.gpu_clock_cap.split(","))
            if low > high:
                raise rule("gpu_clock_cap", f"{self.gpu_clock_cap}: MIN above MAX (MHz, as nvidia-smi -lgc MIN,MAX)")
        return self

    @model_validator(mode="after")
    def _full_teardown_confirmed(self) -> HostSettings:
        # Refused before any connection: a full teardown takes the fabric and the mesh away.
        if self.teardown == "full" and self.teardown_confirm != self.cluster:
            got = f"got {self.teardown_confirm!r}" if self.teardown_confirm else "not set"
            raise rule(
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

    name: HostName
    ssh_host: SshHost
    ssh_user: SshUser
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
                    raise rule(key, why, node.name)
            seen_ranks[node.rank] = node.name
            seen_ips[ip] = node.name
            twin = IPv4Interface(self.fabric.twin_address(ip))
            net = IPv4Network(self.fabric.twin_subnet) if self.fabric.twin_subnet != "link-local" else twin.network
            if self.fabric.twin != "none" and (twin.ip in seen_twins or twin.ip not in net or twin.ip in (
                    net.network_address, net.broadcast_address)):
                why = (f"{node.name}'s twin address {twin.ip} is also {seen_twins[twin.ip]}'s"
                       if twin.ip in seen_twins else f"{node.name}'s twin address {twin.ip} is not a host of {net}")
                raise rule("fabric_twin_subnet", why, node.name)
            seen_twins[twin.ip] = node.name
        if 0 not in seen_ranks:
            raise rule("rank", f"cluster {self.name} has no rank 0 (head)", self.nodes[0].name)
        missing = sorted(set(range(len(self.nodes))) - set(seen_ranks))
        if missing:
            worst = max(self.nodes, key=lambda n: n.rank)
            raise rule(
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



def serve_flag(field: FieldInfo) -> str | None:
    """The ``vllm serve`` setting (its flag's name with underscores) a Field renders, if any."""
    extra = field.json_schema_extra
    return extra.get("serve") if isinstance(extra, dict) else None


# ``vllm serve`` setting -> the key of the setting that renders it for every lane.
SERVE_KEYS: dict[str, str] = {
    flag: key for key, field in HostSettings.model_fields.items() if (flag := serve_flag(field))
}


def serve_settings(config: HostSettings) -> dict[str, Any]:
    """The ``vllm serve`` settings ``config`` gives every lane (those not null), by flag name."""
    return {flag: getattr(config, key) for flag, key in SERVE_KEYS.items() if getattr(config, key) is not None}
