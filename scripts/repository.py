"""Rule `repository`: the Triton model repository (jobs.repository)."""

from deploybench.jobs import run_rule

run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive
