# Cluster pair_a of inventory/sim_pairs.py (the bed's 4 nodes as two pairs on one switch); the rest
# is in group_data/bed.py. Serving stays on the bed's pair (2 cores): no lane here.
cluster = "pair_a"
api_port = 8000
master_port = 29501
stage_port = 8730
