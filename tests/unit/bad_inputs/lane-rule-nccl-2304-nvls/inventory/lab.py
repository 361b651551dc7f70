"""Bad-input corpus: eight nodes on 127.0.0.1 port 1 (nothing listens there)."""

lab = [
    ("n0", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "rank": 0, "fabric_ip": "10.0.0.1"}),
    ("n1", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "rank": 1, "fabric_ip": "10.0.0.2"}),
    ("n2", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "rank": 2, "fabric_ip": "10.0.0.3"}),
    ("n3", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "rank": 3, "fabric_ip": "10.0.0.4"}),
    ("n4", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "rank": 4, "fabric_ip": "10.0.0.5"}),
    ("n5", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "rank": 5, "fabric_ip": "10.0.0.6"}),
    ("n6", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "rank": 6, "fabric_ip": "10.0.0.7"}),
    ("n7", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "rank": 7, "fabric_ip": "10.0.0.8"}),
]
