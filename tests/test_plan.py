"""One plan per run: every decision about a run made once and frozen; each step's job spec holds
only what that step reads, so Snakemake's params trigger reruns only the steps a change concerns;
one entry point runs each rule's job with its spec and the files its rule names."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pickle
from pathlib import Path

import pytest
from snakemake.utils import validate

from deploybench import jobs
from deploybench.perf import MeasureSettings
from deploybench.planning import resources as dbresources
from deploybench.planning import run_plan as dbplan
from deploybench.planning import serving_plan as dbserving
from deploybench.planning.export_plan import plan_export, plan_model
from deploybench.planning.preflight_plan import plan_preflight
from deploybench.planning.workflow_config import ConfigError, all_runs, containers_on, deep_merge
from tests.conftest import REPO, base_config, write_config

SCHEMA = REPO / "config" / "schema" / "config.schema.yaml"
CPU_RUN = "tft/cpu/onnx/fp32"


def workflow_config(overrides: dict | None = None) -> dict:
    """The shipped config (with ``overrides``) as the workflow sees it: schema defaults filled."""
    config = deep_merge(base_config(), overrides or {})
    validate(config, str(SCHEMA))
    return config


def step_specs(config: dict, path: str) -> dict[str, dict]:
    """The spec of every job of the run ``path``, by rule."""
    plan = dbplan.plan_run(config, *path.split("/"))
    specs = {
        "prepare_checkpoint": plan.export.model.checkpoint_spec(),
        "export": plan.export.spec(),
    }
    for step in dbplan.RUN_STEPS:
        if step != "convert" or plan.conversion is not None:
            specs[step] = plan.spec(step)
    return specs


def test_plan_is_frozen_and_specs_are_fresh_copies():
    plan = dbplan.plan_run(workflow_config(), "tft", "A30", "trt", "fp16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.precision = "fp32"  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.triton["max_batch_size"] = 1  # type: ignore[index]
    spec = plan.spec("online")
    spec["points"].clear()
    spec["run"]["gpu"] = "T4"
    assert plan.spec("online")["points"] and plan.spec("online")["run"]["gpu"] == "A30"


def _drivable(config: dict, run: str) -> bool:
    model, gpu = run.split("/")[:2]
    try:
        containers_on(config, model, gpu)  # the newest images that drive it, if any
    except ConfigError:
        return False
    return True


def test_every_spec_of_every_run_is_plain_data():
    config = workflow_config()
    # (the PyTorch models' Triton image drives no B200: test_every_new_gpu_plans_...)
    runs = [r for r in all_runs(config) if _drivable(config, r)]
    assert len(runs) > 100
    for path in runs:
        for rule, spec in step_specs(config, path).items():
            # Snakemake's params trigger compares plain values only (it ignores anything else)
            assert type(spec) is dict, (path, rule)
            # what a job receives: Snakemake pickles it into the script; provenance writes JSON
            assert json.loads(json.dumps(spec)) == spec, (path, rule)
            assert pickle.loads(pickle.dumps(spec)) == spec, (path, rule)


def test_specs_carry_what_the_jobs_and_provenance_read():
    config = workflow_config()
    plan = dbplan.plan_run(config, *CPU_RUN.split("/"))
    sizing = config["sizings"]["cpu"]["tft"]["perf"]
    offline, online = plan.spec("offline"), plan.spec("online")
    assert offline["points"] == [{"batch": b, "concurrency": 1} for b in [1, 8, 32]]
    assert online["points"] == [
        {"batch": 1, "concurrency": c} for c in sizing["online"]["concurrency"]
    ]
    assert offline["measure"]["request_count"] == sizing["request_count"]
    # the measurement settings are exactly what perf measures a point with
    # (less the optional ones this config leaves unset)
    assert set(offline["measure"]) == {f.name for f in dataclasses.fields(MeasureSettings)} - {
        "max_windows"
    }
    MeasureSettings(**offline["measure"])
    assert offline["run"] == online["run"] == plan.spec("accuracy")["run"]
    assert offline["run"]["backend"] == "python" and offline["run"]["runtime"] == "onnxruntime"
    assert plan.spec("repository")["serving"] == {"backend": "python", "runtime": "onnxruntime"}
    assert plan.conversion is None and not plan.serves_export_inputs


def test_gpu_run_plan_names_conversion_serving_and_its_gpu():
    config = workflow_config()
    trt = dbplan.plan_run(config, "tft", "A30", "trt", "fp16")
    assert trt.conversion is not None and trt.conversion.converter == "tensorrt"
    convert = trt.spec("convert")
    assert convert["settings"]["max_batch"] == convert["settings"]["opt_batch"] == 1024
    assert trt.spec("repository")["serving"]["platform"] == "tensorrt_plan"
    assert trt.serves_export_inputs and trt.export.format == "onnx" and trt.artifact == "model.plan"
    a30 = config["gpus"]["A30"]["slurm"]
    assert trt.gpu_request == dbresources.GpuRequest(
        gpu=1,
        gpu_model=a30["gpu_model"],
        gres=None,
        slurm_partition=a30["partition"],
        constraint=a30["constraint"],
        slurm_account=None,
        qos=None,
        slurm_extra=None,
    )
    cpu = dbplan.plan_run(config, *CPU_RUN.split("/"))
    assert cpu.gpu_request.gpu == 0 and cpu.gpu_request.gpu_model is None


@pytest.mark.parametrize(
    ("path", "overrides", "changed"),
    [
        # the docs' promise (docs/configuration.md): the online concurrency reruns online.csv only
        (
            CPU_RUN,
            {"sizings": {"cpu": {"tft": {"perf": {"online": {"concurrency": [1, 3]}}}}}},
            {"online"},
        ),
        (
            CPU_RUN,
            {"sizings": {"cpu": {"tft": {"perf": {"request_count": 7}}}}},
            {"offline", "online"},
        ),
        # an optional setting: absent, the specs are those of a config that predates it
        (
            CPU_RUN,
            {"sizings": {"cpu": {"tft": {"perf": {"max_windows": 4}}}}},
            {"offline", "online"},
        ),
        (
            CPU_RUN,
            {"models": {"tft": {"accuracy": {"tolerance": {"target__0": {"atol": 1.0}}}}}},
            {"accuracy"},
        ),
        (CPU_RUN, {"models": {"tft": {"export": {"onnx_opset": 16}}}}, {"export"}),
        (
            CPU_RUN,
            {"sizings": {"cpu": {"tft": {"triton": {"model_instances": 2}}}}},
            {"repository", "accuracy", "offline", "online"},
        ),
        # a new network (here its seed) reruns everything
        (
            CPU_RUN,
            {"models": {"tft": {"seed": 7}}},
            {"prepare_checkpoint", "export", "repository", "accuracy", "offline", "online"},
        ),
        (
            "tft/A30/trt/fp16",
            {"models": {"tft": {"convert": {"tensorrt": {"workspace_mb": 4096}}}}},
            {"convert"},
        ),
        # BERT's onnx-trt: the accelerator's workspace sizes the serving accelerator, not its
        # (onnx-fp16) conversion
        (
            "bert/A30/onnx-trt/fp16",
            {"models": {"bert": {"convert": {"tensorrt": {"accelerator_workspace_mb": 2048}}}}},
            {"repository"},
        ),
    ],
)
def test_a_change_reaches_only_the_specs_of_the_steps_it_concerns(path, overrides, changed):
    before = step_specs(workflow_config(), path)
    after = step_specs(workflow_config(overrides), path)
    assert {rule for rule in before if before[rule] != after[rule]} == changed


def test_an_unset_window_limit_leaves_the_measurement_spec_without_it():
    measure = step_specs(workflow_config(), CPU_RUN)["offline"]["measure"]
    assert "max_windows" not in measure
    assert MeasureSettings(**measure).max_windows is None


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda c: dbplan.plan_run(c, *CPU_RUN.split("/")).spec("convert"),
            ConfigError,
            "tft/cpu/onnx/fp32 serves its onnx export as it is: it has no conversion",
        ),
        (
            lambda c: dbplan.plan_run(c, *CPU_RUN.split("/")).spec("perf"),
            ValueError,
            "unknown step 'perf'; valid choices: convert, repository, accuracy, offline, online",
        ),
        (lambda c: plan_model(c, "bert9"), ConfigError, "unknown model 'bert9'; valid"),
        (
            lambda c: plan_export(c, "tft", "tflite", "fp32"),
            ConfigError,
            "unknown export format 'tflite'; valid choices: onnx, onnx-trt,",
        ),
    ],
)
def test_bad_requests_fail_naming_the_valid_choices(call, error, message):
    with pytest.raises(error) as err:
        call(workflow_config())
    assert message in str(err.value)


def test_a_cpu_format_without_a_cpu_runtime_fails_naming_the_key():
    config = workflow_config()
    del config["formats"]["onnx"]["cpu_runtime"]
    with pytest.raises(ConfigError, match=r"format 'onnx' has no CPU runtime \(formats.onnx"):
        dbplan.plan_run(config, *CPU_RUN.split("/"))


def test_configured_checkpoint_must_exist_when_planned(tmp_path):
    config = workflow_config()
    config["models"]["tft"]["checkpoint"] = str(tmp_path / "missing.pt")
    with pytest.raises(ConfigError, match="models.tft.checkpoint: .* does not exist"):
        plan_model(config, "tft")
    (tmp_path / "missing.pt").write_bytes(b"")
    assert plan_model(config, "tft").configured_checkpoint == str(tmp_path / "missing.pt")


def workflow_rules(workdir: Path) -> dict:
    """The rules of the workflow as Snakemake loads it (in ``workdir``, the shipped config)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import (
        ConfigSettings,
        OutputSettings,
        ResourceSettings,
        StorageSettings,
    )

    write_config(workdir, copy.deepcopy(base_config()))
    with SnakemakeApi(OutputSettings(quiet=True)) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(),
            storage_settings=StorageSettings(),
            snakefile=REPO / "Snakefile",
            workdir=workdir,
        )
        # the parsed rules (the API has no public listing of their named files)
        return {rule.name: rule for rule in workflow._workflow.rules}


