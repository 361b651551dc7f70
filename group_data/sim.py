# The test bed's pair (inventory/sim.py); addresses are inside the bed's namespaces only.
cluster = "sim"
fabric_subnet = "10.213.1.0/24"
fabric_mtu = 4200
# The bed's stand-in libnccl.so.2 (reports 2.30.7), placed on every node by deploys/prepare.py.
nccl_library_upload = "/var/lib/sparkinfra-bed/controller/nccl/2.30.7/libnccl.so.2"
model_dir = "/var/lib/sparkinfra/hf"
preflight_free_gb = 1

# Staging: the bed's image is built on the head from a rootfs the bed provides (no registry);
# the head downloads the sim lane's tiny Llama from the bed's hub (a gated stand-in for huggingface.co
# in the management namespace; `python -m sparkinfra.bed run` gives commands its token).
image = "sparkbed/stage:1"
image_build = "tar -C /var/lib/sparkbed/image-rootfs -c . | docker import -c 'ENV PYTHONPATH=/opt/hf' - sparkbed/stage:1"
model = "sparkbed/tiny-llama"
model_revision = "7161ee11a3a0de1ce0000000000000000000c0de"
hf_endpoint = "http://10.213.0.1:8731"
hf_token_env = "SPARKBED_HF_TOKEN"

# Serving: the bed's lane (lanes/sim.yaml), vLLM CPU TP=2 across the pair. A CPU start takes ~40 s.
lane = "sim"
api_key_env = "SPARKBED_API_KEY"  # the bed's controller environment holds a random key
lane_ready_timeout = 300

# Benchmarks (deploys/bench.py): shapes inside the tiny model's 512-token context; the project's
# README is llama-benchy's prompt corpus (no book download from the bed).
bench_probes = 2
bench_max_tokens = 64
bench_pp = [64]
bench_tg = [16]
bench_depth = [0, 128, 256]
bench_concurrency = [1, 2]
bench_runs = 2
bench_book = "README.md"
bench_coherence = False  # random weights answer nothing coherently

# GMU bracketing (deploys/tune.py): the CPU build's knob; both nodes share this machine's memory,
# so the bracket stops at 4 GiB per rank.
tune_knob = "VLLM_CPU_KVCACHE_SPACE"
tune_max = 4
