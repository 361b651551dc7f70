# Cluster pair_a of inventory/sim_pairs.py (the bed's 4 nodes as two pairs on one switch); the rest
# is in group_data/bed.py. Serving stays on the bed's pair (2 cores): no lane here.
from sparkbed import lock_path

cluster = "pair_a"
lock_file = str(lock_path("pair_a"))  # the bed's lock: the pins of this bed's upstream (sparkinfra.lock)
api_port = 8000
master_port = 29501
stage_port = 8730