def test_every_rule_with_a_script_runs_a_job_on_the_files_it_names(tmp_path):
    rules = workflow_rules(tmp_path)
    scripted = {name: rule for name, rule in rules.items() if rule.script}
    assert scripted.keys() == jobs.JOBS.keys()
    for name, rule in scripted.items():
        named = {*rule.input._names, *rule.output._names, *rule.log._names}
        files = dict.fromkeys(named - set(jobs.DAG_ONLY_INPUTS), "path")
        arguments = jobs.job_arguments(jobs.JOBS[name], name, files, {})
        # every file a job takes is one its rule names, and it takes its spec as the one param
        assert set(arguments) - {"config"} <= named, name
        assert list(rule.params._names) == ["spec"], name


def test_a_job_whose_rule_lacks_a_file_fails_naming_it():
    with pytest.raises(TypeError, match="rule 'convert' names no file 'artifact', which job"):
        jobs.job_arguments(jobs.convert, "convert", {"source": "model.onnx"}, {})


def test_scripts_only_call_the_entry_point():
    for script in sorted((REPO / "scripts").glob("*.py")):
        code = [
            line
            for line in script.read_text().splitlines()
            if line and not line.startswith(('"""', "from deploybench.jobs import run_rule"))
        ]
        assert code == [
            "run_rule(snakemake)  # noqa: F821 - injected by Snakemake's script directive"
        ], script


