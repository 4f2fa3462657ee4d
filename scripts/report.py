"""Rule `model_report`: one model's page over a report set's runs (jobs.report)."""

from deploybench.jobs import run_rule

run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive
