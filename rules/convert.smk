# GPU step: TensorRT engines and fp16 artifacts are made on the GPU they run on.
rule convert:
    input:
        export=lambda w: export_of(run_of(w)),
    output:
        artifact=CONVERTED,
    log:
        f"{LOG_DIR}/convert/{{artifact}}.log",
    wildcard_constraints:
        artifact=one_of(FILE_ARTIFACTS),
    container:
        image("framework")
    resources:
        gpu=1,
        mem_mb=lambda w: model_base(w.model)["export"]["mem_mb"],
    params:
        model=lambda w: model_identity(w.model),
        converter=lambda w: run_of(w).converter,
        max_batch_size=lambda w: run_of(w).settings["triton"]["max_batch_size"],
    script:
        "../scripts/convert.py"


# TF-TRT writes a SavedModel directory.
use rule convert as convert_directory with:
    output:
        artifact=directory(CONVERTED),
    wildcard_constraints:
        artifact=one_of(DIRECTORY_ARTIFACTS),
