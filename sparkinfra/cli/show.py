"""
What a lane will run, rank by rank, before anything runs: the exact ``docker run`` of each rank's
unit (options, mounts, image, the ``vllm serve`` arguments), its env files with secrets masked, the
model and drafter with their revisions. Read from the inventory and ``group_data`` alone: no host
is connected.

    python -m sparkinfra lanes show [LANE] --inventory inventory/pair.py [--data key=value ...]
"""

from __future__ import annotations

import re
import shlex

from .. import rules, serving
from ..cluster_lane import cluster_lane
from ..node import paths
from ..node.paths import NCCL_ENV_FILE, NCCL_PIN_RECORD
from ..operations.nccl import nccl_env, nccl_variables, upload_identity
from ..settings import Cluster
from ..lanes.checks import check_lane
from ..lanes.images import lane_image, load_recipe, network_refs
from ..lanes.mods import ModsNotFetched, lane_mods
from ..lanes.ports import EPHEMERAL, opened
from ..lanes.schema import Lane, LaneError

# A variable whose name says it holds a credential is shown masked.
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
GID_LATER = ("<read on the node by deploys/prepare.py: the IPv4 RoCE v2 row of each HCA's own netdev, "
             "where both twins agree; unset where they differ (NCCL then takes each HCA's own)>")
HCA_LATER = "<read on the node by deploys/prepare.py: the RDMA devices of {interface} and its twin>"
PIN_OVER = "<each other libnccl.so* file in the container>"
PIN_NOTE = (
    "{over}: found by the lane's runner in the image and the lane's mounts before the first start\n"
    "  (pip's nvidia/nccl/lib, the system's libnccl2: what torch or Ray load by path), once per image ID;\n"
    "  '{copies}' on the node lists them"
)

CACHE_IMAGE = "<image ID>"
CACHE_NOTE = (
    "{image}: the short ID of the image on the node; the compile caches (vLLM, inductor, Triton, FlashInfer,\n"
    "  CUDA) are kept per lane and image, so a restart skips what the last start compiled and a new image\n"
    "  starts cold (the runner removes the lane's other images' caches)"
)


def image_line(lane: Lane, default: str, pins: dict[str, str] | None = None) -> str:
    """How the lane's image reaches the nodes: built from its recipe, pulled, or the cluster's."""
    try:
        image = lane_image(lane, default, pins)
    except LaneError:
        return "image: its recipe is refused (above)"
    recipe = image.recipe
    if recipe and recipe.dockerfile:
        base = f" on {recipe.base}" if recipe.base else ""
        vllm = f", vLLM {recipe.vllm_ref}" if recipe.vllm_ref else ""
        prs = f" with PRs {', '.join(f'#{pr}' for pr in recipe.vllm_prs)}" if recipe.vllm_prs else ""
        how = f"built on the head from images/{image.name}/{recipe.dockerfile}{base}{vllm}{prs}"
    elif recipe:
        at = str(recipe.commit)[:12] if recipe.commit else f"{recipe.ref} (its commit: see the lock below)"
        how = (f"built on the head by {' '.join(recipe.script)} in {recipe.repository} at {at} "
               f"({len(recipe.patches)} patches: {', '.join(recipe.patches) or 'none'})")
    elif isinstance(lane.image, str):
        how = "pulled on the head by digest" if "@sha256:" in image.ref else "pulled by the digest the lock pins"
    else:
        how = "the cluster's image"
    needs = f"; {recipe.description}" if recipe and recipe.description else ""
    ref = image.ref
    written = load_recipe(image.folder) if recipe else None  # the references as the recipe names them
    if written and any(entry not in (pins or {}) for entry, *_ in network_refs(image.name, written, default)):
        ref = f"{ref.rpartition(':')[0]}:<the digest of the recipe as the lock pins it>"
    return f"image {ref}: {how}, then streamed to every worker by image ID{needs}"


def mod_lines(lane: Lane, cluster: Cluster) -> tuple[list[str], bool]:
    """The lane's mods as each rank applies them (groups expanded), and whether they are still to be
    fetched (a build repository's, not locked or not fetched on this controller yet)."""
    if not lane.mods:
        return [], False
    where = "the project's mods/" if lane.mods_from == "project" else "its image's build repository"
    try:
        mods = lane_mods(lane, dict(cluster.pins))
    except ModsNotFetched as exc:
        return [f"mods {', '.join(lane.mods)} from {where}: expanded by the converge that fetches them ({exc})"], True
    except LaneError:
        return ["mods: refused (above)"], True
    return [f"mods from {where}, applied in this order before each rank's command and the head's vLLM check: "
            + ", ".join(m.name for m in mods)], False


