"""Rules `export`/`export_directory`: the checkpoint (or another export) exported (jobs.export)."""

from deploybench.jobs import run_rule

run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive
