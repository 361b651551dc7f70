"""
What each deploy's operations read from one node, declared up front (``read_ahead``) so a
no-op converge reads a node in one command, not one per fact: on a shared machine (the bed) or
a busy head, each command's SSH session and sudo cost more than the read itself.

A read listed here that an operation does not make costs a few milliseconds; one an operation
makes that is not listed (its arguments changed) costs a command of its own.
``tests/e2e/test_e2e_prepare.py`` counts the commands of a no-op run, so drift shows.
"""

from __future__ import annotations

from pyinfra.facts.files import Block, Directory, File, FileContents, Sha256File
from pyinfra.facts.systemd import SystemdEnabled

from . import serving, transfer
from .facts.fabric import FabricLink, NetworkConfigBackend, RoceGidTable
from .facts.files import FileDigest, FileState
from .facts.lane import DockerContainer, LaneUnits
from .facts.mesh import AuthorizedKeys
from .facts.nccl import NcclVersion
from .facts.stage import DockerImageId, SnapshotManifest
from .operations.fabric import FABRIC_NETPLAN, FABRIC_UNIT
from .operations.mesh import (
    HOST_KEY,
    MESH_CONFIG,
    MESH_CONFIG_MARKER,
    MESH_KEY,
    MESH_KNOWN_HOSTS,
)
from .operations.nccl import NCCL_ENV_FILE
from .settings import Cluster


def prepare_reads(cluster: Cluster, name: str) -> list[tuple]:
    """The reads of ``deploys/prepare.py`` on node ``name``."""
    fabric, config = cluster.fabric, cluster.config
    reads = [
        (FabricLink, {"interface": fabric.interface}),
        (NetworkConfigBackend, {}),
        (FileState, {"path": FABRIC_NETPLAN}),
        (FileState, {"path": f"/etc/systemd/system/{FABRIC_UNIT}"}),
        (SystemdEnabled, {"services": FABRIC_UNIT}),
        (FileState if config.nccl_library_upload else File, {"path": config.nccl_library}),
        (NcclVersion, {"path": config.nccl_library}),
        (RoceGidTable, {"device": fabric.rdma_devices[0], "port": fabric.rdma_port}),
        (FileState, {"path": NCCL_ENV_FILE}),
        (DockerContainer, {"container": config.container_name}),
    ]
    if name == cluster.head.name:
        reads += [(File, {"path": MESH_KEY}), (File, {"path": f"{MESH_KEY}.pub"}),
                  (FileContents, {"path": f"{MESH_KEY}.pub"})]  # the workers read it
        if cluster.workers:
            reads += [(FileState, {"path": MESH_KNOWN_HOSTS}),
                      (Block, {"path": MESH_CONFIG, "marker": MESH_CONFIG_MARKER, "begin": None, "end": None})]
    else:
        reads += [(AuthorizedKeys, {"user": cluster.node(name).ssh_user}),
                  (FileContents, {"path": HOST_KEY})]  # the head reads it
    return reads


def stage_reads(cluster: Cluster, name: str) -> list[tuple]:
    """The reads of ``deploys/stage.py`` on node ``name``: ``stage_verify=deep`` hashes every
    file, read when its operation runs, never ahead."""
    config = cluster.config
    deep = config.stage_verify == "deep"
    reads = [(DockerImageId, {"image": config.image})]
    for repo, revision in transfer.models(cluster):
        repo_dir = transfer.repo_dir(config.model_dir, repo)
        if name == cluster.head.name:
            reads += [(SnapshotManifest, {"repo_dir": repo_dir, "deep": False}),
                      (Directory, {"path": f"{repo_dir}/snapshots/{revision}"}),
                      (FileContents, {"path": f"{repo_dir}/{transfer.MANIFEST}"})]  # the workers read it
        elif not deep:  # deep: the head reads the workers' manifests hashed afresh
            reads.append((SnapshotManifest, {"repo_dir": repo_dir, "deep": False}))
    return reads


def lane_reads(cluster: Cluster, name: str, lane: str, image: str, start: bool) -> list[tuple]:
    """The reads of ``deploys/lane.py`` on node ``name`` for lane ``lane`` (empty: none), served from
    ``image``, started on the head when ``start``. Whether it serves is read afresh, never ahead."""
    reads = [(LaneUnits, {})]
    if not lane:
        return reads
    reads += [(FileState, {"path": path}) for path in (
        serving.LANE_CTL, serving.env_path(lane), serving.plan_path(lane), f"/etc/systemd/system/{serving.unit_name(lane)}",
    )]
    if name == cluster.head.name:
        reads += [(DockerImageId, {"image": image}),
                  (FileDigest, {"path": serving.validated_path(lane)}),
                  (File, {"path": serving.secret_env_path(lane)})]
        if cluster.config.api_key_env:
            reads.append((Sha256File, {"path": serving.secret_env_path(lane)}))
        if start:
            reads.append((SystemdEnabled, {"services": serving.unit_name(lane)}))
    return reads
