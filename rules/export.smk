# Exports are device-independent: one per model, export format and precision. An export may be
# made from another export of the same model (`export.sources` in its config).
rule export:
    input:
        checkpoint=export_artifact,
        source=export_source,
        image=image_input("framework"),
    output:
        artifact=EXPORT,
        provenance=f"{EXPORT}.provenance.json",
    log:
        "logs/{model}/export/{export_format}/{export_precision}/{artifact}.log",
    wildcard_constraints:
        artifact=one_of(FILE_ARTIFACTS),
    container:
        container_of("framework")
    resources:
        mem_mb=lambda w: model_base(w.model)["export"]["mem_mb"],
    params:
        model=lambda w: model_identity(w.model),
        opset=lambda w: model_base(w.model)["export"]["onnx_opset"],
        tolerance=lambda w: model_base(w.model)["export"]["tolerance"],
        check_batch=lambda w: model_base(w.model)["export"]["check_batch"],
    script:
        "../scripts/export.py"


# A SavedModel is a directory.
use rule export as export_directory with:
    output:
        artifact=directory(EXPORT),
        provenance=f"{EXPORT}.provenance.json",
    wildcard_constraints:
        artifact=one_of(DIRECTORY_ARTIFACTS),
