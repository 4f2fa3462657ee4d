"""One TensorRT (deploybench.trt_version): a TensorRT engine loads only in the TensorRT that built
it, so a run's convert image and serve image must ship the same one. Up to the GPU boundary: the
DAG refuses a run whose two images record different versions (naming both), the preflight reads
the real versions (stand-ins: a trtexec that prints a banner, a backend folder with libnvinfer
files, a TF-TRT module) and compares them, and the repository step refuses a plan another
TensorRT built (its provenance and its own header)."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from deploybench import convert as cv
from deploybench import jobs, preflight, tools
from deploybench import trt_version as trt
from deploybench.errors import ConfigError, EngineVersionMismatch
from deploybench.planning import run_plan as dbplan
from deploybench.planning.preflight_plan import plan_preflight
from deploybench.planning.workflow_config import containers_on
from deploybench.preflight.tensorrt import check_tensorrt_version, check_trtexec
from deploybench.tensors import TensorSpec
from tests.conftest import base_config, planned_jobs, run_snakemake, validated, write_config

NGC_25_0X = "10.8.0.43"  # what config/config.yaml records for every 25.01 and 25.02 image


def config_with(**versions: str | None) -> dict[str, Any]:
    """The shipped config with ``images.<image>.release.tensorrt`` changed (None: removed);
    keyword names use _ for the image names' - and . (triton_25_01 -> triton-25.01)."""
    config = base_config()
    for key, version in versions.items():
        name = key.replace("_25_0", "-25.0").replace("_tf", "-tf")
        release = config["images"][name]["release"]
        if version is None:
            release.pop("tensorrt", None)
        else:
            release["tensorrt"] = version
    return validated(config)


# ---------------------------------------------------------------------------- the config


def test_every_image_records_its_tensorrt_and_each_models_pair_matches():
    config = validated(base_config())
    assert {name: image["release"]["tensorrt"] for name, image in config["images"].items()} == {
        "pytorch-25.01": NGC_25_0X,
        "triton-25.01": NGC_25_0X,
        "tensorflow-25.02": NGC_25_0X,
        "triton-25.02-tf": NGC_25_0X,
        # the V100's: TensorRT 10.4, the last with Volta engines
        "pytorch-24.09": "10.4.0.26",
        "triton-24.09": "10.4.0.26",
        "tensorflow-24.09": "10.4.0.26",
        "triton-24.09-tf": "10.4.0.26",
    }
    for model in config["models"]:
        for gpu, version in (("A30", NGC_25_0X), ("V100", "10.4.0.26")):
            containers = containers_on(config, model, gpu)
            for converter in trt.ENGINE_CONVERTERS:
                found = trt.check_run(config, f"{model}/{gpu}/x/fp16", converter, containers)
                assert found == {
                    "image": containers["triton"],
                    "version": version,
                    "built_in": containers["framework"],
                }


def test_the_schema_takes_major_minor_patch_and_a_build_only():
    from snakemake.exceptions import WorkflowError

    for good in ("10.8.0", "10.8.0.43"):
        config_with(triton_25_01=good)  # validated
    for bad in ("10.8", "v10.8.0", "10.8.0-1+cuda12.8"):
        with pytest.raises(WorkflowError):
            config_with(triton_25_01=bad)


# ---------------------------------------------------------------------------- versions


def test_versions_compare_as_far_as_both_are_known():
    assert trt.same_release("10.8.0.43", "10.8.0")  # a library file names no build
    assert trt.same_release("10.8.0", "10.8.0.43")
    assert not trt.same_release("10.8.0.43", "10.8.0.40")  # the build counts where both know it
    assert not trt.same_release("10.8.0", "10.8.1")
    assert not trt.same_release("10.8", "10.8.0.43")  # major.minor alone is not enough
    with pytest.raises(ConfigError, match="not numbers and dots"):
        trt.same_release("10.8.0", "r10")


