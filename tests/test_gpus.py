"""GPUs and the images that can drive them, through Snakemake: a run on a GPU its images
support resolves under the SLURM profile; one on a GPU they do not fails at DAG time naming the
GPU, its compute capability and the image (the plan-level checks are in tests/test_plan.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import base_config, write_config
from tests.test_slurm import job_resources, slurm_snakemake


def dry_run(workdir: Path, config: dict[str, Any], target: str) -> tuple[int, str]:
    """``snakemake -n target`` under the SLURM profile with ``config``: its exit status and
    output."""
    write_config(workdir, config)
    result = slurm_snakemake(workdir, target, timeout_s=120, dry_run=True)
    return result.returncode, result.stdout + result.stderr


def test_dry_run_on_a_new_gpu_resolves_under_the_slurm_profile(tmp_path: Path):
    code, out = dry_run(tmp_path, base_config(), "results/tft/H100_SXM/trt/fp16/online.csv")
    assert code == 0, out[-4000:]
    h100 = base_config()["gpus"]["H100_SXM"]["slurm"]
    for rule in ("convert", "online"):
        [resources] = job_resources(out)[rule]
        assert resources["gpu_model"] == h100["gpu_model"], (rule, resources)


def test_dry_run_on_a_gpu_its_images_cannot_drive_fails_naming_both(tmp_path: Path):
    config = base_config()
    for image in config["images"].values():
        image.pop("older_gpus", None)  # no older images to fall back on
    code, out = dry_run(tmp_path, config, "results/resnet50/V100/tf-trt/fp16/online.csv")
    assert code != 0
    assert "gpu 'V100' (compute capability 7.0) cannot run image 'tensorflow-25.02'" in out, out[
        -4000:
    ]
    assert "the last NGC release that supports 7.0 (Volta) is 24.12" in out
    assert not (tmp_path / "results").exists()


def test_a_v100_run_is_exported_converted_and_served_in_the_volta_images(tmp_path: Path):
    code, out = dry_run(tmp_path, base_config(), "results/resnet50/V100/tf-trt/fp16/online.csv")
    assert code == 0, out[-4000:]
    # its export is its own, made in NGC TensorFlow 24.09 (the models' is 25.02's)
    export = "results/resnet50/export@tensorflow-24.09/tf-savedmodel/fp32/model.savedmodel"
    assert export in out, out[-4000:]
    assert "results/resnet50/export/tf-savedmodel" not in out
    assert "images/tensorflow-24.09.sif" in out and "images/triton-24.09-tf.sif" in out
    assert "triton-25.02-tf" not in out
    # only the checkpoint (a file of arrays, device- and release-independent, no GPU asked) is
    # made in the models' own image
    assert (
        "results/resnet50/checkpoint/checkpoint.npz; Input files updated by another job: images/tensorflow-25.02.sif"
        in out
    )
