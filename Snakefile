# deploybench: checkpoint -> export -> convert -> Triton repository -> accuracy and perf CSVs,
# keyed on {model}/{gpu}/{format}/{precision}. See README.md.

import gc
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")

# A DAG of thousands of jobs is millions of objects that live as long as Snakemake does: at the
# default threshold (700) the cyclic collector walks them again and again while the DAG is
# built (about a tenth of a large dry run's time, benchmarks/orchestration.py).
gc.set_threshold(50_000, 10, 10)


# The working directory's config/config.yaml where it has one (a deployed workflow's, laid out
# as snakedeploy does), else the workflow's own: Snakemake reads a relative `configfile:` from
# the working directory only (snakemake 9.27.1 workflow.py, Workflow.configfile), so a run from
# another directory would stop there.
CONFIG_FILE = Path("config/config.yaml")
if not CONFIG_FILE.is_file():
    CONFIG_FILE = Path(workflow.basedir) / CONFIG_FILE


configfile: CONFIG_FILE


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
