"""Rule `convert`: the export converted for one GPU (TensorRT engine, TF-TRT, fp16 artifact)."""

from deploybench import jobs

smk = snakemake  # noqa: F821 - injected by Snakemake's script directive
jobs.setup_logging(smk.log[0])
jobs.convert(
    model=smk.params.model,
    converter=smk.params.converter,
    settings=smk.params.settings,
    precision=smk.wildcards.precision,
    source=smk.input.export,
    out=smk.output.artifact,
    provenance_out=smk.output.provenance,
)
