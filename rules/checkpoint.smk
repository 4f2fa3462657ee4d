rule prepare_checkpoint:
    input:
        checkpoint_name,
        image=image_input("framework"),
    output:
        checkpoint=CHECKPOINT,
        provenance="results/{model}/checkpoint/{checkpoint_file}.provenance.json",
    log:
        "logs/{model}/{checkpoint_file}.log",
    container:
        container_of("framework")
    resources:
        **site_resources(),
        mem_mb=framework_mem_mb,
        runtime=model_runtime("prepare_checkpoint"),
    params:
        spec=lambda w: model_plan(w.model).checkpoint_spec(),
    script:
        "../scripts/checkpoint.py"
