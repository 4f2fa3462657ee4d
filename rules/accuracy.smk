rule accuracy:
    input:
        repository=repository_of,
        checkpoint=lambda w: CHECKPOINT.format(model=w.model),
    output:
        csv=RUN_DIR + "/accuracy.csv",
        provenance=RUN_DIR + "/accuracy.provenance.json",
    params:
        model=lambda w: model_identity(w.model),
        model_name=lambda w: w.model,
        accuracy=lambda w: run_of(w).settings["accuracy"],
        server=config["server"],
        run=run_info,
    log:
        job=LOG_DIR + "/accuracy.log",
        server=LOG_DIR + "/accuracy.server.log",
    resources:
        triton_server=1,
    script:
        "../scripts/accuracy.py"
