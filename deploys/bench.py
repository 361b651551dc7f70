"""
Benchmark the cluster's serving lane, from the controller against rank 0's API (with the API key):
the seeds' probes after a warm-up, then a llama-benchy sweep with the staged snapshot's tokenizer,
offline. Results: results/<cluster>/<lane>/<timestamp>/ (results.json, results.md, PNG plots).

    pyinfra inventory/pair.py deploys/bench.py
    python -m sparkinfra bench --compare results/<cluster>/<lane>/<A> results/<cluster>/<lane>/<B>
"""

from pyinfra import host
from pyinfra.operations import python

from sparkinfra import lane_steps, run
from sparkinfra.bench.job import job_for, run_from_deploy
from sparkinfra.bench.report import run_dir
from sparkinfra.operations.lane import lane_warm

here = run.start()  # once per run: settings checked, SSH tuned, the converge lock held
cluster = here.cluster

if here.is_head:
    job = job_for(host, cluster, lane_steps.of_run(here))  # refuses a lane that is not serving its current plan

    lane_warm(
        name=f"Lane {job.meta.lane} is warm (one request per workload shape)",
        lane=job.meta.lane,
        digest=job.meta.extra["plan"],
    )
    python.call(
        name=f"Lane {job.meta.lane} is benchmarked from the controller into {run_dir(job.results_dir, job.meta)}",
        function=run_from_deploy,
        job=job,
    )
