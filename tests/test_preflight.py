"""The preflight job (jobs.preflight) run directly here, with the real tritonserver and
perf_analyzer: the checks that can pass without a GPU pass, each GPU check fails with its fix."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from deploybench import jobs, preflight, probe
from deploybench.errors import ConfigError, PreflightError
from deploybench.io import sha256_of
from deploybench.planning.preflight_plan import plan_preflight
from deploybench.preflight import frameworks as preflight_frameworks
from deploybench.preflight import runner as preflight_runner
from deploybench.preflight import triton as preflight_triton
from deploybench.preflight.frameworks import check_framework_cuda
from deploybench.preflight.gpu import GpuProbe, check_driver, check_gpu_visible, driver_supports
from deploybench.preflight.image import check_image
from deploybench.preflight.tensorrt import check_trtexec
from tests.conftest import base_config, processes_mentioning, validated

# The A30 runs' expectations hold on a machine with no NVIDIA GPU or trtexec, as this one.
NO_GPU = pytest.mark.skipif(
    bool(shutil.which("nvidia-smi") or shutil.which("trtexec")), reason="expects no GPU here"
)
# NGC PyTorch / tritonserver 25.01's driver requirement (CUDA 12.8), from the release notes.
RELEASE_25_01 = {
    "python": "3.12",
    "cuda": "12.8.0.38",
    "driver": {"minimum": "570", "datacenter": ["470.57", "525.85", "535.86", "545.23"]},
}


def spec_of(gpu: str, image: str, **changes: Any) -> preflight.PreflightSpec:
    spec: Any = {**plan_preflight(validated(base_config()), gpu, image), "release": RELEASE_25_01}
    spec.update(changes)
    return spec


def status_of(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


def check_of(report: dict[str, Any], name: str) -> dict[str, Any]:
    [check] = [c for c in report["checks"] if c["name"] == name]
    return check


def run_job(root: Path, spec: preflight.PreflightSpec) -> dict[str, Any]:
    """``jobs.preflight`` with its temp files under ``root/tmp`` (to check that none stay), as
    its rule runs it: the report, the kept report, and the error it raised, if any."""
    out, tmp = root / "out", root / "tmp"
    tmp.mkdir(parents=True)
    files = {"report": out / "report.json", "log_report": out / "log.json"}
    error = None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(tmp))
        try:
            jobs.preflight(spec, **{k: str(v) for k, v in files.items()})
        except PreflightError as exc:
            error = exc
    return {
        "error": error,
        "report": files["report"],
        "kept": json.loads(files["log_report"].read_text()),
        "tmp": tmp,
    }


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_job(tmp_path_factory.mktemp("cpu"), spec_of("cpu", "triton-25.01"))


@pytest.fixture(scope="module")
def a30_triton_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_job(tmp_path_factory.mktemp("a30"), spec_of("A30", "triton-25.01"))


@pytest.fixture(scope="module")
def a30_framework_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    spec = spec_of("A30", "pytorch-25.01")
    assert "--memPoolSize" in spec["trtexec_flags"]  # the plan asks for the converter's flags
    return run_job(tmp_path_factory.mktemp("a30-framework"), spec)


def test_cpu_triton_image_passes_every_check_that_applies(cpu_run):
    assert cpu_run["error"] is None
    report = json.loads(cpu_run["report"].read_text())
    assert report == cpu_run["kept"]
    assert report["ok"] is True
    assert status_of(report) == {
        "image": "skip",  # a native venv
        "gpu_visible": "skip",
        "framework_cuda": "skip",
        "driver": "skip",
        "tritonserver": "pass",
        "tritonserver_gpu": "skip",
        "backends": "pass",
        "perf_analyzer": "pass",
        "trtexec": "skip",
        "tensorrt_version": "skip",  # no run on the CPU holds a TensorRT engine
        "deploybench_imports": "pass",
        "model_networks": "pass",
        "energy": "skip",  # a CPU's runs read no GPU's energy
    }
    assert "infer/s" in check_of(report, "perf_analyzer")["detail"]
    assert check_of(report, "tritonserver")["facts"]["version"]
    # where deploybench came from: a wrong PYTHONPATH bind would show here
    imports = check_of(report, "deploybench_imports")
    assert imports["facts"]["file"] == str(Path(jobs.__file__).parent.with_name("__init__.py"))
    assert report["spec"]["gpu"] == "cpu" and report["host"]["hostname"]
    assert report["container"]["runtime"] == "native venv"


def test_the_job_leaves_no_server_and_no_temp_files(cpu_run, a30_triton_run):
    for run in (cpu_run, a30_triton_run):
        assert list(run["tmp"].iterdir()) == []
        assert processes_mentioning(str(run["tmp"])) == []


@NO_GPU
def test_a30_triton_image_fails_each_gpu_check_with_its_fix(a30_triton_run):
    run = a30_triton_run
    assert isinstance(run["error"], PreflightError)
    assert not run["report"].exists()  # only the kept report, in the log directory
    report = run["kept"]
    assert report["ok"] is False
    status = status_of(report)
    for name in ("tritonserver", "perf_analyzer", "deploybench_imports"):
        assert status[name] == "pass", check_of(report, name)
    for name in ("gpu_visible", "framework_cuda", "driver", "tritonserver_gpu", "backends"):
        assert status[name] == "fail", check_of(report, name)
        assert check_of(report, name)["fix"]
    assert status["trtexec"] == "skip"
    # no NVML here: the runs would measure without energy, which warns and does not fail
    energy = check_of(report, "energy")
    assert energy["status"] == "warn", energy
    assert energy["detail"].startswith("energy would not be measured: ") and energy["fix"]
    # the fix names the GPU's slurm mapping to change, and Apptainer's --nv
    fix = check_of(report, "gpu_visible")["fix"]
    assert "gpus.A30.slurm" in fix and "partition: gpu" in fix and "gpu_model: a30" in fix
    assert "--nv" in fix
    # Triton's own reasons: no GPU for KIND_GPU, and no native backend in pytriton's server
    gpu = check_of(report, "tritonserver_gpu")
    assert "KIND_GPU but no GPUs are available" in gpu["detail"]
    assert "unable to find backend library for backend 'onnxruntime'" in gpu["detail"]
    assert "tensorrt: not tried" in gpu["detail"]
    assert "full NGC tritonserver image" in gpu["fix"]
    backends = check_of(report, "backends")
    assert "libtriton_onnxruntime.so" in backends["detail"]
    assert "libtriton_tensorrt.so" in backends["detail"]
    # the error Snakemake shows: each failed check and its fix
    message = str(run["error"])
    for name in ("gpu_visible", "framework_cuda", "driver", "tritonserver_gpu", "backends"):
        assert f"- {name}: " in message
    assert "- tritonserver: " not in message and "- perf_analyzer: " not in message  # passed
    assert "gpu_model: a30" in message


@NO_GPU
def test_a30_framework_image_without_trtexec_fails_it_with_a_fix(a30_framework_run):
    report = a30_framework_run["kept"]
    assert isinstance(a30_framework_run["error"], PreflightError)
    status = status_of(report)
    assert status["trtexec"] == "fail"
    assert "trtexec" in check_of(report, "trtexec")["detail"]
    assert "images.pytorch-25.01.from" in check_of(report, "trtexec")["fix"]
    for name in ("tritonserver", "tritonserver_gpu", "backends", "perf_analyzer"):
        assert status[name] == "skip"
    assert status["deploybench_imports"] == "pass"


def write_trtexec(folder: Path, help_text: str) -> Path:
    """A stand-in trtexec that prints ``help_text`` (TensorRT cannot run here)."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "trtexec"
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{help_text}\nEOF\n")
    exe.chmod(0o755)
    return exe