def test_trtexec_banners_give_the_full_version():
    # TensorRT's samples/common/logging.h: "[TensorRT v" NV_TENSORRT_VERSION "] [b" BUILD "]"
    banner = "&&&& RUNNING TensorRT.trtexec [TensorRT v100800] [b43] # trtexec --help"
    assert trt.parse_banner(banner) == "10.8.0.43"
    assert trt.parse_trt_version(banner) == (10, 8)  # what picks trtexec's flags, as before
    assert trt.parse_banner("[TensorRT v8501] # trtexec") == "8.5.1"  # major*1000 before 9
    assert trt.parse_banner("[TensorRT v8203]") == "8.2.3"
    assert trt.parse_banner("[TensorRT v90300] [b2]") == "9.3.0.2"  # major*10000 from 9 on
    assert trt.parse_trt_version("[TensorRT v90300]") == (9, 3)
    assert trt.parse_banner("no banner") is None


# ---------------------------------------------------------------------------- DAG time


def test_a_run_whose_images_ship_different_tensorrt_is_refused_naming_both():
    config = config_with(triton_25_01="10.9.0.34")
    message = (
        r"a TensorRT engine loads only in the TensorRT that built it, but its engines "
        r"\(tensorrt\) are built in image 'pytorch-25\.01' with TensorRT 10\.8\.0\.43 and "
        r"loaded in image 'triton-25\.01' with TensorRT 10\.9\.0\.34 \(images\.pytorch-25\.01"
        r"\.release\.tensorrt, images\.triton-25\.01\.release\.tensorrt\)"
    )
    with pytest.raises(ConfigError, match="^tft/A30/trt/fp16: " + message):
        dbplan.plan_run(config, "tft", "A30", "trt", "fp16")
    # the preflight of either image plans the runs on that GPU (bert's trt run first)
    with pytest.raises(ConfigError, match=message):
        plan_preflight(config, "A30", "triton-25.01")
    # a build differs: another TensorRT too
    with pytest.raises(ConfigError, match=r"10\.8\.0\.43 .* 10\.8\.0\.40"):
        dbplan.plan_run(config_with(triton_25_01="10.8.0.40"), "tft", "A30", "trt", "fp16")
    # tf-trt: TF-TRT builds in the TensorFlow image, the tensorflow backend loads in Triton's
    config = config_with(tensorflow_25_02="10.7.0.23")
    with pytest.raises(ConfigError, match=r"'tensorflow-25\.02' with TensorRT 10\.7\.0\.23 .*"):
        dbplan.plan_run(config, "resnet50", "A30", "tf-trt", "fp16")


def test_runs_without_an_engine_from_the_convert_image_need_no_match():
    config = config_with(triton_25_01="10.9.0.34", triton_25_02_tf=None)
    # onnx-trt: ONNX Runtime builds its engine inside Triton; onnx, ts-trace: no engine
    for path in ("bert/A30/onnx-trt/fp16", "tft/A30/onnx/fp32", "tft/A30/ts-trace/fp16"):
        run = dbplan.plan_run(config, *path.split("/"))
        assert run.tensorrt is None and "tensorrt" not in run.spec("repository")
    assert dbplan.plan_run(config, "resnet50", "A30", "tf-savedmodel", "fp32").tensorrt is None


def test_a_missing_version_is_refused_saying_to_record_it():
    config = config_with(pytorch_25_01=None)
    with pytest.raises(
        ConfigError,
        match=r"images\.pytorch-25\.01\.release\.tensorrt is not recorded: record the TensorRT "
        r"version the image's NGC release notes list",
    ):
        dbplan.plan_run(config, "tft", "A30", "trt", "fp32")


