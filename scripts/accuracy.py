"""Rule `accuracy`: framework vs Triton-served outputs; a miss fails the job (jobs.accuracy)."""

from deploybench.jobs import run_rule

run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive
