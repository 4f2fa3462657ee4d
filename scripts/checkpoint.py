"""Rule `checkpoint`: the model's checkpoint (configured DLE checkpoint or seeded init)."""

from deploybench import jobs

smk = snakemake  # noqa: F821 - injected by Snakemake's script directive
jobs.setup_logging(smk.log[0])
jobs.make_checkpoint(
    model=smk.params.model, out=smk.output.checkpoint, provenance_out=smk.output.provenance
)
