"""Rule `preflight_check`: what the runs on a GPU need of an image, checked there (jobs.preflight)."""

from deploybench.jobs import run_rule

run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive
