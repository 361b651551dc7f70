"""
Every path and name sparkinfra owns on a node: files, folders, units, mounts in containers. The
ground floor (stdlib only, no imports of the package): operations, plans, teardown, verify and
``status`` read it, and it ships with the node programs, which read it too. ``FULL_TEARDOWN`` is
what a full teardown removes besides each lane's own (``lane_paths``).
"""

from __future__ import annotations

ETC = "/etc/sparkinfra"
RUN = "/run/sparkinfra"  # lost at reboot
VAR = "/var/lib/sparkinfra"
CACHE = "/var/cache/sparkinfra"
UNITS_DIR = "/etc/systemd/system"

# The node programs: this package, placed whole by ``operations.node.programs_present``.
PROGRAMS = "/usr/local/lib/sparkinfra/node"
CONTAINER_PROGRAMS = f"{RUN}/node"  # the same folder, mounted read-only in a container that runs one
NCCL_IDENTITY = f"{PROGRAMS}/nccl_identity.py"  # fed to a rank's container by status and verify

# NCCL (deploys/prepare.py)
NCCL_ENV_FILE = f"{ETC}/nccl.env"
NCCL_PIN_RECORD = f"{ETC}/nccl-pin.json"  # the pin's identity: sha256, ELF build-id, where it came from

# Lanes
PLANS_DIR = f"{ETC}/lanes"  # each lane's plan and env files
STATE_DIR = f"{VAR}/lanes"  # the head's validation marks and restart history (kept over reboots)
MARKS_DIR = f"{RUN}/lanes"  # lane_ctl's runtime marks (lost at reboot, as the lane is)
# lane_ctl's marks, ``MARKS_DIR/<lane>.<name>``
MARK_NAMES = ("started", "warm", "failures", "stop-reason", "start-reason", "nccl-copies", "trial.env", "nccl.env")
LANE_UNIT_PREFIX = "sparkinfra-lane-"
LANE_UNITS = f"{LANE_UNIT_PREFIX}*.service"  # every lane's unit: one lane runs at a time
# A lane's mods on each node (MODS_DIR/<lane>/<mod>/), mounted read-only into every rank's container,
# where apply_mods.sh runs each mod's run.sh in order before the lane's command.
MODS_DIR = f"{VAR}/mods"
CONTAINER_MODS = f"{RUN}/mods"
CONTAINER_API_KEY = f"{RUN}/api.env"  # the head's secret env file, mounted read-only
CONTAINER_HF = "/root/.cache/huggingface/hub"  # where a lane's container finds the HF cache
# The compile caches outlive each container, one folder per lane and image ID on each node
# (``COMPILE_CACHE/<lane>/<image>/<kind>``, mounted by lane_ctl at each kind's default path in the
# container): every start after the first skips what it compiled (seed 004: 15-18 minutes cold),
# and a new image starts clean (lane_ctl removes the folders of the lane's other images).
COMPILE_CACHE = f"{CACHE}/compile"
COMPILE_CACHES = {
    "vllm": "/root/.cache/vllm",  # torch.compile artifacts, model-class inspections
    "inductor": "/tmp/torchinductor_root",  # torch inductor's (TORCHINDUCTOR_CACHE_DIR's default)
    "triton": "/root/.triton",  # Triton's kernels
    "flashinfer": "/root/.cache/flashinfer",  # FlashInfer's JIT
    "nv": "/root/.nv",  # CUDA's ComputeCache (PTX compiled for the GPU)
}
CHECK_CONTAINER = "sparkinfra-vllm-check"  # the head's throwaway container of the in-image vLLM check

# Known good: each lane set that served, kept on every node to return to (``KNOWN_GOOD/<n>/``: the
# rank's placed files as they were, mirrored under ``files/``, and ``meta.json``), root-only.
KNOWN_GOOD = f"{VAR}/known-good"
# A start that failed and was rolled back: every rank's journal of it (``FAILED_STARTS/<lane>-<when>/``).
FAILED_STARTS = f"{VAR}/failed-starts"

