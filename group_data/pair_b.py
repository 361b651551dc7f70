# Cluster pair_b of inventory/sim_pairs.py (the bed's 4 nodes as two pairs on one switch).
cluster = "pair_b"
fabric_subnet = "10.213.1.0/24"
fabric_mtu = 4200
nccl_library_upload = "/var/lib/sparkinfra-bed/controller/nccl/2.30.7/libnccl.so.2"
preflight_free_gb = 1
api_port = 8100
master_port = 29601
stage_port = 8830
image = "sparkbed/stage:1"
image_build = "tar -C /var/lib/sparkbed/image-rootfs -c . | docker import -c 'ENV PYTHONPATH=/opt/hf' - sparkbed/stage:1"
model = "sparkbed/tiny-llama"
model_revision = "7161ee11a3a0de1ce0000000000000000000c0de"
hf_endpoint = "http://10.213.0.1:8731"
hf_token_env = "SPARKBED_HF_TOKEN"
# Serving stays on the bed's pair (2 cores): no lane here.
