# The test bed's 4 nodes (inventory/sim4.py), behind a switch; the rest is in group_data/bed.py.
# Serving stays on the pair (2 cores): no lane here.
from sparkbed import lock_path

cluster = "sim4"
lock_file = str(lock_path("sim4"))  # the bed's lock: the pins of this bed's upstream (sparkinfra.lock)
