"""
The first two of the eight simulated nodes (``inventory/sim8.py``'s shape and settings): the pair
``benchmarks/converge.py`` compares the eight with, on the same bed.
"""

from sparkbed.controller import sim_hosts

sim8 = sim_hosts(2, shape="site2")
bed = [name for name, _ in sim8]  # group_data/bed.py: what every bed cluster shares
