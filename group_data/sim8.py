# The test bed's 8 nodes (inventory/sim8.py), behind a switch; the rest is in group_data/bed.py.
# Serving stays on the pair (2 cores): no lane here.
from sparkbed import lock_path
from sparkbed.layout import SHAPES

cluster = "sim8"
lock_file = str(lock_path("sim8"))  # the bed's lock: the pins of this bed's upstream (sparkinfra.lock)

# Not the seeds' names (inventory/sim8.py brings the nodes up in this shape): nothing may assume them.
# Its twin and both RDMA devices are found on each node (mlx5_3 and mlx5_1, the cable on port f1).
fabric_interface = SHAPES["site2"].fabric