# Staging, images, the converge lock
IMAGES_DIR = f"{VAR}/images"  # image recipes' build folders on the head
MANIFEST = ".sparkinfra-manifest.json"  # a snapshot's manifest, in its folder of the model dir
STAGE_UNIT = "sparkinfra-stage.service"  # the head's transient rsync daemon
STAGE_CONF = f"{RUN}/stage-rsyncd.conf"
HF_TOKEN_FILE = f"{RUN}/hf_token"
CONVERGE_LOCK = f"{RUN}/converge.lock"
CONVERGE_HOLDER = f"{RUN}/converge.holder"

# The node's own setup (deploys/prepare.py)
FABRIC_NETPLAN = "/etc/netplan/60-sparkinfra-fabric.yaml"  # where netplan is installed (DGX OS)
FABRIC_UNIT = "sparkinfra-fabric.service"  # elsewhere
GPU_CLOCKS_UNIT = "sparkinfra-gpu-clocks.service"
# The cluster's ports on the fabric only (the lane's steps): nftables' table of our own, its file, its unit
FIREWALL_TABLE = "inet sparkinfra"
FIREWALL_FILE = f"{ETC}/firewall.nft"
FIREWALL_UNIT = "sparkinfra-firewall.service"
MESH_KEY = "/root/.ssh/sparkinfra_fabric"
MESH_KNOWN_HOSTS = "/root/.ssh/sparkinfra_known_hosts"
MESH_CONFIG = "/root/.ssh/config"  # the head's entries sit in a marked block
MESH_CONFIG_MARKER = "# {mark} sparkinfra fabric mesh"

# What a full teardown removes besides each lane's own files (``lane_paths``) and what the
# operations it runs undo (the GPU clock unit, the fabric's boot config, the head's mesh): the
# lanes' shared folders, the node programs, the NCCL env file. Images, model snapshots with their
# manifests, the compile caches, the pinned NCCL library, its record and the converge lock stay.
# Where earlier versions placed the node programs one file at a time (a full teardown removes them too).
OLD_PROGRAMS = tuple(f"/usr/local/lib/sparkinfra/{name}" for name in (
    "lane_ctl.py", "container_check.py", "nccl_identity.py", "nccl_fetch.py", "apply_mods.sh"))
FULL_TEARDOWN_FOLDERS = (PLANS_DIR, PROGRAMS, MODS_DIR, MARKS_DIR, STATE_DIR, KNOWN_GOOD, FAILED_STARTS)
FULL_TEARDOWN_FILES = (NCCL_ENV_FILE, *OLD_PROGRAMS)


def unit_path(unit: str) -> str:
    return f"{UNITS_DIR}/{unit}"


def unit_name(lane: str) -> str:
    return f"{LANE_UNIT_PREFIX}{lane}.service"


def plan_path(lane: str) -> str:
    """The rank's runner plan (``plan.RunnerPlan``, JSON)."""
    return f"{PLANS_DIR}/{lane}.json"


def env_path(lane: str) -> str:
    return f"{PLANS_DIR}/{lane}.env"


def secret_env_path(lane: str) -> str:
    """The head's root-only env file holding ``VLLM_API_KEY`` (when the settings name a key)."""
    return f"{PLANS_DIR}/{lane}.secret.env"


def nccl_env_path(lane: str) -> str:
    """
    The NCCL env file of a lane that changes the node's (its ``nccl_env``): the node's
    ``NCCL_ENV_FILE`` with the lane's variables set and removed, written by lane_ctl (root-only)
    right before each ``docker run`` of the rank, and passed instead of the node's file
    (docker's ``--env-file`` cannot unset a variable). Lost at reboot, written again at the start.
    """
    return f"{MARKS_DIR}/{lane}.nccl.env"


