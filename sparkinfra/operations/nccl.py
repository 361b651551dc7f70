"""
NCCL on a node: the pinned library and the node's NCCL environment (its own RoCE GID index).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import (
    StringCommand,
    operation,
)
from pyinfra.facts.files import File

from ..facts.fabric import RoceGidTable, roce_v2_index
from ..facts.nccl import NcclVersion
from ..facts.reading import gathered
from ..settings import Cluster
from .files import file_content, preparing, refuse, render

NCCL_ENV_FILE = "/etc/sparkinfra/nccl.env"


def nccl_variables(cluster: Cluster) -> dict[str, str]:
    """
    Every variable of a node's NCCL env file but ``NCCL_IB_GID_INDEX`` (read per node when the
    file is written) and before ``nccl_env_overrides`` (applied last).
    """
    config = cluster.config
    iface = cluster.fabric.interface
    env = dict(config.nccl_env)
    env.update(
        {
            "NCCL_IB_HCA": ",".join(cluster.fabric.rdma_devices),
            "NCCL_SOCKET_IFNAME": iface,
            "GLOO_SOCKET_IFNAME": iface,
            "UCX_NET_DEVICES": iface,
            # The pin: vLLM loads this NCCL, and LD_PRELOAD makes every other user load it too.
            "VLLM_NCCL_SO_PATH": config.nccl_library,
            "LD_PRELOAD": config.nccl_library,
        }
    )
    return env


def nccl_env(variables: dict[str, str], overrides: dict[str, str | None], gid_index: str) -> dict[str, str]:
    """A node's NCCL env file's variables: ``variables`` (``nccl_variables``), its GID index, then
    ``overrides`` (a ``None`` value removes the variable)."""
    env = dict(variables)
    env["NCCL_IB_GID_INDEX"] = gid_index
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _table(rows: list[dict] | None) -> str:
    if rows is None:
        return "no table"
    return "; ".join(f"{r['index']}: {r['gid']} {r['type']} {r['ndev']}" for r in rows) or "no populated rows"


@operation()
def nccl_environment(
    path: str,
    variables: dict[str, str],
    overrides: dict[str, str | None],
    rdma_devices: list[str],
    rdma_port: int,
    fabric_ip: str,
    interface: str,
):
    """
    Ensure the node's NCCL env file (root, 0600) holds ``variables`` plus this node's RoCE
    GID index, read from each HCA's GID table now (it differs per node). NCCL takes one
    ``NCCL_IB_GID_INDEX`` for every HCA it uses: HCAs whose rows differ are refused, both tables shown.

    + path: the env file (``EnvironmentFile=`` of the lane units)
    + variables: everything but the GID index, decided by the caller
    + overrides: applied last; a ``None`` value removes the variable
    + rdma_devices, rdma_port: the HCAs NCCL uses (``NCCL_IB_HCA``) and their port
    + fabric_ip, interface: the RoCE v2 row that carries this IPv4 on this netdev is the one
    """
    tables = {device: gathered(host, RoceGidTable, device=device, port=rdma_port) for device in rdma_devices}
    indexes = {device: roce_v2_index(rows or [], fabric_ip, interface) for device, rows in tables.items()}
    missing = [device for device, index in indexes.items() if index is None]
    if missing:
        if preparing():
            # The fabric address may only be set by an earlier operation of this run.
            yield StringCommand("echo", f"GID index of {fabric_ip} is read once the address is set")
            return
        device = missing[0]
        yield from refuse(
            f"{host.name}: {device} port {rdma_port} has no RoCE v2 GID for {fabric_ip} "
            f"on {interface}; the table holds: {_table(tables[device])}"
        )
        return
    if len(set(indexes.values())) > 1:
        yield from refuse(
            f"{host.name}: the RoCE v2 GID of {fabric_ip} is at different rows on the HCAs NCCL uses "
            f"(one NCCL_IB_GID_INDEX serves them all): "
            + " | ".join(f"{device} row {indexes[device]}: {_table(tables[device])}" for device in rdma_devices)
        )
        return
    env = nccl_env(variables, overrides, str(indexes[rdma_devices[0]]))
    yield from file_content._inner(
        path=path, mode="600", content=render("etc/sparkinfra/nccl.env.j2", variables=sorted(env.items())),
    )


@operation()
def nccl_pinned(path: str, version: str, upload: str = ""):
    """
    Ensure the pinned libnccl is on the node and reports the wanted version.

    + path: the library on the node (``VLLM_NCCL_SO_PATH``/``LD_PRELOAD`` point at it)
    + version: what ``ncclGetVersion`` must report, ``2.30.7``
    + upload: a controller file to place at ``path`` first; empty: it must already be there
    """
    uploaded = False
    if upload:
        for command in file_content._inner(path=path, src=upload, mode="644"):
            uploaded = True
            yield command
    elif not gathered(host, File, path=path):
        yield from refuse(f"{host.name}: pinned NCCL {path} is missing (set nccl_library_upload?)")
        return
    if preparing():
        return
    # After an upload above, read afresh (gathered() is for reads before an operation yields).
    found = host.get_fact(NcclVersion, path=path) if uploaded else gathered(host, NcclVersion, path=path)
    if found != version:
        yield from refuse(f"{host.name}: {path} reports NCCL {found}, settings want {version}")
        return
    host.noop(f"{path} reports NCCL {found}")