def test_the_run_carries_the_version_to_its_repository_and_preflight_specs():
    config = validated(base_config())
    run = dbplan.plan_run(config, "tft", "A30", "trt", "fp16")
    expected = {"image": "triton-25.01", "version": NGC_25_0X, "built_in": "pytorch-25.01"}
    assert run.spec("repository")["tensorrt"] == expected
    assert plan_preflight(config, "A30", "triton-25.01")["tensorrt_engines"] == ["tensorrt"]
    assert plan_preflight(config, "A30", "pytorch-25.01")["tensorrt_engines"] == ["tensorrt"]
    assert "tf-trt" in plan_preflight(config, "A30", "triton-25.02-tf")["tensorrt_engines"]
    assert plan_preflight(config, "cpu", "triton-25.01")["tensorrt_engines"] == []


def test_dry_run_of_a_mismatched_pair_fails_at_dag_time_naming_both(tmp_path: Path):
    write_config(tmp_path, config_with(triton_25_01="10.9.0.34"))
    result = run_snakemake(tmp_path, "-n", "results/tft/A30/trt/fp16/online.csv", timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert (
        "built in image 'pytorch-25.01' with TensorRT 10.8.0.43 and loaded in image "
        "'triton-25.01' with TensorRT 10.9.0.34" in out
    ), out[-3000:]
    assert not (tmp_path / "results").exists()
    # the same target with the shipped config plans its jobs
    write_config(tmp_path, base_config())
    ok = run_snakemake(tmp_path, "-n", "results/tft/A30/trt/fp16/online.csv", timeout=120)
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]
    assert planned_jobs(ok)["convert"] == 1


# ---------------------------------------------------------------------------- preflight


def spec_of(gpu: str, image: str, **changes: Any) -> preflight.PreflightSpec:
    spec: Any = plan_preflight(validated(base_config()), gpu, image)
    spec.update(changes)
    return spec


def with_release(spec: preflight.PreflightSpec, version: str | None) -> preflight.PreflightSpec:
    release = dict(spec["release"] or {})
    if version is None:
        release.pop("tensorrt", None)
    else:
        release["tensorrt"] = version
    changed: Any = {**spec, "release": release}
    return changed


TRTEXEC_HELP = """&&&& RUNNING TensorRT.trtexec [TensorRT v100800] [b43] # trtexec --help
  --onnx=<file> --saveEngine=<file> --minShapes=spec --optShapes=spec --maxShapes=spec
  --memPoolSize=poolspec --skipInference --fp16"""


def write_trtexec(folder: Path, banner: str = TRTEXEC_HELP) -> None:
    """A stand-in trtexec: ``--help`` prints ``banner``; a build writes a plan whose header
    names the banner's version (as TensorRT 10's do), so the convert step can run here."""
    folder.mkdir(parents=True, exist_ok=True)
    plan = plan_bytes(trt.parse_banner(banner) or "0.0.0.0")
    exe = folder / "trtexec"
    exe.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "plans = [a.split('=', 1)[1] for a in sys.argv[1:] if a.startswith('--saveEngine=')]\n"
        "if not plans:\n"
        f"    print({banner!r})\n"
        "for path in plans:\n"
        f"    open(path, 'wb').write({plan!r})\n"
    )
    exe.chmod(0o755)


def plan_bytes(version: str) -> bytes:
    """A serialized engine's header as TensorRT writes it (tag "ftrt", serialization version 0,
    the builder's major.minor.patch.build at bytes 24-27) and some body."""
    numbers = [int(p) for p in version.split(".")] + [0] * 4
    return struct.pack("<II16x4B", trt.PLAN_TAG, 0, *numbers[:4]) + b"\0" * 100


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch):
    def put(folder: Path) -> None:
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")

    return put


def test_trtexec_check_compares_its_real_version_with_the_images(tmp_path, on_path):
    on_path(tmp_path / "bin")
    write_trtexec(tmp_path / "bin")
    spec = spec_of("A30", "pytorch-25.01")
    check = check_trtexec(spec)
    assert check.status == "pass", check
    assert check.facts["tensorrt_release"] == NGC_25_0X and check.facts["recorded"] == NGC_25_0X
    assert "images.pytorch-25.01.release.tensorrt 10.8.0.43" in check.detail

    check = check_trtexec(with_release(spec, "10.9.0.34"))
    assert check.status == "fail"
    assert "trtexec" in check.detail and "is TensorRT 10.8.0.43" in check.detail
    assert "images.pytorch-25.01.release.tensorrt is 10.9.0.34" in check.detail
    assert "images.pytorch-25.01.from" in check.fix
    # nothing recorded: the flags still pass, the version is not compared
    check = check_trtexec(with_release(spec, None))
    assert check.status == "pass" and "not recorded: not compared" in check.detail


