"""Four simulated nodes behind the bed's switch (``python -m sparkbed up --nodes 4``)."""

from sparkbed.controller import sim_hosts

sim4 = sim_hosts(4)
bed = [name for name, _ in sim4]  # group_data/bed.py: what every bed cluster shares
