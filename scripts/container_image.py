"""Rule `container_image`: `apptainer build` of a definition in envs/, and its digest record."""

from deploybench import images, jobs

smk = snakemake  # noqa: F821 - injected by Snakemake's script directive
jobs.setup_logging(smk.log[0])
images.build(
    name=smk.params.name,
    image=smk.params.image,
    out=smk.output.image,
    record_out=smk.output.record,
    log_file=smk.log[0],
)
