# The seeds' pair (inventory/pair.py).
cluster = "pair"
fabric_subnet = "192.168.192.0/24"
fabric_mtu = 4200
