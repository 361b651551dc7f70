"""
NCCL on a node: the pinned library and the node's NCCL environment (its own RoCE GID index).
"""

from __future__ import annotations

import json
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import (
    QuoteString,
    StringCommand,
    operation,
)

from .. import roce, scripts
from ..facts.fabric import RdmaNetdevs, RoceGidTable
from ..facts.nccl import NcclPin, NcclVersion
from ..facts.reading import gathered, gathered_each
from ..node import nccl_identity
from ..node.paths import NCCL_PIN_RECORD, program
from ..progress import shown
from ..settings import Cluster, Fabric
from .files import file_content, preparing, refuse, render
from .node import programs_present


def nccl_variables(cluster: Cluster) -> dict[str, str]:
    """
    Every variable of a node's NCCL env file but those read on the node when the file is written
    (``NCCL_IB_GID_INDEX``; ``NCCL_IB_HCA`` where ``rdma_devices`` is left to the node) and before
    ``nccl_env_overrides`` (applied last).
    """
    config = cluster.config
    iface = cluster.fabric.interface
    env = dict(config.nccl_env)
    env.update(
        {
            "NCCL_SOCKET_IFNAME": iface,
            "GLOO_SOCKET_IFNAME": iface,
            "UCX_NET_DEVICES": iface,
            # The pin: vLLM loads this NCCL, and LD_PRELOAD makes every other user load it too.
            "VLLM_NCCL_SO_PATH": config.nccl_library,
            "LD_PRELOAD": config.nccl_library,
        }
    )
    if cluster.fabric.rdma_devices:
        env["NCCL_IB_HCA"] = ",".join(cluster.fabric.rdma_devices)
    return env


def nccl_env(variables: dict[str, str], overrides: dict[str, str | None], hcas: list[str], gid_index: str) -> dict[str, str]:
    """A node's NCCL env file's variables: ``variables`` (``nccl_variables``), its HCAs and GID index
    ("": left to NCCL, which picks per HCA), then ``overrides`` (a ``None`` value removes the variable)."""
    env = dict(variables)
    env["NCCL_IB_HCA"] = ",".join(hcas)
    if gid_index:
        env["NCCL_IB_GID_INDEX"] = gid_index
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def node_port(fabric: Fabric) -> roce.Port:
    """This host's fabric port (its twin, its HCAs), read from the node now."""
    return roce.port_of(fabric, gathered(host, RdmaNetdevs))


@operation()
def nccl_environment(
    path: str,
    variables: dict[str, str],
    overrides: dict[str, str | None],
    port: roce.Port,
    rdma_port: int,
    fabric_ip: str,
    nccl_version: str,
):
    """
    Ensure the node's NCCL env file (root, 0600) holds ``variables`` plus this node's HCAs (both
    twins of the fabric port unless ``rdma_devices`` names them) and RoCE GID index, read from
    each HCA's own GID table now (it differs per node): one index where the HCAs' IPv4 RoCE v2 rows
    agree, else none (NCCL takes each HCA's own row; said, with what would make them agree).

    + path: the env file (``EnvironmentFile=`` of the lane units)
    + variables: everything but the per-node values, decided by the caller (``nccl_variables``)
    + overrides: applied last; a ``None`` value removes the variable
    + port: this node's fabric port, its twin and HCAs (``node_port``)
    + rdma_port: the HCAs' port
    + fabric_ip: this node's fabric address (the fabric HCA's row carries it)
    + nccl_version: the pin's version (a per-HCA choice needs NCCL 2.21 or later)
    """
    if port.problems:
        yield from refuse(f"{host.name}: {'; '.join(port.problems)}")
        return
    tables = {device: gathered(host, RoceGidTable, device=device, port=rdma_port) for device in port.devices}
    choice = roce.gid_choice(port, tables, fabric_ip, nccl_version)
    if choice.problems:
        if preparing():
            # The fabric and twin addresses may only be set by an earlier operation of this run.
            yield StringCommand("echo", "GID rows are read once the port's addresses are set")
            return
        yield from refuse(f"{host.name}: {'; '.join(choice.problems)}")
        return
    if choice.note and not preparing():
        logger.warning(f"{host.name}: {choice.note}")
    env = nccl_env(variables, overrides, port.devices, choice.index)
    yield from file_content._inner(
        path=path, mode="600", content=render("etc/sparkinfra/nccl.env.j2", variables=sorted(env.items())),
    )


def fetched_from(record: dict | None, project: str, version: str) -> bool:
    """Whether ``record`` (a pin's identity record) says the pin is this project's wheel at this
    version (from whichever index: a mirror serves the same wheel, and the fetch checks its sha256)."""
    source = (record or {}).get("source") or {}
    return (record or {}).get("version") == version and source.get("project") == project


