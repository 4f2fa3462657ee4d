"""Rules `export`/`export_directory`: the checkpoint (or another export) exported and checked."""

from deploybench import jobs

smk = snakemake  # noqa: F821 - injected by Snakemake's script directive
jobs.setup_logging(smk.log[0])
jobs.export(
    model=smk.params.model,
    checkpoint=smk.input.checkpoint,
    source=smk.input.source[0] if smk.input.source else None,
    export_format=smk.wildcards.export_format,
    precision=smk.wildcards.export_precision,
    opset=smk.params.opset,
    tolerance=smk.params.tolerance,
    check_batch=smk.params.check_batch,
    out=smk.output.artifact,
    provenance_out=smk.output.provenance,
)
