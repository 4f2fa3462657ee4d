# GPU step: TensorRT engines and fp16 artifacts are made on the GPU they run on, from the
# export (fp16 TorchScript: from the checkpoint, halved before it is traced, as DLE did).
rule convert:
    input:
        source=conversion_source,
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


# engines: per_batch (models.<m>.convert.tensorrt.engines; deploybench/planning/engines.py): the engine of
# one offline batch size, min = opt = max = that batch, as DLE converted BERT for each batch.
use rule convert as convert_batch with:
    output:
        artifact=CONVERTED_BATCH,
        provenance=f"{CONVERTED_BATCH}.provenance.json",
    log:
        f"{LOG_DIR}/convert/batch{{batch}}/{{artifact}}.log",
    wildcard_constraints:
        artifact=one_of(FILE_ARTIFACTS),
        batch=r"[0-9]+",
    group:
        lambda w: plan_of(w).group_of(dbengines.convert_job(int(w.batch)))
    params:
        spec=lambda w: plan_of(w).convert_spec(int(w.batch)),
