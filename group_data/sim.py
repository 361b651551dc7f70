# The test bed's pair (inventory/sim.py); addresses are inside the bed's namespaces only.
cluster = "sim"
fabric_subnet = "10.213.1.0/24"
fabric_mtu = 4200
