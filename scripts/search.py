"""Rules `search_settings`, `search_step`, `search_choice`: the search (jobs.search_*)."""

from deploybench.jobs import run_rule

run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive
