# Four Sparks behind a switch (inventory/quad.py).
cluster = "quad"
fabric_subnet = "192.168.193.0/24"
# End to end (seed 004): the hosts' fabric ports here, and on the switch its L2MTU and each port's MTU
# (then `ibv_devinfo -d rocep1s0f0` reports active_mtu 4096).
fabric_mtu = 4200

# Serving: seed 004's NVFP4 lane (TP=4 without Ray). Seed 002's AWQ lane on the same four nodes is
# three settings away (its model and drafter are staged instead):
#   --data lane=quad-awq-eagle3 --data model=cyankiwi/MiniMax-M3-AWQ-INT4 --data drafter=Inferact/MiniMax-M3-EAGLE3
lane = "quad-nvfp4"
model = "lukealonso/MiniMax-M3-NVFP4"
# A branch: the site's lock pins its commit on the first converge (python -m sparkinfra lock does it
# beforehand); every later stage serves that commit until the lock is moved on purpose.
model_revision = "main"
drafter_revision = "main"
# lukealonso/MiniMax-M3-NVFP4 is ~243 GB on disk (a peer's 3-Spark recipe): the default 240 is short.
preflight_free_gb = 260
