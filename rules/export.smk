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
        **site_resources(),
        mem_mb=framework_mem_mb,
        runtime=model_runtime("export"),
    params:
        spec=lambda w: export_plan(w).spec(),
    script:
        "../scripts/export.py"


# A SavedModel is a directory.
use rule export as export_directory with:
    output:
        artifact=directory(EXPORT),
        provenance=f"{EXPORT}.provenance.json",
    wildcard_constraints:
        artifact=one_of(DIRECTORY_ARTIFACTS),


# An export made in another framework image (EXPORT_IN_IMAGE): the runs on a GPU the model's
# images cannot drive (a V100) are served from exports made in the images that drive it.
use rule export as export_in_image with:
    output:
        artifact=EXPORT_IN_IMAGE,
        provenance=f"{EXPORT_IN_IMAGE}.provenance.json",
    log:
        "logs/{model}/export@{export_image}/{export_format}/{export_precision}/{artifact}.log",


use rule export as export_directory_in_image with:
    output:
        artifact=directory(EXPORT_IN_IMAGE),
        provenance=f"{EXPORT_IN_IMAGE}.provenance.json",
    log:
        "logs/{model}/export@{export_image}/{export_format}/{export_precision}/{artifact}.log",
    wildcard_constraints:
        artifact=one_of(DIRECTORY_ARTIFACTS),
