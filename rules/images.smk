# Apptainer images built from envs/*.def over pinned NGC bases. Built where Snakemake runs (a
# login node can pull from NGC; compute nodes often cannot), rebuilt only when the definition,
# the lock of what it installs (envs/containers/<image>.lock), its installer
# (envs/install_lock.py) or the pinned bases change. The
# requirements are an input too: a lock not regenerated after they changed fails the build. It
# runs `apptainer` itself, so it has no container of its own.


localrules:
    container_image,


rule container_image:
    input:
        definition=lambda w: image_build(w)["definition"],
        requirements=lambda w: image_build(w)["requirements"],
        lock=lambda w: image_build(w)["lock"],
        installer=lambda w: image_build(w)["installer"],
    output:
        image=images.sif_path("{image}"),
        record=images.record_path("{image}"),
    log:
        "logs/images/{image}.log",
    wildcard_constraints:
        image=one_of(BUILT_IMAGES),
    params:
        image=image_build,
    run:
        images.build(
            name=wildcards.image,
            image=params.image,
            out=output.image,
            record_out=output.record,
            log_file=log[0],
        )
