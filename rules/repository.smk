rule repository:
    input:
        artifact=served_artifact,
        artifact_provenance=served_provenance,
        signature=served_signature,
        image=image_input("framework"),
    output:
        repository=directory(REPOSITORY),
    log:
        f"{LOG_DIR}/repository.log",
    container:
        container_of("framework")
    resources:
        runtime=run_runtime("repository"),
    params:
        spec=run_spec("repository"),
    script:
        "../scripts/repository.py"
