# Plots and reports. They read finished CSVs and never rerun a measurement: changing a plot
# option reruns plots and reports only.


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
        container_of("framework")
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
        container_of("framework")
    params:
        spec=report_spec,
    script:
        "../scripts/report.py"


# Every configured report set: `snakemake report` (after the runs, it only plots and writes).
rule report:
    input:
        all_reports(),
