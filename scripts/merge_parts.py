"""Rule `merge_parts`: a scenario measured in parts, merged into its CSVs (jobs.merge_parts)."""

from deploybench.jobs import run_rule

run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive
