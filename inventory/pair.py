"""The seeds' pair: head Bluey (rank 0, serves :8000), worker Reddie (rank 1), cabled directly."""

pair = [
    ("bluey", {"ssh_hostname": "bluey.local", "ssh_user": "nvidia", "rank": 0, "fabric_ip": "192.168.192.1"}),
    ("reddie", {"ssh_hostname": "reddie.local", "ssh_user": "reddie", "rank": 1, "fabric_ip": "192.168.192.2"}),
]
