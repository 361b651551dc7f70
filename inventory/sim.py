"""The test bed's simulated pair (``python -m sparkinfra.bed up``): spark-1 head, spark-2 worker.

Run the controller in the bed's management namespace: ``python -m sparkinfra.bed run pyinfra ...``.
"""

from sparkinfra.bed import sim_hosts

sim = sim_hosts(2)

# Refuse bad settings now, before pyinfra connects to any host.
from sparkinfra.settings import validate_inventory  # noqa: E402

validate_inventory(__file__)
