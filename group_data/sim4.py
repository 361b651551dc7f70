# The test bed's 4 nodes (inventory/sim4.py), behind a switch; the rest is in group_data/bed.py.
# Serving stays on the pair (2 cores): no lane here.
cluster = "sim4"