# ------------------------------------------------------------------------ cluster limits


def test_runtime_is_the_steps_minutes_plus_its_trials_times_the_margin():
    config = workflow_config(
        {"runtime": {"margin": 1.5, "per_point": 2, "steps": {"convert": 7, "offline": 3}}}
    )
    plan = dbplan.plan_run(config, "tft", "A30", "trt", "fp16")
    trials = len(plan.points["offline"]) * plan.measure["trials"]
    assert plan.measure["trials"] == 3  # the schema's default
    assert plan.runtime["convert"] == 11  # ceil(7 * 1.5)
    assert plan.runtime["offline"] == -(-(3 + 2 * trials) * 3 // 2)  # ceil((3 + 2n) * 1.5)
    # a model's own `runtime` overrides the workflow's, for that model only
    config["models"]["tft"]["runtime"] = {"steps": {"export": 40}}
    assert plan_model(config, "tft").runtime["export"] == 60
    assert plan_model(config, "bert").runtime["export"] == math.ceil(
        config["runtime"]["steps"]["export"] * 1.5
    )


def test_every_image_that_converts_with_trtexec_has_it_checked_by_its_preflight():
    """NGC documents trtexec in its TensorRT image, not in the PyTorch or TensorFlow ones that
    convert here (ResNet-50's `trt` converts in tensorflow-*): wherever a run converts with
    trtexec, the preflight of that image on that GPU checks trtexec and the flags it needs."""
    config = workflow_config()
    seen = set()
    for path in all_runs(config):
        gpu = path.split("/")[1]
        run = dbplan.plan_run(config, *path.split("/"))
        if run.conversion is None or run.conversion.converter != "tensorrt":
            continue
        image = run.containers["framework"]
        if (gpu, image) not in seen:
            seen.add((gpu, image))
            assert "--saveEngine" in plan_preflight(config, gpu, image)["trtexec_flags"], path
    # the data holds both kinds of framework image among them
    assert {i.split("-")[0] for _, i in seen} == {"pytorch", "tensorflow"}, seen


def test_preflight_plan_says_what_the_runs_on_a_gpu_need_of_an_image():
    config = workflow_config()
    triton = plan_preflight(config, "A30", "triton-25.01")
    assert triton["role"] == "triton" and triton["device"] == "gpu"
    # every native backend the PyTorch models' A30 runs are served with
    assert {"onnxruntime", "pytorch", "tensorrt"} <= set(triton["backends"])
    assert triton["trtexec_flags"] == []
    framework = plan_preflight(config, "A30", "pytorch-25.01")
    assert framework["role"] == "framework" and framework["backends"] == []
    # the flags the convert step passes trtexec, by name
    assert {"--onnx", "--saveEngine", "--minShapes", "--fp16"} <= set(framework["trtexec_flags"])
    cpu = plan_preflight(config, "cpu", "triton-25.01")
    assert cpu["backends"] == ["python"] and cpu["device"] == "cpu"
    with pytest.raises(ConfigError, match="valid choices: pytorch-25.01, tensorflow-25.02, "):
        plan_preflight(config, "A30", "tensorflow-25.02x")
    with pytest.raises(ConfigError, match="unknown gpu 'P100'"):
        plan_preflight(config, "P100", "triton-25.01")


def test_duration_floor_above_the_cap_is_refused():
    config = workflow_config(
        {"models": {"tft": {"perf": {"min_duration_ms": 9000, "max_duration_ms": 5000}}}}
    )
    with pytest.raises(ConfigError, match=r"min_duration_ms \(9000\) exceeds .*\(5000\)"):
        dbplan.plan_run(config, "tft", "A30", "trt", "fp16")


# ------------------------------------------------------------------------ GPUs and images

NEW_GPUS = ("H100_SXM", "H100_PCIe", "H200", "L40S", "L4", "B200")


def without_older_images(config: dict) -> dict:
    """``config`` with no image naming one for older GPUs (`older_gpus`)."""
    for image in config["images"].values():
        image.pop("older_gpus", None)
    return config


def test_a_gpu_its_images_cannot_drive_is_refused():
    config = without_older_images(workflow_config())
    # the resnet50 run's images are NGC 25.02's (7.5 and later): a V100 is 7.0
    message = (
        r"gpu 'V100' \(compute capability 7\.0\) cannot run image 'tensorflow-25\.02': its "
        r"release supports compute capability 7\.5 and later .*; the last NGC release that "
        r"supports 7\.0 \(Volta\) is 24\.12"
    )
    with pytest.raises(ConfigError, match=message):
        dbplan.plan_run(config, "resnet50", "V100", "tf-trt", "fp16")
    # the preflight of that pair, and of the Triton image the run serves with
    with pytest.raises(ConfigError, match=message):
        plan_preflight(config, "V100", "tensorflow-25.02")
    with pytest.raises(ConfigError, match="cannot run image 'triton-25.02-tf'"):
        plan_preflight(config, "V100", "triton-25.02-tf")
    # 25.01 already starts at 7.5 (its release notes): the PyTorch models' V100 runs too
    with pytest.raises(ConfigError, match="gpu 'V100' .* cannot run image 'pytorch-25.01'"):
        dbplan.plan_run(config, "tft", "V100", "trt", "fp16")


def test_a_v100_gets_the_newest_images_that_drive_it_and_exports_there():
    config = workflow_config()
    for model, fmt, framework, triton in (
        ("resnet50", "tf-trt", "tensorflow-24.09", "triton-24.09-tf"),
        ("tft", "trt", "pytorch-24.09", "triton-24.09"),
    ):
        plan = dbplan.plan_run(config, model, "V100", fmt, "fp16")
        assert dict(plan.containers) == {"framework": framework, "triton": triton}
        # engines built and loaded in one release's TensorRT (10.4: the last with Volta)
        assert plan.tensorrt == {"image": triton, "version": "10.4.0.26", "built_in": framework}
        # exported in its own framework image: torch 2.5 / TF 2.16 load their own exports
        assert plan.export.image_key == framework
        # a GPU the newest images drive keeps them, and the models' shared exports
        a30 = dbplan.plan_run(config, model, "A30", fmt, "fp16")
        assert a30.containers["framework"] != framework and a30.export.image_key is None
    assert plan_preflight(config, "V100", "triton-24.09")["image"] == "triton-24.09"
    with pytest.raises(ConfigError, match="gpu 'V100' .* cannot run image 'triton-25.01'"):
        plan_preflight(config, "V100", "triton-25.01")


def test_an_image_whose_tensorrt_dropped_the_gpu_is_passed_over():
    config = workflow_config()
    # 24.10 (6.0 and later, as its notes say) with TensorRT 10.5, which removed Volta: between
    # 25.01 and 24.09 in the chain, a V100 passes it over for 24.09
    for newer, older in (("pytorch-25.01", "pytorch-24.09"), ("triton-25.01", "triton-24.09")):
        middle = newer.replace("25.01", "24.10")
        config["images"][middle] = copy.deepcopy(config["images"][older])
        config["images"][middle]["release"]["tensorrt"] = "10.5.0.18"
        config["images"][middle]["older_gpus"] = older
        config["images"][newer]["older_gpus"] = middle
    plan = dbplan.plan_run(config, "tft", "V100", "trt", "fp16")
    assert dict(plan.containers) == {"framework": "pytorch-24.09", "triton": "triton-24.09"}
    # without 24.09 there is none: the newest image's reason is given
    config["images"]["pytorch-24.10"].pop("older_gpus")
    with pytest.raises(ConfigError, match="cannot run image 'pytorch-25.01'"):
        dbplan.plan_run(config, "tft", "V100", "trt", "fp16")
    from deploybench.gpus import check_tensorrt_drives

    with pytest.raises(
        ConfigError,
        match=r"its TensorRT 10\.5\.0\.18 builds no engines for it; "
        r"the last TensorRT that does is 10\.4",
    ):
        check_tensorrt_drives(config, "V100", "pytorch-24.10")


@pytest.mark.parametrize("gpu", NEW_GPUS)
def test_every_new_gpu_plans_the_published_formats(gpu):
    config = workflow_config()
    if gpu == "B200":  # the PyTorch models' Triton image: its PyPI torch stops at sm_90
        message = (
            r"gpu 'B200' \(compute capability 10\.0\) cannot run image 'triton-25\.01': it drives "
            r"compute capability up to 9\.0 only \(the lock's torch 2\.6\.0"
        )
        with pytest.raises(ConfigError, match=message):
            dbplan.plan_run(config, "tft", gpu, "trt", "fp16")
        with pytest.raises(ConfigError, match=message):
            plan_preflight(config, gpu, "triton-25.01")
    else:
        tft = dbplan.plan_run(config, "tft", gpu, "trt", "fp16")
        assert tft.gpu_request.gpu == 1 and tft.conversion is not None
    resnet = dbplan.plan_run(config, "resnet50", gpu, "tf-trt", "fp16")
    assert resnet.spec("repository")["serving"]["platform"] == "tensorflow_savedmodel"
    assert plan_preflight(config, gpu, "triton-25.02-tf")["device"] == "gpu"


@pytest.mark.parametrize("gpu", sorted(base_config()["gpus"]))
def test_every_configured_gpu_plans_its_runs_and_their_images_preflight(gpu):
    """A GPU is one config block: read from the config, each one's runs (every model, format
    and precision the config allows on it) plan, and so does the preflight of every image they
    run in. No test names a new GPU for it to be planned here."""
    config = workflow_config()
    runs = [run for run in all_runs(config) if run.split("/")[1] == gpu]
    assert runs, f"gpu {gpu!r}: the config allows no run on it"
    images = set()
    for run in runs:
        plan = dbplan.plan_run(config, *run.split("/"))
        assert plan.gpu == gpu
        images.update(plan.containers.values())
    for image in sorted(images):
        assert plan_preflight(config, gpu, image)["gpu"] == gpu


def test_compute_capabilities_compare_as_numbers():
    from deploybench.gpus import capability

    assert capability("7.5") < capability("10.0") and capability("8.9") < capability("9.0")
    with pytest.raises(ConfigError, match="not major.minor"):
        capability("9")
    # as strings "10.0" < "9.0": a B200 must still pass a 9.0 minimum, an L40S (8.9) not
    config = workflow_config()
    for image in config["images"].values():
        image["release"]["compute_capability"]["minimum"] = "9.0"
    dbplan.plan_run(config, "resnet50", "B200", "tf-trt", "fp16")
    with pytest.raises(
        ConfigError,
        match=r"compute capability 8\.9\) cannot run .*; "
        "compute_capabilities names no last NGC release that supports 8.9",
    ):
        dbplan.plan_run(config, "tft", "L40S", "trt", "fp16")


def test_schema_requires_a_gpus_compute_capability():
    import jsonschema
    import yaml

    schema = yaml.safe_load(SCHEMA.read_text())
    config = base_config()
    validator = jsonschema.Draft202012Validator(schema)
    assert not list(validator.iter_errors(config))
    del config["gpus"]["H200"]["compute_capability"]
    errors = [e.message for e in validator.iter_errors(config)]
    assert errors == ["'compute_capability' is a required property"]
    config["gpus"]["H200"]["compute_capability"] = "9"  # major.minor only
    assert [e.message for e in validator.iter_errors(config)] == [
        "'9' does not match '^[0-9]+\\\\.[0-9]+$'"
    ]
    # a CPU entry needs none
    assert "compute_capability" not in config["gpus"]["cpu"]


def test_fp32_torchscript_runs_matmuls_in_tf32_where_the_published_era_did():
    config = workflow_config()
    # 21.02 (nnU-Net, FastPitch) and 21.10 (BERT): PyTorch 1.8/1.10 allowed TF32 in cuBLAS
    for model, fmt in (("nnunet", "ts-script"), ("fastpitch", "ts-trace"), ("bert", "ts-trace")):
        server = dbplan.plan_run(config, model, "A100", fmt, "fp32").server
        assert server["environment"] == {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}, model
        # not its fp16 TorchScript, nor another backend, nor the CPU default
        assert "environment" not in dbplan.plan_run(config, model, "A100", fmt, "fp16").server
        assert "environment" not in dbplan.plan_run(config, model, "A100", "onnx", "fp32").server
        cpu = dbplan.plan_run(config, model, "cpu", fmt, "fp32")
        assert "environment" not in cpu.server
    # TFT's rows are 22.11's: PyTorch 1.13, TF32 off in cuBLAS by default
    assert "environment" not in dbplan.plan_run(config, "tft", "A30", "ts-trace", "fp32").server
    # the accuracy and perf jobs start their servers with it
    spec = dbplan.plan_run(config, "bert", "A100", "ts-trace", "fp32")
    assert spec.spec("offline")["server"]["environment"] == dbserving.TF32_MATMUL_ENV
    assert spec.spec("accuracy")["server"]["environment"] == dbserving.TF32_MATMUL_ENV


def test_berts_fp16_onnx_and_trt_start_from_an_fp16_export_as_dles():
    config = workflow_config()
    for fmt, converter in (("onnx", None), ("onnx-trt", None), ("trt", "tensorrt")):
        plan = dbplan.plan_run(config, "bert", "A30", fmt, "fp16")
        assert plan.export.precision == "fp16", fmt  # results/bert/export/onnx/fp16/model.onnx
        assert (plan.conversion.converter if plan.conversion else None) == converter, fmt
        # float16 logits, as the halved module's export (and the engine built from it) serve
        assert dict(plan.serving["tensor_types"]) == {"float32": "float16"}, fmt
        assert plan.export.spec()["tolerance"]["output__0"]["atol"] == 5.0
    # fp16 TorchScript is its converter's (the halved module traced), fp32 the fp32 export's
    ts = dbplan.plan_run(config, "bert", "A30", "ts-trace", "fp16")
    assert ts.export.precision == "fp32" and ts.conversion.converter == "torchscript-fp16"
    assert dbplan.plan_run(config, "bert", "A30", "onnx", "fp32").export.precision == "fp32"
    # the other models keep converting their fp32 export
    tft = dbplan.plan_run(config, "tft", "A30", "onnx", "fp16")
    assert tft.export.precision == "fp32" and tft.conversion.converter == "onnx-fp16"
