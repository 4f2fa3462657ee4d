"""Rules `plots` and `search_plots`: a run's charts, its search's (jobs.plots, search_plots)."""

from deploybench.jobs import run_rule

run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive
