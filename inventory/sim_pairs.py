"""
Two pairs in one inventory (``python -m sparkbed up --nodes 4``): clusters ``pair_a``
(spark-1 head, spark-2) and ``pair_b`` (spark-3 head, spark-4), each with its own head and ports,
converged in one run.
"""

from sparkbed.controller import sim_hosts

_nodes = sim_hosts(4)
pair_a = _nodes[:2]
pair_b = [(name, {**data, "rank": data["rank"] - 2}) for name, data in _nodes[2:]]
bed = [name for name, _ in _nodes]  # group_data/bed.py: what every bed cluster shares
