# Offline: static batching, each batch size at concurrency 1 (gRPC, system shared memory).
# Online: dynamic batching over the concurrency sweep (HTTP). One definition over `{scenario}`,
# one rule per scenario (so each is its own target and its own params trigger). One server per
# job; measurement jobs take every core so that nothing else runs beside a measurement.


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
    container:
        container_of("triton")
    threads: workflow.cores
    resources:
        # a whole GPU of its own: SLURM never hands an allocated GPU to a second job
        **gpu_resources(),
        triton_server=1,
        runtime=lambda w: plan_of(w).runtime[w.scenario],
    params:
        spec=lambda w: plan_of(w).spec(w.scenario),
    script:
        "../scripts/perf.py"


use rule offline as online with:
    wildcard_constraints:
        scenario="online",
