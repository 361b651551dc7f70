# The seeds' pair (inventory/pair.py): seed 001's GB10 pair, cabled directly, statically addressed.
cluster = "pair"
fabric_subnet = "192.168.192.0/24"
fabric_mtu = 4200

# Serving: seed 001's lane A (balanced) by default; lane B (context) and C (speed) are one setting
# away, on the same image, model and drafter: --data lane=pair-b-context, --data lane=pair-c-speed.
lane = "pair-a-balanced"
model = "Sebesky/MiniMax-M3-W4A16-GPTQ"  # W4A16 GPTQ, 224 GB
drafter = "Sebesky/MiniMax-M3-EAGLE3-RTN-INT4"  # EAGLE3 int4-RTN, 1.6 GB (lanes A and C; B runs without)
# Branches: the site's lock pins each to its commit on the first converge (python -m sparkinfra lock
# does it beforehand), and every later stage serves that commit until the lock is moved on purpose.
model_revision = "main"
drafter_revision = "main"
