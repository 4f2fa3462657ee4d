"""Rule `model_report`: one model's page (Markdown and HTML) over a report set's runs."""

from deploybench import jobs

smk = snakemake  # noqa: F821 - injected by Snakemake's script directive
jobs.setup_logging(smk.log[0])
jobs.report(
    model=smk.wildcards.model,
    runs=smk.params.runs,
    published=smk.input.published,
    config=smk.config,
    options=smk.params.options,
    markdown_out=smk.output.markdown,
    html_out=smk.output.html,
    comparison_stems=smk.params.stems,
)
