"""
Helpers for unit tests: a ``Cluster`` built the way a run builds it, from a pyinfra inventory
(``inventory/<name>.py`` + ``group_data/<name>.py`` in a temporary project) through
``sparkinfra.settings.load_settings``. No host is contacted.
"""

from __future__ import annotations

import itertools
from contextlib import chdir
from pathlib import Path

from pyinfra.api import Config, State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory_from_files

from sparkinfra.run import checked_settings, load_files
from sparkinfra.settings import Cluster

# The revisions the lane tests' clusters pin (conftest's cluster_of).
MODEL_REVISION = "9f2c4e6a8b0d1f3e5a7c9e1b3d5f7a9c1e3b5d7f"
DRAFTER_REVISION = "1a2b3c4d5e6f708192a3b4c5d6e7f80912a3b4c5"
SIM_REVISION = "3b1d6a41c4e0d2f5a7b9c1e3f5a7b9d1c3e5f7a9"

# The seeds' pair: head bluey (rank 0), worker reddie (rank 1), cabled directly.
PAIR_HOSTS = [
    ("bluey", {"ssh_hostname": "bluey.local", "ssh_user": "nvidia", "rank": 0, "fabric_ip": "192.168.192.1"}),
    ("reddie", {"ssh_hostname": "reddie.local", "ssh_user": "reddie", "rank": 1, "fabric_ip": "192.168.192.2"}),
]
PAIR_GROUP = {"cluster": "pair", "fabric_subnet": "192.168.192.0/24", "fabric_mtu": 4200}

_counter = itertools.count()


def load_cluster(root: Path, group: dict | None = None, hosts: list | None = None, name: str = "pair") -> Cluster:
    """
    Write ``inventory/<name>.py`` and ``group_data/<name>.py`` under a fresh folder of ``root``
    and load the one cluster they define, as pyinfra's CLI would build the inventory.
    """
    project = root / f"project{next(_counter)}"  # pyinfra caches compiled files by path
    (project / "inventory").mkdir(parents=True)
    (project / "group_data").mkdir()
    (project / "inventory" / f"{name}.py").write_text(f"{name} = {hosts or PAIR_HOSTS!r}\n", encoding="utf-8")
    data = {**PAIR_GROUP, **(group or {})}
    (project / "group_data" / f"{name}.py").write_text(
        "".join(f"{key} = {value!r}\n" for key, value in data.items()), encoding="utf-8"
    )
    with ctx_state.use(State()):
        inventory = make_inventory_from_files(str(project / "inventory" / f"{name}.py"), {}, str(project))
        settings = checked_settings(inventory, inventory_file=f"inventory/{name}.py", cwd=str(project))
    (cluster,) = settings.clusters.values()
    return cluster


def load_inventory(inventory_file: str, run_limit: list[str] | None = None):
    """
    One of the project's inventories (``inventory/sim_pairs.py``: two pairs) as pyinfra's CLI
    loads it, with its settings and a run's state narrowed to ``run_limit`` (``--limit``).
    """
    repo = Path(__file__).resolve().parents[2]
    with chdir(repo), ctx_state.use(State()):  # the inventory file checks itself in its project
        inventory, settings = load_files(inventory_file)
    limit = [inventory.get_host(name) for name in run_limit] if run_limit is not None else None
    return State(inventory, Config(), initial_limit=limit), settings
