"""Bad-input corpus: two nodes on 127.0.0.1 port 1 (nothing listens there)."""

lab = [
]

# Refuse bad settings now, before pyinfra connects to any host.
from sparkinfra.run import validate_inventory  # noqa: E402

validate_inventory(__file__)
