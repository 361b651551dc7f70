from sparkbed import NCCL_INDEX_URL

# Every cluster of the test bed (group `bed` of inventory/sim*.py): addresses inside the bed's
# namespaces only. Each cluster's own group file adds its name and ports.
fabric_subnet = "10.213.1.0/24"
fabric_mtu = 4200
# The bed's ib_write_bw stand-in measures a TCP stream over the veth fabric, on 2 shared cores (a few
# Gb/s): its floor, not a Spark's.
fabric_min_gbps = 1
# The pin as on a Spark: the head fetches nvidia-nccl-cu13 2.30.7's wheel for its platform from a
# package index (the bed's hub serves one, with wheels of its stand-in libnccl.so.2) and copies it to
# every worker over the fabric.
nccl_index = NCCL_INDEX_URL
preflight_free_gb = 1
# Staging: one rsync stream per worker. Every node shares this machine's 2 cores, where a second
# stream only adds processes switching in (a 2 GiB pull: 1.61-1.67 s with one, 1.82-1.92 s with two,
# 1.86-1.93 s with eight). A Spark has 20 cores and a 200G link, which one TCP stream cannot fill:
# the default 8 there.
stage_streams = 1
# A liveness completion of the tiny model takes well under a second (a few on a loaded bed): a hung
# engine (a worker cut off from the fabric) is restarted within 40 s (looked at every 10 s, two failed
# completions of 10 s, two 5 s watches: serving.wedge_bound), not the 160 s a Spark's defaults allow.
# The fault tests derive their waits from these.
lane_liveness_interval = 10
lane_liveness_timeout = 10
# A worker cut off from rank 0 stops itself after 15 s, not a Spark's 60.
lane_head_lost_timeout = 15
# The eugr README's clock lock, as a site on Sparks that shut down under load sets it (the bed's
# nvidia-smi stand-in keeps it until reset or reboot).
gpu_clock_cap = "200,2150"

# Staging: the bed's image is built on the head from a rootfs the bed provides (no registry);
# the head downloads the tiny Llama from the bed's hub (a gated stand-in for huggingface.co in the
# management namespace; `python -m sparkbed run` gives commands its token).
image = "sparkbed/stage:1"
image_build = "tar -C /var/lib/sparkbed/image-rootfs -c . | docker import -c 'ENV PYTHONPATH=/opt/hf' - sparkbed/stage:1"
model = "sparkbed/tiny-llama"
# A branch, as a site names it: the first converge pins its commit in the cluster's lock (lock_file).
model_revision = "main"
hf_endpoint = "http://10.213.0.1:8731"
hf_token_env = "SPARKBED_HF_TOKEN"
# A changed lane's canary: the bed's two cores are shared with the unit tests beside it (eight
# pyinfra runs at a time), where a tiny model's 30 ms TTFT swings past +700 % and decode by a third.
# Only a gross slowdown is told here (a Spark's lanes keep their 10 % and 25 %): the slowed-decode
# drill (SPARKBED_STEP_DELAY=0.1) falls by 90 %.
canary_decode_tolerance = 0.6
canary_ttft_tolerance = 20.0
