"""
Bracket the lane's memory knob: the highest value that boots with a KV pool of the lane's
max_model_len, found in a few starts that jump by the GiB vLLM reports (not blind halving).
Prints a per-cluster setting with its evidence lines (also in results/<cluster>/<lane>/tune-<time>/).
The lane is placed but not started first; if it was serving, it serves again afterwards.

    pyinfra inventory/pair.py deploys/tune.py                      # gpu_memory_utilization, from the lane's
    pyinfra inventory/sim.py deploys/tune.py --data tune_knob=VLLM_CPU_KVCACHE_SPACE --data tune_max=2
"""

from pyinfra import host
from pyinfra.operations import python

from sparkinfra import lane_steps, run, tune

here = run.start()  # once per run: settings checked, SSH tuned, the converge lock held
lane_steps.placed(here, to_serve=False)  # plans, env files, units; validated; the trials start it (a rejected plan too)

if here.is_head:
    job = tune.job_for(host, here.cluster, lane_steps.of_run(here))
    python.call(
        name=f"{job.knob.name} of lane {job.lane} is bracketed from {job.knob.format(job.start)} "
        f"(KV pool >= {job.required_tokens:,} tokens)",
        function=tune.run_from_deploy,
        job=job,
    )
