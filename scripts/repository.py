"""Rule `repository`: the Triton model repository (config.pbtxt + version 1/)."""

from deploybench import jobs

smk = snakemake  # noqa: F821 - injected by Snakemake's script directive
jobs.setup_logging(smk.log[0])
jobs.repository(
    model=smk.params.model,
    model_name=smk.params.model_name,
    serving=smk.params.serving,
    triton=smk.params.triton,
    device=smk.params.device,
    artifact=smk.input.artifact,
    artifact_name=smk.params.artifact_name,
    artifact_provenance=smk.input.provenance,
    signature=smk.input.signature[0] if smk.input.signature else None,
    out=smk.output.repository,
)
