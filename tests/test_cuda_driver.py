"""The preflight's driver check against a stand-in libcuda.so.1 (tests/fixtures/fake_libcuda.c):
the verdict is what ``cuInit`` and ``cuDriverGetVersion`` say in the job's process, not what the
release notes' table of driver branches would allow."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from deploybench import preflight
from deploybench.preflight.gpu import GpuProbe, check_driver, driver_supports
from tests.test_preflight import spec_of

FIXTURE = Path(__file__).parent / "fixtures" / "fake_libcuda.c"
# An A30 node on R535: a forward-compatible data center branch for the 25.01 images' CUDA 12.8.
A30_R535 = GpuProbe([{"name": "NVIDIA A30", "driver_version": "535.104.05", "uuid": "GPU-1"}], "")


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the stand-in ``libcuda.so.1``."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no C compiler: envs/test-packages.sh installs gcc")
        pytest.skip("no C compiler to build the stand-in libcuda")
    directory = tmp_path_factory.mktemp("libcuda")
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(directory / "libcuda.so.1"), str(FIXTURE)],
        check=True,
    )
    return directory


def driver_check(
    monkeypatch: pytest.MonkeyPatch,
    libcuda: Path | None,
    probe: GpuProbe = A30_R535,
    **answers: int,
) -> preflight.Check:
    """The driver check of the A30 / triton-25.01 preflight, with the probe's child process
    finding the stand-in first on the library path (as the job would find --nv's libcuda)."""
    path = [str(libcuda)] if libcuda else []
    monkeypatch.setenv("LD_LIBRARY_PATH", os.pathsep.join(path))
    for key in ("FAKE_CUINIT", "FAKE_CUDA_VERSION"):
        monkeypatch.delenv(key, raising=False)
    for key, value in answers.items():
        monkeypatch.setenv(key.upper(), str(value))
    return check_driver(spec_of("A30", "triton-25.01"), probe)


def test_a_compat_branch_that_fails_cuinit_fails_naming_the_error(monkeypatch, fake_libcuda):
    # R535 >= 535.86 passes the release notes' table "by forward compatibility" ...
    assert driver_supports(
        "535.104.05", spec_of("A30", "triton-25.01")["release"]["driver"], datacenter=True
    )[0]
    # ... but CUDA does not initialise in the job: the check fails, naming cuInit's error.
    check = driver_check(monkeypatch, fake_libcuda, fake_cuinit=804)
    assert check.status == "fail"
    assert "cuInit failed with CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (804)" in check.detail
    assert "forward compatibility" in check.detail  # the table's view, as an explanation
    assert "update the nodes' driver to 570" in check.fix and "compat" in check.fix
    assert check.facts["cuda_driver_api"]["library"][0].startswith(str(fake_libcuda))


def test_an_older_minor_of_the_same_cuda_warns_and_leaves_it_to_the_kernels(
    monkeypatch, fake_libcuda
):
    # No compat libcuda loaded: the R535 driver's own API implements CUDA 12.2 only, which runs
    # the image's 12.8 by minor-version compatibility (>= 525.60.13), with limits.
    check = driver_check(monkeypatch, fake_libcuda, fake_cuda_version=12020)
    assert check.status == "warn", check.detail
    assert "implements CUDA 12.2, older than the image's CUDA 12.8.0.38" in check.detail
    assert "CUDA 12.x minor-version compatibility (>= 525.60.13)" in check.detail
    assert "the framework_cuda kernel and trtexec's build decide" in check.detail
    assert "WARN  driver" in preflight.table([check]) and "fix: update" in preflight.table([check])


def test_a_driver_of_an_older_cuda_major_fails(monkeypatch, fake_libcuda):
    old = GpuProbe([{**A30_R535.gpus[0], "driver_version": "520.61.05"}], "")
    check = driver_check(monkeypatch, fake_libcuda, old, fake_cuda_version=11080)
    assert check.status == "fail"
    assert "implements CUDA 11.8, older than the image's CUDA 12.8.0.38" in check.detail


def test_a_compat_branch_passes_when_cuda_initialises_at_the_image_version(
    monkeypatch, fake_libcuda
):
    check = driver_check(monkeypatch, fake_libcuda, fake_cuda_version=12080)
    assert check.status == "pass", check.detail
    assert "cuInit succeeds" in check.detail and "implements CUDA 12.8" in check.detail


def test_an_unnamed_cuinit_error_is_named_from_cuda_h(monkeypatch, fake_libcuda):
    check = driver_check(monkeypatch, fake_libcuda, fake_cuinit=100)
    assert check.status == "fail" and "CUDA_ERROR_NO_DEVICE (100)" in check.detail


@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="expects no driver here")
def test_no_libcuda_fails_with_the_gpu_fix(monkeypatch):
    check = driver_check(monkeypatch, None)
    assert check.status == "fail" and "libcuda.so.1 does not load" in check.detail
    assert "--nv" in check.fix
