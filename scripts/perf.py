"""Rules `offline` and `online`: perf_analyzer over the scenario's points (jobs.perf)."""

from deploybench.jobs import run_rule

run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive
