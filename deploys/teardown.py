"""
Stop serving: every lane's units stopped (and not started at boot) on every node, their containers
removed. Images, weights, the fabric and NCCL setup stay: a converge serves again, moving nothing.

    pyinfra inventory/pair.py deploys/teardown.py
"""

from pyinfra import host, inventory, state

from sparkinfra import lock, operations, settings

lock.hold(state, inventory, settings.current())  # one converge at a time
config = settings.current().cluster_of(host.name).config

operations.other_lanes_stopped(
    name="No lane runs on this node, nor starts at boot",
    lane="",
)
operations.container_absent(
    name=f"No {config.container_name} container is left on this node",
    container=config.container_name,
)
