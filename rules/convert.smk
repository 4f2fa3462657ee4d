# GPU step: TensorRT engines and fp16 artifacts are made on the GPU they run on.
rule convert:
    input:
        export=lambda w: export_path(plan_of(w).export),
        image=image_input("framework"),
        preflight=preflight_input("framework"),
    output:
        artifact=CONVERTED,
        provenance=f"{CONVERTED}.provenance.json",
    log:
        f"{LOG_DIR}/convert/{{artifact}}.log",
    wildcard_constraints:
        artifact=one_of(FILE_ARTIFACTS),
    group:
        run_group("convert")
    container:
        container_of("framework")
    resources:
        **gpu_resources(),
        mem_mb=framework_mem_mb,
        runtime=run_runtime("convert"),
    params:
        spec=run_spec("convert"),
    script:
        "../scripts/convert.py"


# TF-TRT writes a SavedModel directory.
use rule convert as convert_directory with:
    output:
        artifact=directory(CONVERTED),
        provenance=f"{CONVERTED}.provenance.json",
    wildcard_constraints:
        artifact=one_of(DIRECTORY_ARTIFACTS),