TRTEXEC_HELP = """&&&& RUNNING TensorRT.trtexec [TensorRT v100700] [b23] # trtexec --help
  --onnx=<file>               ONNX model
  --saveEngine=<file>         Save the serialized engine
  --minShapes=spec            Build with dynamic shapes
  --optShapes=spec            Build with dynamic shapes
  --maxShapes=spec            Build with dynamic shapes
  --memPoolSize=poolspec      Specify the size constraints of the designated memory pool(s)
  --skipInference             Exit after the engine has been built
  --fp16                      Enable fp16 precision"""


def test_trtexec_check_reads_the_version_and_names_missing_flags(tmp_path, monkeypatch):
    spec = spec_of("A30", "pytorch-25.01")
    monkeypatch.setenv("PATH", f"{tmp_path / 'full'}{os.pathsep}{os.environ['PATH']}")
    write_trtexec(tmp_path / "full", TRTEXEC_HELP)
    check = check_trtexec(spec)
    assert check.status == "pass" and check.facts["tensorrt"] == "10.7"

    # TensorRT 8.2's trtexec: --workspace and --buildOnly, not --memPoolSize/--skipInference
    old = TRTEXEC_HELP.replace("v100700", "v8203").replace("--memPoolSize", "--workspace")
    monkeypatch.setenv("PATH", f"{tmp_path / 'old'}{os.pathsep}{os.environ['PATH']}")
    write_trtexec(tmp_path / "old", old.replace("--skipInference", "--buildOnly"))
    check = check_trtexec(spec)
    assert check.status == "fail"
    assert check.detail == "TensorRT 8.2's trtexec lacks --memPoolSize, --skipInference"
    assert "TensorRT 8.4 or later" in check.fix


