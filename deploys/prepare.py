"""
Every node ready for multi-node vLLM: the fabric port's two twins with their addresses and MTU
(persistent), the node's NCCL environment (both twins' HCAs, their RoCE GID rows), the head's SSH
mesh to the workers over the fabric, the pinned NCCL (fetched once by the head, the same bytes on
every node), the GPU clock (locked when the settings say so), no stale lane container.

    pyinfra inventory/pair.py deploys/prepare.py
"""

from pyinfra import inventory

from sparkinfra import run
from sparkinfra.node.paths import MESH_CONFIG, MESH_CONFIG_MARKER, MESH_KEY, MESH_KNOWN_HOSTS, NCCL_ENV_FILE
from sparkinfra.operations.fabric import fabric_address, fabric_link, fabric_persisted
from sparkinfra.operations.files import text_block
from sparkinfra.operations.gpu import gpu_clocks_locked
from sparkinfra.operations.lane import stale_container_absent
from sparkinfra.operations.mesh import (
    known_hosts,
    mesh_config,
    ssh_key_authorized,
    ssh_key_present,
)
from sparkinfra.operations.nccl import (
    nccl_environment,
    nccl_fetched,
    nccl_pinned,
    nccl_shared,
    nccl_variables,
    node_port,
)

here = run.start()  # once per run: settings checked, SSH tuned, the converge lock held
cluster = here.cluster
node = here.node
fabric = cluster.fabric
config = cluster.config
address = f"{node.fabric_ip}/{fabric.subnet.prefixlen}"
port = node_port(fabric)  # this node's twin and HCAs, read from it (ibdev2netdev's sysfs)
# The port's netdevs: the fabric interface with the fabric address, its twin with its own (never
# one of the fabric subnet); the MTU on both.
links = [(fabric.interface, address), *([(port.twin, fabric.twin_address(node.fabric_ip))] if port.twin else [])]
for netdev, netdev_address in links:
    is_twin = netdev != fabric.interface
    fabric_link(
        name=f"Fabric {'twin' if is_twin else 'port'} {netdev} is up with MTU {fabric.mtu}",
        interface=netdev,
        mtu=fabric.mtu,
        up=True,
    )
    fabric_address(
        name=f"Twin address {netdev_address} is on {netdev}, none of {fabric.subnet}" if is_twin
        else f"Fabric address {netdev_address} is on {netdev}",
        interface=netdev,
        address=netdev_address,
        apart_from=(str(fabric.subnet),) if is_twin else (),
        present=True,
    )
fabric_persisted(
    name=f"Addresses and MTU of {' and '.join(name for name, _ in links)} "
    + ("come back at boot" if config.fabric_persist else "are not in sparkinfra's boot config"),
    links=links,
    mtu=fabric.mtu,
    present=config.fabric_persist,
)
nccl_environment(
    name=f"NCCL environment of this node ({', '.join(port.devices) or 'its HCAs'}) is in {NCCL_ENV_FILE}",
    path=NCCL_ENV_FILE,
    variables=nccl_variables(cluster),
    overrides=config.nccl_env_overrides,
    port=port,
    rdma_port=fabric.rdma_port,
    fabric_ip=str(node.fabric_ip),
    nccl_version=config.nccl_version,
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

# The pin: the site's own build uploaded to every node, or the wheel's fetched once by the head and
# copied from it to every worker over the fabric; either way the same bytes on every node.
fetch = bool(config.nccl_wheel) and not config.nccl_library_upload
if here.is_head and fetch:
    nccl_fetched(
        name=f"The head holds {config.nccl_wheel} {config.nccl_version}'s libnccl.so.2 at {config.nccl_library}",
        path=config.nccl_library,
        index=config.nccl_index,
        project=config.nccl_wheel,
        version=config.nccl_version,
        wheel_sha256=cluster.pin("nccl") or "",
    )
    if cluster.workers:
        nccl_shared(
            name=f"Every worker holds the head's {config.nccl_library}",
            path=config.nccl_library,
            workers=[(inventory.get_host(w.name), str(w.fabric_ip)) for w in cluster.workers],
        )
nccl_pinned(
    name=f"NCCL {config.nccl_version} is pinned at {config.nccl_library}"
    + ("" if here.is_head or not fetch else ", the head's build"),
    path=config.nccl_library,
    version=config.nccl_version,
    upload=config.nccl_library_upload,
    head=head if fetch else None,
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