def write_backend(root: Path, backend: str, *libraries: str) -> Path:
    """A stand-in Triton backend folder: ``<root>/<backend>/libtriton_<backend>.so`` (not an
    ELF: ldd finds nothing in it) and the libnvinfer files named, the first one real and the
    others links to it (libnvinfer.so.10 -> libnvinfer.so.10.8.0, as the deb installs them)."""
    folder = root / backend
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"libtriton_{backend}.so").write_text("not a library")
    if libraries:
        (folder / libraries[0]).write_text("not a library either")
        for link in libraries[1:]:
            (folder / link).symlink_to(libraries[0])
    return root


def test_triton_check_reads_the_libnvinfer_its_tensorrt_backend_loads(tmp_path, monkeypatch):
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    root = write_backend(
        tmp_path / "backends", "tensorrt", "libnvinfer.so.10.8.0", "libnvinfer.so.10"
    )
    monkeypatch.setattr(tools, "backend_directory", lambda: root)
    spec = spec_of("A30", "triton-25.01")
    check = check_tensorrt_version(spec)
    assert check.status == "pass", check
    assert "tensorrt backend: TensorRT 10.8.0" in check.detail
    found = check.facts["found"]["tensorrt backend"]
    assert found["library"] == str(root / "tensorrt" / "libnvinfer.so.10")

    # the image ships another TensorRT than it records: fail, naming both
    check = check_tensorrt_version(with_release(spec, "10.9.0.34"))
    assert check.status == "fail"
    assert (
        "tensorrt backend is TensorRT 10.8.0, but images.triton-25.01.release.tensorrt is "
        "10.9.0.34" in check.detail
    )
    assert "would not load here" in check.fix

    # no libnvinfer where the backend loads it from
    (root / "tensorrt" / "libnvinfer.so.10").unlink()
    (root / "tensorrt" / "libnvinfer.so.10.8.0").unlink()
    monkeypatch.setattr(trt, "run_probe", lambda *a, **k: {"error": "not found"})
    check = check_tensorrt_version(spec)
    assert check.status == "fail" and "could not be read" in check.detail
    assert "full NGC tritonserver image" in check.fix


def test_the_library_ldd_resolves_is_the_one_read(tmp_path, monkeypatch, on_path):
    """A real backend links libnvinfer: what ``ldd`` resolves wins over names lying about."""
    root = write_backend(tmp_path / "backends", "tensorrt", "libnvinfer.so.10.7.0")
    system = tmp_path / "lib"
    system.mkdir()
    (system / "libnvinfer.so.10.8.0").write_text("the loader's")
    (system / "libnvinfer.so.10").symlink_to("libnvinfer.so.10.8.0")
    ldd = tmp_path / "bin" / "ldd"
    ldd.parent.mkdir()
    ldd.write_text(
        "#!/bin/sh\n"
        "echo '\tlinux-vdso.so.1 (0x00007ffd)'\n"
        f"echo '\tlibnvinfer.so.10 => {system}/libnvinfer.so.10 (0x00007f00)'\n"
    )
    ldd.chmod(0o755)
    on_path(ldd.parent)
    library = trt.backend_tensorrt(root, "tensorrt", 10)
    assert library.path == system / "libnvinfer.so.10"
    assert library.version == "10.8.0" and f"ldd {root}" in library.how


def test_tf_trt_in_triton_is_the_libnvinfer_it_would_dlopen(tmp_path, monkeypatch):
    """The tensorflow backend's TF-TRT dlopens libnvinfer.so.<major>: LD_LIBRARY_PATH here."""
    root = write_backend(tmp_path / "backends", "tensorflow")
    libs = tmp_path / "tensorrt-lib"
    libs.mkdir()
    (libs / "libnvinfer.so.10.7.0").write_text("x")
    (libs / "libnvinfer.so.10").symlink_to("libnvinfer.so.10.7.0")
    (libs / "libnvinfer.so.8.6.1").write_text("another major: not the one dlopen asks for")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libs))
    monkeypatch.setattr(tools, "backend_directory", lambda: root)
    spec: Any = {**spec_of("A30", "triton-25.02-tf"), "tensorrt_engines": ["tf-trt"]}
    check = check_tensorrt_version(spec)
    assert check.status == "fail", check
    assert (
        "tensorflow backend is TensorRT 10.7.0, but images.triton-25.02-tf.release.tensorrt is "
        "10.8.0.43" in check.detail
    )


def write_tf_trt(folder: Path, loaded: tuple[int, int, int]) -> None:
    """A stand-in for TF-TRT's bindings (tensorflow.compiler.tf2tensorrt._pywrap_py_utils)."""
    module = folder / "tensorflow" / "compiler" / "tf2tensorrt"
    module.mkdir(parents=True)
    for package in (folder / "tensorflow", folder / "tensorflow" / "compiler", module):
        (package / "__init__.py").write_text("")
    (module / "_pywrap_py_utils.py").write_text(
        f"def get_linked_tensorrt_version():\n    return (10, 8, 0)\n"
        f"def get_loaded_tensorrt_version():\n    return {loaded!r}\n"
    )


@pytest.mark.parametrize(
    ("loaded", "status", "said"),
    [
        ((10, 8, 0), "pass", "TF-TRT: TensorRT 10.8.0"),
        ((10, 7, 0), "fail", "TF-TRT is TensorRT 10.7.0, but images.tensorflow-25.02"),
        ((0, 0, 0), "fail", "loads no TensorRT"),  # PyPI's TensorFlow
    ],
)
def test_framework_check_reads_the_tensorrt_tf_trt_loads(
    tmp_path, monkeypatch, loaded, status, said
):
    write_tf_trt(tmp_path / "stand-in", loaded)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "stand-in"))
    spec = spec_of("A30", "tensorflow-25.02")
    assert spec["tensorrt_engines"] == ["tensorrt", "tf-trt"]  # trtexec's is its own check
    check = check_tensorrt_version(spec)
    assert check.status == status, check
    assert said in check.detail


def test_the_check_skips_where_no_engine_is_built_or_loaded():
    assert check_tensorrt_version(spec_of("cpu", "triton-25.01")).status == "skip"
    only_trtexec = spec_of("A30", "pytorch-25.01")
    check = check_tensorrt_version(only_trtexec)
    assert check.status == "skip" and "trtexec check" in check.detail
    assert "tensorrt_version" in preflight.CHECKS


# ---------------------------------------------------------------------------- the repository step


def write_artifact(folder: Path, header: str | None, recorded: str | None) -> tuple[str, str]:
    """A plan (``header``: its builder's version; None: not a plan) and its provenance, whose
    conversion records ``recorded``."""
    folder.mkdir(parents=True, exist_ok=True)
    plan = folder / "model.plan"
    plan.write_bytes(plan_bytes(header) if header else b"not a plan")
    provenance = folder / "model.plan.provenance.json"
    from deploybench import provenance as sidecar

    record = sidecar.collect(
        str(plan), {}, conversion={"converter": "tensorrt", "tensorrt": recorded}
    )
    provenance.write_text(json.dumps(record))
    return str(plan), str(provenance)


EXPECTED = {"image": "triton-25.01", "version": NGC_25_0X, "built_in": "pytorch-25.01"}


