# The test bed's four nodes (inventory/sim4.py), behind a switch; bed addresses only.
cluster = "sim4"
fabric_subnet = "10.213.1.0/24"
fabric_mtu = 4200
