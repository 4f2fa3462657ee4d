"""Rule `accuracy`: framework vs Triton-served outputs; a miss fails the job."""

from deploybench import jobs

smk = snakemake  # noqa: F821 - injected by Snakemake's script directive
jobs.setup_logging(smk.log.job)
jobs.accuracy(
    model=smk.params.model,
    model_name=smk.params.model_name,
    checkpoint=smk.input.checkpoint,
    repo=smk.input.repository,
    settings=smk.params.accuracy,
    server_settings=smk.params.server,
    run=smk.params.run,
    out=smk.output.csv,
    task_out=smk.output.task,
    provenance_out=smk.output.provenance,
    server_log=smk.log.server,
)
