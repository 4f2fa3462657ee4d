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
        mem_mb=lambda w: model_base(w.model)["export"]["mem_mb"],
    params:
        model=lambda w: model_identity(w.model),
    script:
        "../scripts/checkpoint.py"
