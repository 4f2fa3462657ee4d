"""Rule `plots`: the charts of one run (jobs.plots)."""

from deploybench.jobs import run_rule

run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive
