"""
Settings: every key the deploys read, validated before any host is touched.

- ``rules``: what a value must look like where it goes (``*_problem``, in words)
- ``model``: ``HostSettings`` (one Field a key), ``Cluster``, ``Node``, ``Fabric``, ``Settings``
- ``loader``: ``load_settings`` from a pyinfra inventory, its errors naming file, key and host
- ``docs``: ``docs/settings.md`` from the model (``python -m sparkinfra.settings --docs``)
"""

from .loader import (
    SAID,
    SettingsError,
    display,
    in_words,
    load_settings,
    nearest,
    unknown_key,
)
from .model import (
    CLUSTER_KEYS,
    DEFAULT_NCCL_ENV,
    NODE_KEYS,
    SERVE_KEYS,
    WHY,
    Cluster,
    Fabric,
    HostSettings,
    Node,
    Settings,
    serve_settings,
)
from .rules import (
    ENV_NAME,
    SAFE,
    cluster_problem,
    container_problem,
    device_problem,
    env_value_problem,
    host_name_problem,
    image_problem,
    interface_problem,
    lane_problem,
    model_id_problem,
    name_problem,
    node_path_problem,
    rdma_device_problem,
    revision_problem,
    ssh_host_problem,
    ssh_user_problem,
    tarball_problem,
    twin_problem,
    url_problem,
    wheel_problem,
)

__all__ = [
    "CLUSTER_KEYS", "DEFAULT_NCCL_ENV", "ENV_NAME", "NODE_KEYS", "SAFE", "SAID", "SERVE_KEYS", "WHY", "Cluster",
    "Fabric", "HostSettings", "Node", "Settings", "SettingsError", "cluster_problem", "container_problem",
    "device_problem", "display", "env_value_problem", "host_name_problem", "image_problem", "in_words",
    "interface_problem", "lane_problem", "load_settings", "model_id_problem", "nearest", "name_problem", "node_path_problem",
    "rdma_device_problem", "revision_problem", "serve_settings", "ssh_host_problem", "ssh_user_problem",
    "tarball_problem", "twin_problem", "unknown_key", "url_problem", "wheel_problem",
]
