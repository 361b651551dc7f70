"""
The NCCL environment of a node: the field's variables, the fabric's devices and interfaces,
and the pin. Decided here, rendered by ``templates/etc/sparkinfra/nccl.env.j2``.
"""

from __future__ import annotations

from .settings import Cluster

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