def failures_path(lane: str) -> str:
    """lane_ctl's count of the lane's failures in a row, which its next start backs off by."""
    return f"{MARKS_DIR}/{lane}.failures"


def history_path(lane: str) -> str:
    """
    The head's restart history of the lane: one JSON line per start, ready and stop, each with its
    reason (``lane_ctl history``); root-only, the last 200 events, kept over reboots (a boot is one
    of the reasons it tells).
    """
    return f"{STATE_DIR}/{lane}.history"


def validated_path(lane: str) -> str:
    """The head's mark that vLLM in the lane's image accepted this lane's arguments."""
    return f"{STATE_DIR}/{lane}.validated"


def check_request_path(lane: str) -> str:
    """What the head's in-image vLLM check of the lane reads (root-only)."""
    return f"{STATE_DIR}/{lane}.check.json"


def check_log_path(lane: str) -> str:
    """vLLM's own lines of the head's last in-image check of the lane (root-only; its report says
    the verdict, this the detail)."""
    return f"{STATE_DIR}/{lane}.check.log"


def rejected_path(lane: str) -> str:
    """
    The head's mark of the lane's plan that a rollback turned away (its start or canary failed, or
    an operator rolled back from it): ``{digest, why, at, number}``, root-only, kept over reboots.
    A converge that would start that plan again refuses (``retry_rejected`` lets it); a promotion
    of the lane removes it.
    """
    return f"{STATE_DIR}/{lane}.rejected"


def compile_cache_root(lane: str) -> str:
    return f"{COMPILE_CACHE}/{lane}"


# Where a lane leaves a file or folder: ``folder/<prefix><lane><suffix>``. The one list
# ``lane_paths`` and ``lane_of_path`` read (a longer suffix before one it ends with).
LANE_PLACES = (
    (UNITS_DIR, LANE_UNIT_PREFIX, ".service"),  # its unit
    (PLANS_DIR, "", ".json"), (PLANS_DIR, "", ".env"), (PLANS_DIR, "", ".secret.env"),  # plan, env files
    (STATE_DIR, "", ".validated"), (STATE_DIR, "", ".check.json"), (STATE_DIR, "", ".check.log"),  # the head's
    (STATE_DIR, "", ".history"), (STATE_DIR, "", ".rejected"),
    (MODS_DIR, "", ""),  # its mods
    *((MARKS_DIR, "", f".{name}") for name in MARK_NAMES),  # lane_ctl's runtime marks
)


def lane_paths(lane: str) -> list[str]:
    """Every file and folder a lane leaves on a node besides the node programs: its unit, plan, env
    files, the head's validation marks and restart history, its mods, its runtime marks (what goes
    when it is not the cluster's lane any more)."""
    return [f"{folder}/{prefix}{lane}{suffix}" for folder, prefix, suffix in LANE_PLACES]


def lane_set_paths(lane: str) -> list[str]:
    """The files and folder that reproduce a node's rank of a lane, as a converge placed them: its
    unit, plan, env files, the head's mark that the image's vLLM accepted its arguments (and what
    was checked), its mods; what a known good set keeps (not the history, not the runtime marks)."""
    return lane_paths(lane)[:6] + [f"{MODS_DIR}/{lane}"]


def known_good_dir(number: int) -> str:
    return f"{KNOWN_GOOD}/{number}"


def lane_of_path(path: str) -> str | None:
    """The lane a path of ``lane_paths`` belongs to (None: not a lane's)."""
    folder, _, name = path.rstrip("/").rpartition("/")
    places = sorted((p for p in LANE_PLACES if p[0] == folder), key=lambda p: -len(p[2]))
    for _, prefix, suffix in places:
        if name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix) + len(suffix):
            return name[len(prefix):len(name) - len(suffix)]
    return None


def program(name: str, *args: str, root: str = PROGRAMS) -> list[str]:
    """The argv that runs the node program ``name`` (a module of this package) from ``root``."""
    return ["python3", root, name, *args]
