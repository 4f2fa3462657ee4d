# The serving-configuration search (deploybench/config_search.py). Each candidate ("variant") serves
# the run's one artifact from its own Triton repository and is measured online over the
# search's sweep, as the run's own online job measures; the choice reads them all. grid: every
# candidate is known when the DAG is built; quick: a walk whose steps (checkpoint search_step)
# pick the next candidates from those measured. Changing the budget reruns the choice (and the
# walk's steps), never a measurement.


use rule repository as search_repository with:
    output:
        repository=directory(f"{CANDIDATE_DIR}/repository"),
    log:
        f"{CANDIDATE_LOG}/repository.log",
    group:
        "candidate"
    resources:
        runtime=candidate_runtime("repository"),
    params:
        spec=candidate_spec("repository"),


# On SLURM each candidate's repository and measurement are one group job of their own (group
# `candidate`: connected jobs only), so a grid fans out over the GPUs. A candidate's sweep is
# measured in one job on any GPU (it must fit the partition's max_runtime: checked by the plan).
use rule offline as search_online with:
    input:
        repository=candidate_repository,
        image=image_input("triton"),
        preflight=preflight_input("triton"),
    output:
        csv=f"{CANDIDATE_DIR}/online.csv",
        trials=f"{CANDIDATE_DIR}/online.trials.csv",
        provenance=f"{CANDIDATE_DIR}/online.provenance.json",
    log:
        job=f"{CANDIDATE_LOG}/online.log",
        server_log=f"{CANDIDATE_LOG}/online.server.log",
        perf_log=f"{CANDIDATE_LOG}/online.perf_analyzer.log",
    wildcard_constraints:
        gpu=one_of(config["gpus"]),
    group:
        "candidate"
    resources:
        **gpu_resources(),
        triton_server=1,
        runtime=candidate_runtime("online"),
        mem_mb=candidate_mem_mb,
    params:
        spec=candidate_spec("online"),


# The walk's steps, the choice and its chart read small CSVs: they run where Snakemake runs.
localrules:
    search_settings,
    search_step,
    search_choice,
    search_plots,


# The search's settings as a file, an input of the walk's steps and of the choice: a job whose
# inputs wait on a checkpoint is not rerun for changed params (Snakemake does not compare them
# before its inputs are known), but is for an input another job rewrote.
rule search_settings:
    output:
        settings=SEARCH_SETTINGS,
    log:
        f"{LOG_DIR}/search/settings.log",
    container:
        container_of("framework")
    params:
        spec=search_spec,
    script:
        "../scripts/search.py"


# One step of the quick walk: the candidates measured so far in, the next ones (or done) out.
checkpoint search_step:
    input:
        settings=SEARCH_SETTINGS,
        previous=walk_previous_step,
        candidates=walk_candidates,
    output:
        state=SEARCH_STEP,
    log:
        f"{LOG_DIR}/search/step{{step}}.log",
    container:
        container_of("framework")
    params:
        spec=search_spec,
    script:
        "../scripts/search.py"


rule search_choice:
    input:
        settings=SEARCH_SETTINGS,
        candidates=searched("online.csv"),
        repositories=searched("repository"),
        walk=walk_end,
    output:
        csv=f"{RUN_DIR}/search.csv",
        points=f"{SEARCH_DIR}/points.csv",
        choice=f"{BEST_DIR}/choice.json",
        pbtxt=f"{BEST_DIR}/config.pbtxt",
        best=directory(f"{BEST_DIR}/repository"),
    log:
        f"{LOG_DIR}/search/choice.log",
    container:
        container_of("framework")
    params:
        spec=search_spec,
    script:
        "../scripts/search.py"


rule search_plots:
    input:
        points=f"{SEARCH_DIR}/points.csv",
        choice=f"{BEST_DIR}/choice.json",
    output:
        svg=report(
            f"{PARETO_STEM}.svg",
            caption="../report/search.rst",
            category="{model}",
            subcategory="{gpu}/{format}/{precision}",
        ),
        png=f"{PARETO_STEM}.png",
        html=f"{PARETO_STEM}.html",
    log:
        f"{LOG_DIR}/search/plots.log",
    container:
        snakemakes_own
    params:
        spec=search_plots_spec,
    script:
        "../scripts/plots.py"


# Every run of `search_targets` in the config: `snakemake search`.
rule search:
    input:
        search_results(config["search_targets"]),
