# The test bed's pair (inventory/sim.py); what every bed cluster shares is in group_data/bed.py.
from sparkbed import lock_path

cluster = "sim"
lock_file = str(lock_path("sim"))  # the bed's lock: the pins of this bed's upstream (sparkinfra.lock)

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

# A changed lane's canary (before it is promoted): short probes, so a slowed change is caught in
# seconds on the bed's two cores.
canary_max_tokens = 16

# GMU bracketing (deploys/tune.py): the CPU build's knob; both nodes share this machine's memory,
# so the bracket stops at 2 GiB per rank (a larger KV cache makes every trial swap).
tune_knob = "VLLM_CPU_KVCACHE_SPACE"
tune_max = 2
