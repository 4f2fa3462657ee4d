rule prepare_checkpoint:
    input:
        configured_checkpoint,
    output:
        checkpoint=CHECKPOINT,
        provenance="results/{model}/checkpoint/checkpoint.provenance.json",
    params:
        model=lambda w: model_identity(w.model),
    log:
        "logs/{model}/checkpoint.log",
    resources:
        mem_mb=lambda w: model_base(w.model)["export"]["mem_mb"],
    script:
        "../scripts/checkpoint.py"
