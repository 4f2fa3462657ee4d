rule export:
    input:
        checkpoint=export_artifact,
    output:
        artifact=EXPORT,
        provenance="results/{model}/export/{export_format}/{export_precision}/{artifact}.provenance.json",
    log:
        "logs/{model}/export/{export_format}/{export_precision}/{artifact}.log",
    container:
        image("framework")
    resources:
        mem_mb=lambda w: model_base(w.model)["export"]["mem_mb"],
    params:
        model=lambda w: model_identity(w.model),
        opset=lambda w: model_base(w.model)["export"]["onnx_opset"],
        tolerance=lambda w: model_base(w.model)["export"]["tolerance"],
    script:
        "../scripts/export.py"
