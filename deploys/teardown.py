"""
Stop serving: every lane's units stopped (and not started at boot) on every node, their containers
removed, and what each lane left (units, plans, env files, the head's API-key file, validation marks,
mods, runtime marks, the firewall table that kept its ports to the fabric with its file and unit),
and the head's staging daemon if a dead controller left one. Images, weights, the runner, the fabric
and NCCL setup stay: a converge serves again, moving nothing. The head's restart history of each
lane stays too (``status`` tells when and why the lane last stopped); a lane switch or a full
teardown removes it.

    pyinfra inventory/pair.py deploys/teardown.py

A full teardown also removes the rest of what sparkinfra installed (``paths.FULL_TEARDOWN_*``): the
node programs (the runner among them); the lanes' folders; the NCCL env file; the GPU clock lock (the driver's clocks back);
the fabric and twin addresses and their boot config (the port's MTU stays); the head's SSH mesh and its key on
the workers. It needs the cluster's name, checked before any connection. Images, model snapshots
(with their manifests), the compile caches, the pinned NCCL library and the converge lock stay:
deploys/serve.py serves again moving neither image nor weights, and starts warm.

    pyinfra inventory/pair.py deploys/teardown.py --data teardown=full --data teardown_confirm=pair
"""

from pyinfra import inventory
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from sparkinfra import run
from sparkinfra.node import paths
from sparkinfra.operations.fabric import fabric_address, fabric_persisted
from sparkinfra.operations.files import file_content, text_block
from sparkinfra.operations.firewall import fabric_only_ports
from sparkinfra.operations.gpu import gpu_clocks_locked
from sparkinfra.operations.lane import (
    container_absent,
    other_lanes_absent,
    other_lanes_stopped,
)
from sparkinfra.operations.mesh import (
    known_hosts,
    ssh_key_authorized,
    ssh_key_present,
)
from sparkinfra.operations.nccl import node_port
from sparkinfra.operations.stage import snapshot_served

here = run.start(resolve=False)  # settings checked, SSH tuned, the converge lock held; nothing resolved
cluster = here.cluster
node = here.node
config = cluster.config

other_lanes_stopped(
    name="No lane runs on this node, nor starts at boot",
    lane="",
)
container_absent(
    name=f"No {config.container_name} container is left on this node",
    container=config.container_name,
)
lane_files = other_lanes_absent(
    name="No lane's unit, plan, env file or mark is left on this node (their restart history stays)",
    lane="",
    keep_history=True,
)
systemd.daemon_reload(name="systemd has forgotten the lanes' units", _if=lane_files.did_change)
fabric_only_ports(  # no lane runs: no port of one to keep
    name="No firewall table, file or unit of sparkinfra's is on this node",
    present=False,
)
snapshot_served(  # a staging daemon a controller that died mid-transfer left
    name=f"The head serves nothing from {config.model_dir}",
    repo_dir=config.model_dir,
    head=inventory.get_host(cluster.head.name),
    present=False,
)

if config.teardown == "full":
    fabric = cluster.fabric
    address = f"{node.fabric_ip}/{fabric.subnet.prefixlen}"

    # What sparkinfra installed besides each lane's own files (those went above): the one list.
    for folder in paths.FULL_TEARDOWN_FOLDERS:
        files.directory(name=f"No {folder} is left", path=folder, present=False)
    for path in paths.FULL_TEARDOWN_FILES:
        file_content(name=f"No {path} is left", path=path, present=False)

    # The head's SSH mesh; the workers first: they find the key's line by the head's key.
    if not here.is_head:
        ssh_key_authorized(
            name=f"Head's fabric key is not authorized for {node.ssh_user}",
            user=node.ssh_user,
            key_host=inventory.get_host(cluster.head.name),
            key_path=f"{paths.MESH_KEY}.pub",
            from_ip=str(cluster.head.fabric_ip),
            present=False,
        )
    else:
        ssh_key_present(name=f"No fabric SSH key is left at {paths.MESH_KEY} on the head", path=paths.MESH_KEY, present=False)
        known_hosts(name=f"No {paths.MESH_KNOWN_HOSTS} is left on the head", path=paths.MESH_KNOWN_HOSTS, workers=[],
                    present=False)
        text_block(
            name=f"Head's {paths.MESH_CONFIG} has no fabric mesh entries",
            path=paths.MESH_CONFIG,
            marker=paths.MESH_CONFIG_MARKER,
            present=False,
        )

    clocks = gpu_clocks_locked(name="GPU clock is the driver's", present=False)

    # The fabric (the pinned library and the port's MTU stay).
    boot = fabric_persisted(
        name=f"Fabric addresses and MTU of {fabric.interface} and its twin are not in sparkinfra's boot config",
        links=[],
        mtu=fabric.mtu,
        present=False,
    )
    fabric_address(
        name=f"Fabric address {address} is not on {fabric.interface}",
        interface=fabric.interface,
        address=address,
        present=False,
    )
    twin = node_port(fabric).twin
    if twin:
        twin_address = fabric.twin_address(node.fabric_ip)
        fabric_address(
            name=f"Twin address {twin_address} is not on {twin}",
            interface=twin,
            address=twin_address,
            present=False,
        )
    systemd.daemon_reload(name="systemd has forgotten the removed units", _if=any_changed(boot, clocks))
