# Offline: static batching, each batch size at concurrency 1 (gRPC, system shared memory).
# Online: dynamic batching over the concurrency sweep (HTTP). One definition over `{scenario}`,
# one rule per scenario (so each is its own target and its own params trigger). One server per
# job; measurement jobs take every core so that nothing else runs beside a measurement.
# On a GPU whose partition caps a job's time (`gpus.<gpu>.slurm.max_runtime`), a scenario is
# measured in parts (offline_part, online_part: as many points as fit the limit each) and
# merged into the same files by merge_parts (deploybench/planning/schedule.py).


rule offline:
    input:
        repository=repository_of,
        image=image_input("triton"),
        preflight=preflight_input("triton"),
    output:
        csv=f"{RUN_DIR}/{{scenario}}.csv",
        # one row per trial (the CSV above: one per point, the trials' mean and interval)
        trials=f"{RUN_DIR}/{{scenario}}.trials.csv",
        provenance=f"{RUN_DIR}/{{scenario}}.provenance.json",
    log:
        job=f"{LOG_DIR}/{{scenario}}.log",
        server_log=f"{LOG_DIR}/{{scenario}}.server.log",
        perf_log=f"{LOG_DIR}/{{scenario}}.perf_analyzer.log",
    wildcard_constraints:
        scenario="offline",
    priority: RUN_PRIORITY["offline"]
    group:
        run_group()
    container:
        container_of("triton")
    threads: measurement_threads
    resources:
        # a whole GPU of its own: SLURM never hands an allocated GPU to a second job
        **gpu_resources(),
        triton_server=1,
        runtime=lambda w: plan_of(w).runtime[w.scenario],
        mem_mb=measurement_mem_mb,
    params:
        spec=lambda w: plan_of(w).spec(w.scenario),
    script:
        "../scripts/perf.py"


use rule offline as online with:
    wildcard_constraints:
        scenario="online",
    priority: RUN_PRIORITY["online"]


# One part of a scenario's points: the same job over fewer points.
use rule offline as offline_part with:
    output:
        csv=f"{PART_STEM}.csv",
        trials=f"{PART_STEM}.trials.csv",
        provenance=f"{PART_STEM}.provenance.json",
    log:
        job=f"{PART_LOG}.log",
        server_log=f"{PART_LOG}.server.log",
        perf_log=f"{PART_LOG}.perf_analyzer.log",
    wildcard_constraints:
        scenario="offline",
        gpu=one_of(PARTED_GPUS),
    params:
        spec=lambda w: plan_of(w).perf_spec(w.scenario, int(w.part)),


use rule offline_part as online_part with:
    wildcard_constraints:
        scenario="online",
        gpu=one_of(PARTED_GPUS),
    priority: RUN_PRIORITY["online"]


# Reads and writes small CSVs: runs where Snakemake runs (in the measurements' image). On a GPU
# measured in parts it makes the scenario's files (any other GPU: offline, online).
localrules:
    merge_parts,


ruleorder: merge_parts > offline
ruleorder: merge_parts > online


rule merge_parts:
    input:
        part_csvs=scenario_parts("csv"),
        part_trials=scenario_parts("trials.csv"),
        part_provenances=scenario_parts("provenance.json"),
    output:
        csv=f"{RUN_DIR}/{{scenario}}.csv",
        trials=f"{RUN_DIR}/{{scenario}}.trials.csv",
        provenance=f"{RUN_DIR}/{{scenario}}.provenance.json",
    log:
        f"{LOG_DIR}/{{scenario}}.merge.log",
    wildcard_constraints:
        scenario=one_of(SCENARIOS),
        gpu=one_of(PARTED_GPUS),
    container:
        container_of("triton")
    params:
        spec=lambda w: {"run": plan_of(w).path, "scenario": w.scenario},
    script:
        "../scripts/merge_parts.py"
