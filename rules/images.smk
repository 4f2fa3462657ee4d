# Apptainer images built from envs/*.def over pinned NGC bases. Built where Snakemake runs (a
# login node can pull from NGC; compute nodes often cannot), rebuilt only when the definition,
# its requirements or the pinned bases change.
BUILT_IMAGES = sorted(n for n, i in config["images"].items() if images.is_built(i))


def image_build(w):
    """The image's config with its definition and requirements as paths in this source tree."""
    return images.in_source_tree(config["images"][w.image], workflow.basedir)


localrules:
    container_image,


rule container_image:
    input:
        definition=lambda w: image_build(w)["definition"],
        requirements=lambda w: image_build(w)["requirements"],
    output:
        image=images.sif_path("{image}"),
        record=images.record_path("{image}"),
    log:
        "logs/images/{image}.log",
    wildcard_constraints:
        image=one_of(BUILT_IMAGES),
    params:
        name=lambda w: w.image,
        image=image_build,
    script:
        "../scripts/container_image.py"
