# The test bed's pair (inventory/sim.py); addresses are inside the bed's namespaces only.
cluster = "sim"
fabric_subnet = "10.213.1.0/24"
fabric_mtu = 4200
# The bed's stand-in libnccl.so.2 (reports 2.30.7), placed on every node by deploys/prepare.py.
nccl_library_upload = "/var/lib/sparkinfra-bed/controller/nccl/2.30.7/libnccl.so.2"
model_dir = "/var/lib/sparkinfra/hf"
preflight_free_gb = 1
