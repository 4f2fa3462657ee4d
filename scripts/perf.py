"""Rules `offline` and `online`: perf_analyzer over the scenario's points."""

from deploybench import jobs

smk = snakemake  # noqa: F821 - injected by Snakemake's script directive
jobs.setup_logging(smk.log.job)
jobs.perf(
    scenario=smk.params.scenario,
    model=smk.params.model,
    model_name=smk.params.model_name,
    repo=smk.input.repository,
    points=smk.params.points,
    measure=smk.params.measure,
    server_settings=smk.params.server,
    run=smk.params.run,
    out=smk.output.csv,
    provenance_out=smk.output.provenance,
    server_log=smk.log.server,
    perf_log=smk.log.perf,
)
