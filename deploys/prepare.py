"""
Every node ready for multi-node vLLM: fabric port, address and MTU (persistent), the pinned NCCL
and the node's NCCL environment (with its own RoCE GID index), the head's SSH mesh to the workers
over the fabric, the GPU clock (locked when the settings say so), no stale lane container.

    pyinfra inventory/pair.py deploys/prepare.py
"""

from pyinfra import inventory

from sparkinfra import run
from sparkinfra.operations.fabric import fabric_address, fabric_link, fabric_persisted
from sparkinfra.operations.files import text_block
from sparkinfra.operations.gpu import gpu_clocks_locked
from sparkinfra.operations.lane import stale_container_absent
from sparkinfra.operations.mesh import (
    MESH_CONFIG,
    MESH_CONFIG_MARKER,
    MESH_KEY,
    MESH_KNOWN_HOSTS,
    known_hosts,
    mesh_config,
    ssh_key_authorized,
    ssh_key_present,
)
from sparkinfra.operations.nccl import (
    NCCL_ENV_FILE,
    nccl_environment,
    nccl_pinned,
    nccl_variables,
)

here = run.start()  # once per run: settings checked, SSH tuned, the converge lock held
cluster = here.cluster
node = here.node
fabric = cluster.fabric
config = cluster.config
address = f"{node.fabric_ip}/{fabric.subnet.prefixlen}"

fabric_link(
    name=f"Fabric port {fabric.interface} is up with MTU {fabric.mtu}",
    interface=fabric.interface,
    mtu=fabric.mtu,
    up=True,
)
fabric_address(
    name=f"Fabric address {address} is on {fabric.interface}",
    interface=fabric.interface,
    address=address,
    present=True,
)
fabric_persisted(
    name=f"Fabric address and MTU of {fabric.interface} "
    + ("come back at boot" if config.fabric_persist else "are not in sparkinfra's boot config"),
    interface=fabric.interface,
    address=address,
    mtu=fabric.mtu,
    present=config.fabric_persist,
)

nccl_pinned(
    name=f"NCCL {config.nccl_version} is pinned at {config.nccl_library}",
    path=config.nccl_library,
    version=config.nccl_version,
    upload=config.nccl_library_upload,
)
nccl_environment(
    name=f"NCCL environment of this node is in {NCCL_ENV_FILE}",
    path=NCCL_ENV_FILE,
    variables=nccl_variables(cluster),
    overrides=config.nccl_env_overrides,
    rdma_devices=list(fabric.rdma_devices),
    rdma_port=fabric.rdma_port,
    fabric_ip=str(node.fabric_ip),
    interface=fabric.interface,
)

# The head reaches every worker over the fabric, as that worker's user, with its own key.
head = inventory.get_host(cluster.head.name)
if here.is_head:
    ssh_key_present(
        name=f"Fabric SSH key of the head is at {MESH_KEY}",
        path=MESH_KEY,
        comment=f"sparkinfra-fabric@{cluster.name}",
    )
else:
    ssh_key_authorized(
        name=f"Head's fabric key is authorized for {node.ssh_user} from {cluster.head.fabric_ip}",
        user=node.ssh_user,
        key_host=head,
        key_path=f"{MESH_KEY}.pub",
        from_ip=str(cluster.head.fabric_ip),
    )
if here.is_head and cluster.workers:
    known_hosts(
        name=f"Head knows the workers' host keys in {MESH_KNOWN_HOSTS}",
        path=MESH_KNOWN_HOSTS,
        workers=[(inventory.get_host(w.name), str(w.fabric_ip)) for w in cluster.workers],
    )
    text_block(
        name="Head's SSH config maps each worker's fabric IP to its user",
        path=MESH_CONFIG,
        content=mesh_config(cluster),
        marker=MESH_CONFIG_MARKER,
    )

gpu_clocks_locked(
    name=f"GPU clock is locked to {config.gpu_clock_cap} MHz" if config.gpu_clock_cap else "GPU clock is the driver's",
    clocks=config.gpu_clock_cap,
    present=bool(config.gpu_clock_cap),
)

stale_container_absent(
    name=f"No stale {config.container_name} container is left by an aborted launch",
    container=config.container_name,
)
