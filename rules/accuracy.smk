rule accuracy:
    input:
        repository=repository_of,
        checkpoint=lambda w: checkpoint_of(w.model),
        image=image_input("triton"),
    output:
        csv=f"{RUN_DIR}/accuracy.csv",
        task=f"{RUN_DIR}/task.csv",
        provenance=f"{RUN_DIR}/accuracy.provenance.json",
    log:
        job=f"{LOG_DIR}/accuracy.log",
        server=f"{LOG_DIR}/accuracy.server.log",
    container:
        container_of("triton")
    resources:
        triton_server=1,
        gpu=gpu_request,
        gpu_model=slurm_setting("gpu_model"),
        slurm_partition=slurm_setting("partition"),
        constraint=slurm_setting("constraint"),
    params:
        model=lambda w: model_identity(w.model),
        model_name=lambda w: w.model,
        accuracy=lambda w: run_of(w).settings["accuracy"],
        server=config["server"],
        run=run_info,
    script:
        "../scripts/accuracy.py"
