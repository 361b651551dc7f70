"""Eight simulated nodes behind the bed's switch (``python -m sparkbed up --nodes 8``)."""

from sparkbed.controller import sim_hosts

sim8 = sim_hosts(8)
bed = [name for name, _ in sim8]  # group_data/bed.py: what every bed cluster shares

# Refuse bad settings now, before pyinfra connects to any host.
from sparkinfra.run import validate_inventory  # noqa: E402

validate_inventory(__file__)
