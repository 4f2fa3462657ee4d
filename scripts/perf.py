"""Rules `offline`, `online` and `search_online`: perf_analyzer over points (jobs.perf)."""

from deploybench.jobs import run_rule

run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive
