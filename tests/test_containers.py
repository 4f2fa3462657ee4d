"""Containers: which image wraps which job, how images are built, and what results record.

No container runtime runs here (../shared/notes/apptainer.md), so the end-to-end test puts the
clearly named stand-in tests/bin/apptainer on PATH: it records each call and runs the inner
command natively. The real CPU chain runs through Snakemake's `--sdm apptainer` code path, and
the test asserts the exact `apptainer` command lines each job got.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from deploybench import images
from deploybench.checkpoint import write_seeded_checkpoint
from deploybench.config import ConfigError
from deploybench.io import sha256_of
from deploybench.models import load_family
from tests.conftest import (
    REPO,
    base_config,
    orchestration_config,
    planned_jobs,
    run_snakemake,
    write_config,
)

STANDIN = REPO / "tests" / "bin"
RUN = "results/tft/cpu/onnx/fp32"
# The job's script names the rule it belongs to; perf.py runs offline and online.
ROLE_OF_SCRIPT = {
    "checkpoint.py": "framework",
    "export.py": "framework",
    "repository.py": "framework",
    "accuracy.py": "triton",
    "perf.py": "triton",
}


def test_build_command_passes_pinned_bases_as_build_args():
    image = base_config()["images"]["triton-25.01"]
    args = images.build_args(image)
    assert args == [
        "FROM=nvcr.io/nvidia/tritonserver:25.01-py3",
        "SDK=nvcr.io/nvidia/tritonserver:25.01-py3-sdk",
        "LOCK=envs/containers/triton-25.01.lock",
    ]
    cmd = images.build_command("apptainer", "envs/triton.def", "images/x.sif", args, [])
    assert cmd[:3] == ["apptainer", "build", "--force"]
    assert cmd[-2:] == ["images/x.sif", "envs/triton.def"]
    assert cmd.count("--build-arg") == 3


def test_every_model_runs_in_images_of_its_framework():
    config = base_config()
    for model, settings in config["models"].items():
        framework = config["images"][settings["containers"]["framework"]]
        triton = config["images"][settings["containers"]["triton"]]
        assert framework["definition"] == "envs/framework.def"
        assert triton["definition"] == "envs/triton.def"
        # the Triton image's Python packages match the framework the model is written in, each
        # image locked for its own base
        assert framework["requirements"] == triton["requirements"], model
        assert framework["lock"] != triton["lock"], model
        assert triton["from"].split(":")[1] == triton["sdk"].split(":")[1].removesuffix("-sdk")
        for definition in (framework["definition"], triton["definition"]):
            assert (REPO / definition).is_file()


def test_definitions_use_the_build_args_they_are_given():
    framework = (REPO / "envs" / "framework.def").read_text()
    triton = (REPO / "envs" / "triton.def").read_text()
    assert "From: {{ FROM }}" in framework and "{{ LOCK }}" in framework
    assert "{{ SHIPS }}" in framework
    assert "From: {{ SDK }}" in triton and "Stage: sdk" in triton
    assert "From: {{ FROM }}" in triton and "%files from sdk" in triton
    assert "perf_analyzer" in triton


def test_unknown_image_name_is_a_config_error():
    config = base_config()
    config["models"]["tft"]["containers"]["triton"] = "triton-99.99"
    with pytest.raises(
        ConfigError, match=r"unknown image 'triton-99.99'; valid choices: .*triton-25.01"
    ):
        images.check_images(config)


def test_data_outside_the_workdir_is_bound_read_only(tmp_path):
    config = base_config()
    outside = tmp_path / "data" / "ckpt.pt"
    config["models"]["tft"]["checkpoint"] = str(outside)
    config["models"]["bert"]["accuracy"]["task"]["path"] = "squad"  # relative: in the workdir
    binds = images.data_binds(config, tmp_path / "work")
    assert binds == [f"{outside}:{outside}:ro"]
    args = images.job_options("--nv", binds, {"PYTHONPATH": "/src"})
    assert args == f"--nv --bind {outside}:{outside}:ro --env PYTHONPATH=/src"
    # a job re-reading the workflow adds nothing
    assert images.job_options(args, binds, {"PYTHONPATH": "/src"}) == args


def test_running_image_reads_the_build_record(tmp_path, monkeypatch):
    sif = tmp_path / "x.sif"
    sif.write_bytes(b"image")
    record = {"name": "x", "sha256": sha256_of(sif)}
    (tmp_path / "x.json").write_text(json.dumps(record))
    monkeypatch.setenv("APPTAINER_CONTAINER", str(sif))
    info = images.running_image()
    assert info["runtime"] == "apptainer" and info["sha256"] == record["sha256"]
    monkeypatch.delenv("APPTAINER_CONTAINER")
    assert images.running_image() == {"image": None, "runtime": "native venv"}


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line)["argv"] for line in log.read_text().splitlines()]


def _source_tree(tmp_path: Path) -> Path:
    """A copy of the workflow's source tree, so a test may edit a definition file."""
    src = tmp_path / "src"
    src.mkdir()
    for part in ("Snakefile", "rules", "scripts", "envs", "config"):
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy2
        copy(REPO / part, src / part)
    return src


@pytest.mark.e2e
def test_cpu_chain_under_sdm_apptainer_wraps_every_job_in_its_pinned_image(tmp_path):
    src = _source_tree(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    config = orchestration_config()
    # a checkpoint outside the working directory: the jobs reading it need it bound
    checkpoint = tmp_path / "checkpoints" / "tft.pt"
    checkpoint.parent.mkdir()
    tft = config["models"]["tft"]
    write_seeded_checkpoint(load_family(tft["module"], tft["hparams"]), 7, checkpoint)
    tft["checkpoint"] = str(checkpoint)
    write_config(work, config)
    log = work / "apptainer-calls.jsonl"
    targets = [f"{RUN}/{name}" for name in ("accuracy.csv", "offline.csv", "online.csv")]

    def snakemake(*args: str):
        return run_snakemake(
            work,
            *targets,
            "--sdm", "apptainer",
            "--apptainer-args=--nv",
            *args,
            snakefile=src / "Snakefile",
            env={"APPTAINER_STANDIN_LOG": str(log)},
            path_first=(STANDIN,),
        )  # fmt: skip

    result = snakemake()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    calls = _calls(log)

    # each image built once, from its definition, with the pinned NGC bases
    builds = {c[-1]: c for c in calls if c[0] == "build"}
    assert set(builds) == {str(src / "envs" / "framework.def"), str(src / "envs" / "triton.def")}
    triton_build = builds[str(src / "envs" / "triton.def")]
    assert "FROM=nvcr.io/nvidia/tritonserver:25.01-py3" in triton_build
    assert "SDK=nvcr.io/nvidia/tritonserver:25.01-py3-sdk" in triton_build
    assert not any(c[0] == "pull" for c in calls)  # nothing pulled: every image is built

    expected_image = {
        role: f"images/{tft['containers'][role]}.sif" for role in ("framework", "triton")
    }
    jobs = [c for c in calls if c[0] == "exec"]
    scripts = []
    for call in jobs:
        script = call[-1].rsplit(".", 2)[-2] + ".py"  # .snakemake/scripts/tmpXXXX.<name>.py
        scripts.append(script)
        image = next(a for a in call if a.endswith(".sif"))
        options = call[1 : call.index(image)]
        assert image == expected_image[ROLE_OF_SCRIPT[script]], (script, image)
        assert "--nv" in options
        assert options[options.index("--home") + 1] == str(work)
        binds = [options[i + 1] for i, o in enumerate(options) if o == "--bind"]
        assert f"{checkpoint.parent}:{checkpoint.parent}:ro" not in binds  # a file, not its dir
        assert f"{checkpoint}:{checkpoint}:ro" in binds
        # the workflow's sources, so that the job imports this deploybench
        assert f"{REPO}:{REPO}:ro" in binds
        assert options[options.index("--env") + 1] == f"PYTHONPATH={REPO}"
        assert call[-3:-1] == ["bash", "-c"]
    assert sorted(scripts) == sorted(
        ["checkpoint.py", "export.py", "repository.py", "accuracy.py", "perf.py", "perf.py"]
    )

    # every result names the image that produced it, with the build record's digest
    for name, role in (
        ("accuracy", "triton"),
        ("offline", "triton"),
        ("online", "triton"),
    ):
        container = json.loads((work / RUN / f"{name}.provenance.json").read_text())["container"]
        record = json.loads((work / expected_image[role]).with_suffix(".json").read_text())
        assert container["image"] == expected_image[role]
        assert container["sha256"] == record["sha256"] == sha256_of(work / expected_image[role])
        assert "standin" in container["record"]["apptainer"]  # the record says what built it
        # and what it installed: the lock's digest
        lock = src / container["record"]["lock"]
        assert container["record"]["lock_sha256"] == sha256_of(lock)
    export = json.loads(
        (work / "results/tft/export/onnx/fp32/model.onnx.provenance.json").read_text()
    )
    assert export["container"]["image"] == expected_image["framework"]

    # up to date; then a changed Triton definition rebuilds that image and reruns only the
    # jobs that ran in it
    assert planned_jobs(snakemake("-n")) == {}
    definition = src / "envs" / "triton.def"
    definition.write_text(definition.read_text() + "\n# changed\n")
    assert planned_jobs(snakemake("-n")) == {
        "container_image": 1,
        "accuracy": 1,
        "offline": 1,
        "online": 1,
    }


def test_native_runs_need_no_image(tmp_path):
    write_config(tmp_path, base_config())
    jobs = planned_jobs(run_snakemake(tmp_path, "-n", "results/tft/cpu/onnx/fp32/online.csv"))
    assert "container_image" not in jobs and jobs["online"] == 1
