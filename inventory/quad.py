"""
Four Sparks behind a switch (seed 004's NVFP4 cluster; seed 002's AWQ one): spark-1 is the head
(rank 0, serves :8000). Names, SSH addresses and users, ranks and fabric addresses are this site's:
edit them, and group_data/quad.py.
"""

quad = [
    ("spark-1", {"ssh_hostname": "spark-1.local", "ssh_user": "nvidia", "rank": 0, "fabric_ip": "192.168.193.1"}),
    ("spark-2", {"ssh_hostname": "spark-2.local", "ssh_user": "nvidia", "rank": 1, "fabric_ip": "192.168.193.2"}),
    ("spark-3", {"ssh_hostname": "spark-3.local", "ssh_user": "nvidia", "rank": 2, "fabric_ip": "192.168.193.3"}),
    ("spark-4", {"ssh_hostname": "spark-4.local", "ssh_user": "nvidia", "rank": 3, "fabric_ip": "192.168.193.4"}),
]