def test_a_hung_tool_is_killed_at_its_timeout():
    out = probe.run_command(["sleep", "30"], timeout_s=0.5)
    assert out.code is None and "did not finish within 0.5 s" in out.error
    assert probe.run_command(["no-such-tool-here"], 5).error == "no-such-tool-here not found"


@pytest.mark.parametrize(
    ("driver", "datacenter", "ok", "why"),
    [
        ("570.86.15", True, True, ">= 570"),
        ("575.51.03", False, True, ">= 570"),  # any GPU at or past the minimum
        ("535.104.05", True, True, "forward compatibility"),  # R535 >= 535.86
        ("470.57.02", True, True, "forward compatibility"),
        ("535.54.03", True, False, "< 570"),  # R535, but older than 535.86
        ("535.104.05", False, False, "only on data center GPUs"),
        ("550.54.15", True, False, "not one of the data center branches"),  # unlisted branch
        ("460.91.03", True, False, "< 570"),
    ],
)
def test_driver_rule(driver, datacenter, ok, why):
    verdict, reason = driver_supports(driver, RELEASE_25_01["driver"], datacenter=datacenter)
    assert verdict is ok and why in reason


def test_driver_rule_names_a_bad_requirement():
    with pytest.raises(ConfigError, match=r"release.driver.minimum 'r570' is not a driver"):
        driver_supports("570.1", {"minimum": "r570"}, datacenter=True)
    assert driver_supports("n/a", {"minimum": "570"}, datacenter=True)[0] is False
    with pytest.raises(ConfigError, match="names no minimum"):
        driver_supports("570.1", {"datacenter": []}, datacenter=True)


def test_driver_check_uses_the_image_release_and_the_gpu_kind():
    probe = GpuProbe(
        [{"name": "NVIDIA GeForce RTX 3090", "driver_version": "535.104.05", "uuid": "GPU-1"}], ""
    )

    # what the driver API answers on such a node (tests/test_cuda_driver.py runs the real probe
    # against a stand-in libcuda)
    def cuda() -> dict[str, Any]:
        return {"cuInit": 803, "version": 12020, "library": ["/.singularity.d/libs/libcuda.so.1"]}

    check = check_driver(spec_of("A30", "triton-25.01"), probe, cuda)
    assert check.status == "fail" and "update the nodes' driver to 570" in check.fix
    assert "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803)" in check.detail
    assert "only on data center GPUs" in check.detail and "compat" not in check.fix
    no_release = check_driver(spec_of("A30", "triton-25.01", release=None), probe)
    assert no_release.status == "skip" and "535.104.05" in no_release.detail


@pytest.mark.parametrize(
    ("gpu", "seen", "status"),
    [
        ("A30", "NVIDIA A30", "pass"),
        ("A30", "NVIDIA A40", "fail"),  # another model: its numbers would be mislabelled
        ("A100", "NVIDIA A100-SXM4-80GB", "pass"),  # "NVIDIA DGX A100 (1x A100 80GB)"
        # (a configured name: no image configured here drives a V100, so no V100 spec is planned)
        ("NVIDIA DGX-1 (1x V100 32GB)", "Tesla V100-SXM2-32GB", "pass"),
        ("H100_SXM", "NVIDIA H100 80GB HBM3", "pass"),
        ("L4", "NVIDIA L4", "pass"),
        ("L4", "NVIDIA L40S", "fail"),  # L4 is not L40S
        ("L40S", "NVIDIA L40", "fail"),
        ("NVIDIA A10", "NVIDIA A100-PCIE-40GB", "fail"),  # a name that another one starts with
        ("NVIDIA GeForce RTX 4090", "NVIDIA A30", "pass"),  # no model name to compare
    ],
)
def test_gpu_visible_wants_the_configured_gpu_model(gpu, seen, status):
    probe = GpuProbe([{"name": seen, "driver_version": "570.1", "uuid": "GPU-1"}], "")
    spec = spec_of("A30" if " " in gpu else gpu, "triton-25.01")
    if " " in gpu:  # a configured name of a GPU the config does not have
        spec["gpu_name"] = gpu
    check = check_gpu_visible(spec, probe)
    assert check.status == status and seen in check.detail
    if status == "fail":
        assert f"gpus.{spec['gpu']}.slurm" in check.fix


def test_a_spec_with_an_unknown_choice_fails_early_naming_the_choices():
    with pytest.raises(ConfigError, match=r"device 'tpu'; valid choices: gpu, cpu"):
        preflight.run_checks(spec_of("cpu", "triton-25.01", device="tpu"))
    with pytest.raises(ConfigError, match=r"backends \['openvino'\]; valid choices: python"):
        preflight.run_checks(spec_of("cpu", "triton-25.01", backends=["openvino"]))


