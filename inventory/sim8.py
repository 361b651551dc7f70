"""
Eight simulated nodes behind the bed's switch, named as another site names its Sparks (fabric port
``enP2p1s0f1np1``, HCAs ``mlx5_0``/``mlx5_1``, users ``ubuntu``/``dgxN``):
``python -m sparkbed up --nodes 8 --shape site2``.
"""

from sparkbed.controller import sim_hosts

sim8 = sim_hosts(8, shape="site2")
bed = [name for name, _ in sim8]  # group_data/bed.py: what every bed cluster shares