def show(lane: Lane, cluster: Cluster, problems: list[str] | None = None, locked: list[str] = ()) -> str:
    """The text of ``python -m sparkinfra lanes show`` for ``lane`` on ``cluster``, headed by what would
    make a converge refuse it (``problems``; by default ``check_lane``'s) and by what the site's lock
    pins (``locked``: ``lock.reference_lines``)."""
    config = cluster.config
    problems = check_lane(lane, cluster) + rules.refusals(lane, cluster) if problems is None else problems
    mods, unfetched = mod_lines(lane, cluster)
    # Mods a converge fetches first are left out of the plans shown (their digests are not known yet).
    on = cluster_lane(cluster, lane.model_copy(update={"mods": []}) if unfetched else lane)
    plans = on.plans
    revisions = [f"model {config.model} @ {config.model_revision}" if config.model else "model: none set (settings: model)"]
    if config.drafter:
        revisions.append(f"drafter {config.drafter} @ {config.drafter_revision}")
    out = [
        f"Lane {lane.name} on cluster {cluster.name} ({len(cluster.nodes)} nodes), plan {on.digest}",
        "  " + "; ".join(revisions),
        "  " + image_line(lane, config.image, dict(cluster.pins)),
        *("  " + line for line in mods),
        *("  " + line for line in locked),
        "  nothing was connected: what depends on a node (its twin, HCAs, GID rows) is read there by the deploys",
        *(f"  REFUSED by a converge: {problem}" for problem in problems),
        *(f"  WARNED by a converge: {warning}" for warning in rules.warnings(lane, cluster)),
    ]
    fabric = cluster.fabric
    hcas = list(fabric.rdma_devices) or [HCA_LATER.format(interface=fabric.interface)]
    nccl = nccl_env(nccl_variables(cluster), config.nccl_env_overrides, hcas, GID_LATER)  # the same on every node
    out += ["", *pin_lines(cluster)]
    for plan in plans:
        node = plan.node
        role = f"serves the API on :{plan.api_port}" if plan.is_head else f"headless, joins {plan.head_ip}"
        out += ["", f"rank {plan.rank} on {node.name} (fabric {node.fabric_ip}, {role}), unit {paths.unit_name(lane.name)}"]
        out += ["  " + line for line in twin_lines(cluster, node.fabric_ip)]
        out += port_lines(lane, cluster, plan.rank)
        out += ["  " + line for line in docker_lines(plan)]
        if plan.nccl_pin:
            copies = shlex.join(paths.program("lane_ctl", "copies", paths.plan_path(lane.name)))
            out += ["  " + PIN_NOTE.format(over=PIN_OVER, copies=copies)]
        out += ["  " + CACHE_NOTE.format(image=CACHE_IMAGE)]
        out += nccl_lines(plan, nccl)
        out += _env_file(paths.env_path(lane.name), plan.env)
        if plan.api_key_file:
            out += [f"  {plan.api_key_file} (root only, mounted at {paths.CONTAINER_API_KEY}):",
                    f"      VLLM_API_KEY=<${config.api_key_env} of the controller: not shown>"]
    return "\n".join(out) + "\n"


def port_lines(lane: Lane, cluster: Cluster, rank: int) -> list[str]:
    """Every port the rank's lane opens on its node (new TCP connections), its process, from where."""
    lines = ["  ports it opens, and from where a new connection may come (SSH: from anywhere, never matched):"]
    for port in opened(lane, cluster, rank):
        ports = "the ephemeral range (ip_local_port_range)" if port.ports == EPHEMERAL else port.ports
        lines.append(f"    {ports}: {port.process}; from {port.reach}")
    return lines


def nccl_lines(plan: serving.RankPlan, nccl: dict[str, str]) -> list[str]:
    """The rank's NCCL env file: the node's (``nccl``), or, where the lane changes it (``nccl_env``),
    the changes and the file the runner writes from the node's with them (what the container gets)."""
    changes = plan.nccl_changes
    if not changes:
        return _env_file(NCCL_ENV_FILE, nccl)
    sets = [f"{k}={_masked(k, v)}" for k, v in changes.items() if v is not None]
    removed = [k for k, v in changes.items() if v is None]
    said = [*(["set " + ", ".join(sets)] if sets else []), *(["removed " + ", ".join(removed)] if removed else [])]
    mine = {k: v for k, v in nccl.items() if k not in changes}
    mine.update({k: v for k, v in changes.items() if v is not None})
    return [f"  the lane's NCCL changes (nccl_env): {'; '.join(said)}",
            *_env_file(f"{paths.nccl_env_path(plan.lane)} (root only; the runner writes it before each start: "
                       f"{NCCL_ENV_FILE} with those changes)", mine)]


