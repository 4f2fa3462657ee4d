# deploybench: checkpoint -> export -> convert -> Triton repository -> accuracy and perf CSVs,
# keyed on {model}/{gpu}/{format}/{precision}. See README.md.

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/images.smk"
include: "rules/checkpoint.smk"
include: "rules/export.smk"
include: "rules/convert.smk"
include: "rules/repository.smk"
include: "rules/accuracy.smk"
include: "rules/perf.smk"
include: "rules/search.smk"
include: "rules/report.smk"
include: "rules/preflight.smk"


# The runs under `targets`, their charts and a report page of them (reports/targets/).
rule all:
    default_target: True
    input:
        target_results(),
        target_reports(),


# Every model in every format on the embedded CPU default, in the precisions its report shows
# (report set `cpu`: fp32; an fp16 run on the CPU is asked for by name).
rule cpu:
    input:
        report_set_results("cpu"),