@operation()
def nccl_fetched(path: str, index: str, project: str, version: str, wheel_sha256: str = "",
                 record: str = NCCL_PIN_RECORD):
    """
    Ensure the head holds the pin: ``libnccl.so.2`` from the wheel of ``project`` at ``version``
    for this node's platform, fetched once from ``index`` (``node/nccl_fetch.py``: its sha256
    checked against the index's), with its identity record (sha256, ELF build-id, source).

    + path: the library (``nccl_library``)
    + index: the package index, PEP 503 (``https://pypi.org/simple``)
    + project, version: the wheel (``nvidia-nccl-cu13``, ``2.30.7``)
    + wheel_sha256: the wheel the site's lock pins (``sparkinfra.lock``'s ``nccl``); empty: the index's
    + record: where its identity is recorded
    """
    pin = gathered(host, NcclPin, path=path, record=record)
    wheel = ((pin["record"] or {}).get("source") or {}).get("wheel_sha256")
    if pin["sha256"] and pin["sha256"] == (pin["record"] or {}).get("sha256") and fetched_from(
            pin["record"], project, version) and (not wheel_sha256 or wheel == wheel_sha256):
        host.noop(f"{path} is {project} {version} (sha256 {pin['sha256'][:12]})")
        return
    yield from programs_present._inner()
    yield shown(StringCommand(
        *program("nccl_fetch"), "--index", QuoteString(index), "--project", QuoteString(project),
        "--version", QuoteString(version), "--machine", '"$(uname -m)"', "--dest", QuoteString(path),
        "--record", QuoteString(record), *(("--wheel-sha256", wheel_sha256) if wheel_sha256 else ()),
    ))


@operation()
def nccl_shared(path: str, workers: list, record: str = NCCL_PIN_RECORD):
    """
    Ensure every worker holds the head's pin, byte for byte (sha256), with its record: copied by
    the head over the fabric SSH mesh (``scripts/nccl_share.sh``) to the workers whose copy differs.

    + path: the library (``nccl_library``)
    + workers: ``(pyinfra host, fabric IP)`` of each worker
    """
    mine = gathered(host, NcclPin, path=path, record=record)
    theirs = gathered_each([w for w, _ in workers], NcclPin, path=path, record=record)
    behind = [ip for (_, ip), pin in zip(workers, theirs)
              if not mine["sha256"] or pin["sha256"] != mine["sha256"] or pin["record"] != mine["record"]]
    if not behind:
        host.noop(f"every worker holds {path} (sha256 {(mine['sha256'] or '')[:12]})")
        return
    yield shown(scripts.command("nccl_share.sh", path, record, *behind))


@operation()
def nccl_pinned(path: str, version: str, upload: str = "", head=None, record: str = NCCL_PIN_RECORD):
    """
    Ensure the pinned libnccl is on the node, reports the wanted version and is the same build
    as the head's (sha256; its identity recorded beside it).

    + path: the library on the node (``VLLM_NCCL_SO_PATH``/``LD_PRELOAD`` point at it)
    + version: what ``ncclGetVersion`` must report, ``2.30.7``
    + upload: the site's own build, a controller file placed at ``path`` first (its record made
      from it); empty: it is there already (fetched, shared, or the site's)
    + head: the cluster's head (pyinfra host): this node's copy must be its byte for byte
    """
    changed = False
    if upload:
        for command in file_content._inner(path=path, src=upload, mode="644"):
            changed = True
            yield command
        identity = upload_identity(upload)
        for command in file_content._inner(path=record, content=json.dumps(identity, indent=2, sort_keys=True) + "\n"):
            changed = True
            yield command
    pin = gathered(host, NcclPin, path=path, record=record)
    if not pin["sha256"] and not changed:
        if preparing() and not upload:
            return  # fetched by the head or copied from it by earlier operations of this run
        yield from refuse(f"{host.name}: pinned NCCL {path} is missing (nccl_wheel or nccl_library_upload?)")
        return
    if preparing():
        return
    # After an upload above, read afresh (gathered() is for reads before an operation yields).
    found = host.get_fact(NcclVersion, path=path) if changed else gathered(host, NcclVersion, path=path)
    if found != version:
        yield from refuse(f"{host.name}: {path} reports NCCL {found}, settings want {version}")
        return
    if head is not None and head is not host:
        ours = host.get_fact(NcclPin, path=path, record=record) if changed else pin
        heads = gathered(head, NcclPin, path=path, record=record)
        if ours["sha256"] != heads["sha256"]:
            yield from refuse(f"{host.name}: {path} is NCCL {found} but another build than {head.name}'s "
                              f"(sha256 {(ours['sha256'] or '-')[:12]} here, {(heads['sha256'] or '-')[:12]} there)")
            return
    host.noop(f"{path} reports NCCL {found}, sha256 {(pin['sha256'] or '')[:12]}")


def upload_identity(upload: str) -> dict:
    """The identity record of a site's own build, a controller file (computed once per file state)."""
    stat = Path(upload).stat()
    key = (upload, stat.st_size, stat.st_mtime_ns)
    if key not in _UPLOADED:
        _UPLOADED[key] = {
            "version": None, "sha256": nccl_identity.sha256(upload), "build_id": nccl_identity.build_id(upload),
            "source": {"upload": upload},
        }
    return _UPLOADED[key]


_UPLOADED: dict = {}
