rule repository:
    input:
        artifact=served_artifact,
        provenance=served_provenance,
        signature=served_signature,
        image=image_input("framework"),
    output:
        repository=directory(REPOSITORY),
    log:
        f"{LOG_DIR}/repository.log",
    container:
        container_of("framework")
    params:
        model=lambda w: model_identity(w.model),
        model_name=lambda w: w.model,
        serving=lambda w: serving(run_of(w)),
        triton=lambda w: run_of(w).settings["triton"],
        device=lambda w: run_of(w).device,
        artifact_name=lambda w: run_of(w).format_settings["artifact"],
    script:
        "../scripts/repository.py"
