"""Eight simulated nodes behind the bed's switch (``python -m sparkinfra.bed up --nodes 8``)."""

from sparkinfra.bed import sim_hosts

sim8 = sim_hosts(8)

# Refuse bad settings now, before pyinfra connects to any host.
from sparkinfra.settings import validate_inventory  # noqa: E402

validate_inventory(__file__)
