"""The test bed's simulated pair (``python -m sparkbed up``): spark-1 head, spark-2 worker.

Run the controller in the bed's management namespace: ``python -m sparkbed run pyinfra ...``.
"""

from sparkbed.controller import sim_hosts

sim = sim_hosts(2)
bed = [name for name, _ in sim]  # group_data/bed.py: what every bed cluster shares