def test_a_plan_of_the_serving_images_tensorrt_is_accepted(tmp_path):
    plan, provenance = write_artifact(tmp_path, NGC_25_0X, NGC_25_0X)
    assert trt.plan_version(plan) == NGC_25_0X
    assert trt.check_engine(plan, provenance, EXPECTED) == NGC_25_0X
    # an older record (no conversion.tensorrt): the plan's own header says it
    plan, provenance = write_artifact(tmp_path / "old", NGC_25_0X, None)
    assert trt.check_engine(plan, provenance, EXPECTED) == NGC_25_0X


def test_a_plan_another_tensorrt_built_is_refused_naming_both(tmp_path):
    plan, provenance = write_artifact(tmp_path, "10.7.0.23", "10.7.0.23")
    with pytest.raises(
        EngineVersionMismatch,
        match=r"model\.plan was built by TensorRT 10\.7\.0\.23 \(.*provenance\.json\), but image "
        r"'triton-25\.01' serves it with TensorRT 10\.8\.0\.43 .*rebuild it in the framework "
        r"image \(image 'pytorch-25\.01'\) with `snakemake --forcerun .*model\.plan <target>`",
    ):
        trt.check_engine(plan, provenance, EXPECTED)
    # the header alone (no record) is enough to refuse
    plan, provenance = write_artifact(tmp_path / "header", "10.7.0.23", None)
    with pytest.raises(EngineVersionMismatch, match=r"10\.7\.0\.23 \(its header\)"):
        trt.check_engine(plan, provenance, EXPECTED)
    # a record that the header contradicts: which built it is unknown
    plan, provenance = write_artifact(tmp_path / "both", "10.7.0.23", NGC_25_0X)
    with pytest.raises(
        EngineVersionMismatch, match=r"records TensorRT 10\.8\.0\.43 but its header"
    ):
        trt.check_engine(plan, provenance, EXPECTED)


def test_an_engine_of_unknown_tensorrt_is_refused(tmp_path):
    """No record and no readable header (trtexec printed no banner; a TF-TRT SavedModel): an
    unknown version is the late failure this check exists to prevent."""
    plan, provenance = write_artifact(tmp_path, None, None)
    with pytest.raises(EngineVersionMismatch, match="no record of the TensorRT that built it"):
        trt.check_engine(plan, provenance, EXPECTED)


def test_the_repository_job_refuses_before_building_anything(tmp_path):
    spec = dbplan.plan_run(validated(base_config()), "tft", "A30", "trt", "fp16").repository_spec()
    plan, provenance = write_artifact(tmp_path, "10.9.0.34", "10.9.0.34")
    repository = tmp_path / "repository"
    with pytest.raises(EngineVersionMismatch, match="image 'triton-25.01' serves it with"):
        jobs.repository(
            spec,
            artifact=plan,
            artifact_provenance=provenance,
            signature=[],
            repository=str(repository),
        )
    assert not repository.exists()


def test_convert_records_the_version_that_built_the_plan(tmp_path, on_path, monkeypatch):
    """Up to the GPU: the stand-in trtexec "builds" a plan; the record holds its full version,
    and the repository step accepts it for the serving image of that version."""
    import onnx
    from onnx import TensorProto, helper

    on_path(tmp_path / "bin")
    write_trtexec(tmp_path / "bin")
    monkeypatch.setattr(cv, "gpu_visible", lambda: True)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    source = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), source)
    out = tmp_path / "model.plan"
    record = cv.convert(
        "tensorrt",
        source=source,
        out=out,
        precision="fp16",
        settings={"min_batch": 1, "opt_batch": 8, "max_batch": 8, "workspace_mb": 16},
        inputs=[TensorSpec("x", "float32", (4,))],
        example_inputs=lambda batch: {},
    )
    assert record["tensorrt"] == NGC_25_0X and record["trtexec"] == "TensorRT 10.8"
    assert trt.plan_version(out) == NGC_25_0X
    provenance = tmp_path / "model.plan.provenance.json"
    provenance.write_text(json.dumps({"conversion": record}))
    assert trt.check_engine(str(out), str(provenance), EXPECTED) == NGC_25_0X
