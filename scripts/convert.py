"""Rules `convert`/`convert_directory`: the export converted for one GPU (jobs.convert)."""

from deploybench.jobs import run_rule

run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive
