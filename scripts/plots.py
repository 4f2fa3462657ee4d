"""Rule `plots`: the charts of one run (SVG, PNG, interactive HTML)."""

from deploybench import jobs

smk = snakemake  # noqa: F821 - injected by Snakemake's script directive
jobs.setup_logging(smk.log[0])
jobs.plots(
    run_path=smk.params.run_path,
    offline=smk.input.offline,
    online=smk.input.online,
    published=smk.input.published,
    config=smk.config,
    options=smk.params.options,
    outputs=smk.params.stems,
)
