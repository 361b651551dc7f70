# Eight Sparks behind a switch (inventory/oct.py).
cluster = "oct"
fabric_subnet = "192.168.194.0/24"
fabric_mtu = 4200  # end to end: the hosts' fabric ports, the switch's L2MTU and port MTU

# Serving: seed 002's production lane, AWQ-INT4 at TP=8 over Ray with the EAGLE3 draft on one GPU.
lane = "oct-awq-eagle3"
model = "cyankiwi/MiniMax-M3-AWQ-INT4"
drafter = "Inferact/MiniMax-M3-EAGLE3"
# Branches: the site's lock pins each to its commit on the first converge (python -m sparkinfra lock
# does it beforehand); every later stage serves that commit until the lock is moved on purpose.
model_revision = "main"
drafter_revision = "main"
