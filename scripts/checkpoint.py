"""Rule `prepare_checkpoint`: the model's checkpoint (jobs.make_checkpoint)."""

from deploybench.jobs import run_rule

run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive
