# `snakemake preflight`: first contact with a cluster, without starting a run. For every GPU of
# the config's `targets` (`--config 'targets=[tft/A30/trt/fp16]'` names others) and every image
# those runs use, one short job in that image on that GPU's partition checks what the runs will need there (GPU
# inside the container, CUDA initialised at the image's CUDA, tritonserver and its backends on the
# GPU, perf_analyzer, trtexec, the image's real TensorRT version, deploybench) and records it. A failed check names the missing piece and
# its fix; the report of a failed preflight stays in logs/preflight/<gpu>/<image>.json.


localrules:
    preflight,


rule preflight:
    input:
        preflight_reports,


rule preflight_check:
    input:
        image=lambda w: (
            [images.sif_path(w.image)]
            if USE_APPTAINER and images.is_built(config["images"][w.image])
            else []
        ),
    output:
        report=PREFLIGHT,
    log:
        job=f"{PREFLIGHT_LOG}.log",
        log_report=f"{PREFLIGHT_LOG}.json",
    wildcard_constraints:
        gpu=one_of(config["gpus"]),
        image=one_of(config["images"]),
    # a failed check fails the same way again: no retry (profiles/slurm retries other jobs)
    retries: 0
    container:
        container_of_image
    resources:
        **preflight_resources(),
        mem_mb=4000,
        runtime=lambda w: dbresources.runtime_minutes(config, {}, "preflight_check"),
    params:
        spec=preflight_spec,
    script:
        "../scripts/preflight.py"
