# Offline: static batching, each batch size at concurrency 1 (gRPC, system shared memory).
# Online: dynamic batching over the concurrency sweep (HTTP). One server per job; measurement
# jobs take every core so that nothing else runs beside a measurement.


rule offline:
    input:
        repository=repository_of,
        image=image_input("triton"),
    output:
        csv=f"{RUN_DIR}/offline.csv",
        provenance=f"{RUN_DIR}/offline.provenance.json",
    log:
        job=f"{LOG_DIR}/offline.log",
        server=f"{LOG_DIR}/offline.server.log",
        perf=f"{LOG_DIR}/offline.perf_analyzer.log",
    container:
        container_of("triton")
    threads: workflow.cores
    resources:
        triton_server=1,
        # a whole GPU of its own: SLURM never hands an allocated GPU to a second job
        gpu=gpu_request,
        gpu_model=slurm_setting("gpu_model"),
        slurm_partition=slurm_setting("partition"),
        constraint=slurm_setting("constraint"),
    params:
        scenario="offline",
        model=lambda w: model_identity(w.model),
        model_name=lambda w: w.model,
        points=offline_points,
        measure=measure_settings,
        server=config["server"],
        run=run_info,
    script:
        "../scripts/perf.py"


use rule offline as online with:
    output:
        csv=f"{RUN_DIR}/online.csv",
        provenance=f"{RUN_DIR}/online.provenance.json",
    log:
        job=f"{LOG_DIR}/online.log",
        server=f"{LOG_DIR}/online.server.log",
        perf=f"{LOG_DIR}/online.perf_analyzer.log",
    params:
        scenario="online",
        model=lambda w: model_identity(w.model),
        model_name=lambda w: w.model,
        points=online_points,
        measure=measure_settings,
        server=config["server"],
        run=run_info,
