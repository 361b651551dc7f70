# The test bed's four nodes (inventory/sim4.py), behind a switch; bed addresses only.
cluster = "sim4"
fabric_subnet = "10.213.1.0/24"
fabric_mtu = 4200
nccl_library_upload = "/var/lib/sparkinfra-bed/controller/nccl/2.30.7/libnccl.so.2"
preflight_free_gb = 1
