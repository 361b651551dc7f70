"""
Eight Sparks behind a switch (seed 002's TP=8 AWQ cluster: 200G RoCE through MikroTik CRS804s):
spark-1 is the head (rank 0, serves :8000). Names, SSH addresses and users, ranks and fabric
addresses are this site's: edit them, and group_data/oct.py.
"""

oct = [
    (f"spark-{i + 1}", {"ssh_hostname": f"spark-{i + 1}.local", "ssh_user": "nvidia", "rank": i,
                        "fabric_ip": f"192.168.194.{i + 1}"})
    for i in range(8)
]
