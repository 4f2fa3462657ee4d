rule accuracy:
    input:
        repository=repository_of,
        checkpoint=lambda w: checkpoint_of(w.model),
        image=image_input("triton"),
        preflight=preflight_input("triton"),
    output:
        csv=f"{RUN_DIR}/accuracy.csv",
        task_csv=f"{RUN_DIR}/task.csv",
        provenance=f"{RUN_DIR}/accuracy.provenance.json",
    log:
        job=f"{LOG_DIR}/accuracy.log",
        server_log=f"{LOG_DIR}/accuracy.server.log",
    # A run's jobs in a known order where they wait for one server slot: accuracy (minutes at
    # most, and it says whether the served model is right), then offline, then online. A run
    # cut short (SLURM's time limit, the GPU kit's share) has then lost the last, not any.
    priority: RUN_PRIORITY["accuracy"]
    group:
        run_group("accuracy")
    container:
        container_of("triton")
    resources:
        **gpu_resources(),
        triton_server=1,
        runtime=run_runtime("accuracy"),
    params:
        spec=run_spec("accuracy"),
    script:
        "../scripts/accuracy.py"
