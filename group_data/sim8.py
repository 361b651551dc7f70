# The test bed's eight nodes (inventory/sim8.py), behind a switch; bed addresses only.
cluster = "sim8"
fabric_subnet = "10.213.1.0/24"
fabric_mtu = 4200
nccl_library_upload = "/var/lib/sparkinfra-bed/controller/nccl/2.30.7/libnccl.so.2"
preflight_free_gb = 1
image = "sparkbed/stage:1"
image_build = "tar -C /var/lib/sparkbed/image-rootfs -c . | docker import -c 'ENV PYTHONPATH=/opt/hf' - sparkbed/stage:1"
model = "sparkbed/tiny-llama"
model_revision = "7161ee11a3a0de1ce0000000000000000000c0de"
# The head downloads the tiny model from the bed's hub (token in the bed's controller environment).
hf_endpoint = "http://10.213.0.1:8731"
hf_token_env = "SPARKBED_HF_TOKEN"
# Serving stays on the pair (2 cores): no lane here.
