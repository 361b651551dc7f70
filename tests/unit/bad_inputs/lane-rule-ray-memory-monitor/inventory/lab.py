"""Bad-input corpus: two nodes on 127.0.0.1 port 1 (nothing listens there)."""

lab = [
    ("n0", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "rank": 0, "fabric_ip": "10.0.0.1"}),
    ("n1", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "rank": 1, "fabric_ip": "10.0.0.2"}),
]

# Refuse bad settings now, before pyinfra connects to any host.
from sparkinfra.run import validate_inventory  # noqa: E402

validate_inventory(__file__)