def test_every_check_reports_and_none_stops_the_others(monkeypatch):
    """A check that raises fails with the error; the others still run."""

    def broken(*_args: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(preflight_runner, "check_deploybench_imports", broken)
    monkeypatch.setattr(preflight_runner, "check_backends", broken)
    spec = spec_of("cpu", "pytorch-25.01")
    checks = {c.name: c for c in preflight.run_checks(spec)}
    assert list(checks) == list(preflight.CHECKS)
    assert checks["backends"].status == "skip"  # does not apply: not run at all
    assert checks["deploybench_imports"].status == "fail"
    assert "RuntimeError: boom" in checks["deploybench_imports"].detail

    # the Triton checks' shared set-up failing fails them, not the job
    monkeypatch.setattr(preflight_triton, "write_tiny_repository", broken)
    checks = {c.name: c for c in preflight.run_checks(spec_of("cpu", "triton-25.01"))}
    assert list(checks) == list(preflight.CHECKS)
    for name in ("tritonserver", "perf_analyzer", "backends"):
        assert checks[name].status == "fail" and "boom" in checks[name].detail
    assert checks["tritonserver_gpu"].status == "skip"


def test_image_check_names_a_built_or_a_prebuilt_image_with_its_digest(tmp_path, monkeypatch):
    spec = spec_of("A30", "triton-25.01")
    built = tmp_path / "images" / "triton-25.01.sif"
    built.parent.mkdir()
    built.write_bytes(b"built")
    (built.with_suffix(".json")).write_text(json.dumps({"sha256": "ab" * 32}))
    monkeypatch.setenv("APPTAINER_CONTAINER", str(built))
    check = check_image(spec)
    assert check.status == "pass" and "built by rule container_image" in check.detail
    assert "ab" * 32 in check.detail
    # a site's own image (images.<image>.image): hashed where it runs
    prebuilt = tmp_path / "site" / "triton.sif"
    prebuilt.parent.mkdir()
    prebuilt.write_bytes(b"site image")
    monkeypatch.setenv("APPTAINER_CONTAINER", str(prebuilt))
    check = check_image(spec)
    assert check.status == "pass" and "prebuilt, used as is" in check.detail
    assert sha256_of(prebuilt) in check.detail


# --------------------------------------------------------------- a framework's CUDA, probed


def _framework_check(monkeypatch, info: dict[str, Any]) -> preflight.Check:
    monkeypatch.setattr(preflight_frameworks, "python_probe", lambda *a: (info, ""))
    spec = spec_of("A30", "triton-25.01")
    return check_framework_cuda(spec, GpuProbe([], None))


SEES_A_B200 = {
    "module": "torch", "version": "2.6.0+cu124", "cuda": "12.4", "available": True,
    "devices": 1, "names": ["NVIDIA B200"], "capability": "10.0",
    "arch_list": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
}  # fmt: skip


def test_a_framework_that_sees_the_gpu_but_has_no_kernels_for_it_fails(monkeypatch):
    """is_available() is not enough: the probe runs a kernel (torch 2.6.0 from PyPI on a B200:
    "no kernel image is available for execution on the device")."""
    error = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
    check = _framework_check(monkeypatch, {**SEES_A_B200, "kernel_error": error})
    assert check.status == preflight.FAIL
    assert "sees the GPU but cannot run on it: RuntimeError: CUDA error: no kernel image" in (
        check.detail
    )
    assert "compute capability 10.0; built for: sm_50, " in check.detail
    assert "install a torch built for compute capability 10.0 in the image" in check.fix
    passing = _framework_check(monkeypatch, {**SEES_A_B200, "capability": "8.0", "kernel": 16.0})
    assert passing.status == preflight.PASS


def test_a_framework_that_sees_no_gpu_is_not_blamed_on_the_driver_alone(monkeypatch):
    """TensorFlow 2.17 from PyPI in an image with cuDNN 9 sees no GPU though the driver is fine:
    the fix names both causes."""
    info = {"module": "torch", "version": "2.6.0", "cuda": "12.4", "available": False, "devices": 0}
    check = _framework_check(monkeypatch, info)
    assert check.status == preflight.FAIL
    assert "if it passed, torch cannot load the CUDA libraries it was built for" in check.fix


def test_the_triton_images_tensorflow_is_not_asked_for_the_gpu():
    """ResNet-50's accuracy reference runs on the CPU in the Triton image (its PyPI TensorFlow
    cannot load cuDNN 9); the NGC TensorFlow image's own is still checked."""
    config = validated(base_config())
    assert plan_preflight(config, "A30", "triton-25.02-tf")["frameworks"] == []
    assert plan_preflight(config, "A30", "tensorflow-25.02")["frameworks"] == ["tensorflow"]
    assert plan_preflight(config, "A30", "triton-25.01")["frameworks"] == ["torch"]
