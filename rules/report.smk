# Plots and reports. They read finished CSVs and never rerun a measurement: changing a plot
# option reruns plots and reports only. They run where Snakemake runs, in its environment (the
# driver's venv holds Altair and vl-convert, envs/driver.txt), never in an image or on a cluster
# node: no image's lock holds them (NGC's bases do not; adding them to every image would pin a
# second Vega-Lite per image), they need no GPU, and a chart is seconds of one core.


localrules:
    plots,
    model_report,


rule plots:
    input:
        offline=f"{RUN_DIR}/offline.csv",
        online=f"{RUN_DIR}/online.csv",
        published=PUBLISHED,
    output:
        svg=[
            report(
                path,
                caption="../report/plot.rst",
                category="{model}",
                subcategory="{gpu}/{format}/{precision}",
            )
            for path in plot_files("svg")
        ],
        png=plot_files("png"),
        html=plot_files("html"),
    log:
        f"{LOG_DIR}/plots.log",
    container:
        snakemakes_own
    params:
        spec=plots_spec,
    script:
        "../scripts/plots.py"


rule model_report:
    input:
        unpack(report_inputs),
        published=PUBLISHED,
    output:
        markdown=f"{REPORT_DIR}/{{model}}.md",
        html=report(
            f"{REPORT_DIR}/{{model}}.html",
            caption="../report/model.rst",
            category="Reports",
        ),
        comparison=comparison_files(),
    log:
        "logs/reports/{report_set}/{model}.log",
    container:
        snakemakes_own
    params:
        spec=report_spec,
    script:
        "../scripts/report.py"


# Every configured report set: `snakemake report` (after the runs, it only plots and writes).
rule report:
    input:
        all_reports(),
