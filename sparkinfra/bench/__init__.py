"""
Benchmarks of a serving lane: the seeds' probe protocol, llama-benchy sweeps, and their reports.

Probes (seed 001): ``n`` requests of 256 completion tokens, temperature 0, one at a time, on a
warm engine (``warmup`` burns one request per shape first: the first request after boot pays a
~60 s JIT), JSON and code workloads, thinking set per request through ``chat_template_kwargs``;
decode tok/s = ``completion_tokens / wall``. Sweeps (seeds 002, 004): llama-benchy over prompt
size x depth x concurrency, read back from its ``--format json`` report.

``report.write_results`` files a run under ``<root>/<cluster>/<lane>/<timestamp>/``: ``results.json``
(meta + raw), ``results.md`` (the seeds' tables) and PNG plots; ``report.compare`` diffs two runs
(``python -m sparkinfra bench --compare A B``).
"""