def twin_lines(cluster: Cluster, fabric_ip) -> list[str]:
    """The fabric port's twins on one node: each netdev with its address and MTU, its HCA, its GID row."""
    fabric = cluster.fabric
    mine = f"{fabric_ip}/{fabric.subnet.prefixlen}"
    rows = "GID row: read there (its own netdev's IPv4 RoCE v2 row)"
    if fabric.twin == "none":
        return [f"fabric {fabric.interface} {mine}, MTU {fabric.mtu}; no twin (fabric_twin_interface = none); {rows}"]
    twin = fabric.twin or "its twin (named as it in another PCI domain, found on the node)"
    hcas = ", ".join(fabric.rdma_devices) if fabric.rdma_devices else "each one's own RDMA device (ibdev2netdev)"
    return [f"fabric port twins: {fabric.interface} {mine} and {twin} {fabric.twin_address(fabric_ip)}, "
            f"MTU {fabric.mtu} on both; HCAs: {hcas}; {rows}"]


def pin_lines(cluster: Cluster) -> list[str]:
    """Where the pinned NCCL comes from and what identifies it (sha256, ELF build-id)."""
    config = cluster.config
    if config.nccl_library_upload:
        try:
            identity = upload_identity(config.nccl_library_upload)
        except OSError as exc:
            return [f"NCCL pin {config.nccl_library}: the site's build {config.nccl_library_upload} ({exc.strerror})"]
        return [f"NCCL pin {config.nccl_library}: the site's build {config.nccl_library_upload}, uploaded to every node",
                f"  sha256 {identity['sha256']}, build-id {identity['build_id'] or 'none'}; must report {config.nccl_version}"]
    if config.nccl_wheel:
        return [f"NCCL pin {config.nccl_library}: libnccl.so.2 of {config.nccl_wheel} {config.nccl_version} (the nodes' "
                f"platform) from {config.nccl_index},",
                "  fetched once by the head (sha256 checked against the index's), copied to every worker over the fabric;",
                f"  its sha256 and ELF build-id are recorded on every node in {NCCL_PIN_RECORD} ('status' shows them)"]
    return [f"NCCL pin {config.nccl_library}: already on every node (must report {config.nccl_version})"]


def docker_lines(plan: serving.RankPlan) -> list[str]:
    """The rank's ``docker run`` as its runner builds it (``node.docker.rank_run``; what only the node
    knows, the libnccl copies the pin goes over and the image ID, as placeholders) as shell lines:
    each option with its value on a line of its own, the image, the command's words up to its first
    flag, then each flag."""
    argv = [shlex.quote(a) for a in plan.docker_run([PIN_OVER] if plan.nccl_pin else [], CACHE_IMAGE)]
    start = argv.index("--name") + 2
    image_at = len(argv) - len(plan.command) - 1
    command = argv[image_at + 1:]
    words = next((i for i, a in enumerate(command) if a.startswith("-")), len(command))
    lines = [" ".join(argv[:start]), *_paired(argv[start:image_at]), argv[image_at]]
    lines += [" ".join(command[:words]), *_paired(command[words:])] if command else []
    return [lines[0] + " \\", *(f"    {line} \\" for line in lines[1:-1]), f"    {lines[-1]}"]


def _paired(words: list[str]) -> list[str]:
    """``--flag value`` on one line each; a flag with no value (the next word is a flag) alone."""
    lines, i = [], 0
    while i < len(words):
        takes = words[i].startswith("-") and i + 1 < len(words) and not words[i + 1].startswith("-")
        lines.append(f"{words[i]} {words[i + 1]}" if takes else words[i])
        i += 2 if takes else 1
    return lines


def _masked(name: str, value: str) -> str:
    return "<not shown>" if SECRET_NAME.search(name) and value else value


def _env_file(path: str, env: dict[str, str]) -> list[str]:
    shown = [f"      {k}={_masked(k, v)}" for k, v in sorted(env.items())]
    return [f"  {path}:", *shown]
