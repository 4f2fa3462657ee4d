# GPU step: TensorRT engines and fp16 artifacts are made on the GPU they run on.
rule convert:
    input:
        export=lambda w: export_of(run_of(w)),
        image=image_input("framework"),
    output:
        artifact=CONVERTED,
        provenance=f"{CONVERTED}.provenance.json",
    log:
        f"{LOG_DIR}/convert/{{artifact}}.log",
    wildcard_constraints:
        artifact=one_of(FILE_ARTIFACTS),
    container:
        container_of("framework")
    resources:
        gpu=gpu_request,
        gpu_model=slurm_setting("gpu_model"),
        slurm_partition=slurm_setting("partition"),
        constraint=slurm_setting("constraint"),
        mem_mb=lambda w: model_base(w.model)["export"]["mem_mb"],
    params:
        model=lambda w: model_identity(w.model),
        converter=lambda w: run_of(w).converter,
        # the converter's settings with defaults, checked while the DAG is built
        settings=lambda w: conversion_settings(run_of(w)),
    script:
        "../scripts/convert.py"


# TF-TRT writes a SavedModel directory.
use rule convert as convert_directory with:
    output:
        artifact=directory(CONVERTED),
        provenance=f"{CONVERTED}.provenance.json",
    wildcard_constraints:
        artifact=one_of(DIRECTORY_ARTIFACTS),
