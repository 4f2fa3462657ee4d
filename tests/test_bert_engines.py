"""BERT's TensorRT engines per batch size, as DLE deployed them (issue 27, item 5), up to the GPU.

DLE's BERT-large runner (PyTorch/LanguageModeling/BERT/triton/large/runner) ran each batch size
as its own experiment (config_NVIDIA-*.yaml: max_batch_size = batch_sizes = 1, 8 or 16) whose
engine was built with min = opt = max shapes ${MAX_BATCH_SIZE}x384 (pipeline_impl.py,
`model-navigator convert`, 8 GiB workspace); its ONNX Runtime + TensorRT deployments got Model
Navigator's default workspace, 4 GiB (`triton-config-model` sets no
--tensorrt-max-workspace-size; model_navigator v0.2.3 core.py DEFAULT_TENSORRT_MAX_WORKSPACE_SIZE).
`models.bert.convert.tensorrt.engines: per_batch` does that; `shared` is one engine over 1..16.
No GPU and no TensorRT here: the dry run's jobs, the trtexec command lines the convert jobs would
run, and the config.pbtxt files the repository job writes (with a stand-in trtexec for trt).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from deploybench import convert as cv
from deploybench import jobs
from deploybench import model_repository as repo_mod
from deploybench.errors import ConfigError, NeedsGPU
from deploybench.io import sha256_of
from deploybench.jobs import measure as measure_jobs
from deploybench.planning import engines as dbengines
from deploybench.planning import run_plan as dbplan
from deploybench.planning import serving_plan as dbserving
from deploybench.planning import workflow_config as dbc
from deploybench.planning.config_search_plan import plan_search
from deploybench.report import configuration_table
from deploybench.triton_config import read_config
from tests.conftest import base_config, planned_jobs, run_snakemake, validated, write_config
from tests.test_tensorrt_versions import write_trtexec

TRT = ("bert", "A30", "trt", "fp16")
ONNX_TRT = ("bert", "A30", "onnx-trt", "fp16")
BATCHES = (1, 8, 16)  # the seed page's offline batch sizes (models.bert.perf.offline)
GIB = 2**30
SEQ = 384
INPUTS = ("input__0", "input__1", "input__2")


def with_layout(layout: str | None) -> dict[str, Any]:
    """The shipped config, validated, with BERT's engine layout set (None: the key removed)."""
    config = base_config()
    section = config["models"]["bert"]["convert"]["tensorrt"]
    if layout is None:
        section.pop("engines", None)
    else:
        section["engines"] = layout
    return validated(config)


def shapes(batch: int) -> str:
    return ",".join(f"{name}:{batch}x{SEQ}" for name in INPUTS)


def bert_signature_onnx(path: Path) -> Path:
    """A tiny ONNX graph with BERT's served signature (3 int32 [batch, 384] inputs, 2 float32
    outputs): what trtexec's command and the served inputs are made from."""
    import onnx
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", SEQ]) for n in INPUTS]
    outputs = [
        helper.make_tensor_value_info(f"output__{k}", TensorProto.FLOAT, ["batch", SEQ])
        for k in range(2)
    ]
    nodes = [
        helper.make_node("Cast", [INPUTS[k]], [f"output__{k}"], to=TensorProto.FLOAT)
        for k in range(2)
    ]
    graph = helper.make_graph(nodes, "bert_signature", inputs, outputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    (path.parent / f"{path.name}.provenance.json").write_text(
        json.dumps({"sha256": sha256_of(path)})
    )
    return path


# ---------------------------------------------------------------------------- the plan


def test_bert_defaults_to_an_engine_per_offline_batch_size():
    config = validated(base_config())  # the shipped config says per_batch
    assert config["models"]["bert"]["convert"]["tensorrt"]["engines"] == "per_batch"
    assert tuple(config["models"]["bert"]["perf"]["offline"]["batch_sizes"]) == BATCHES
    # without the key: one shared engine, as every other model
    assert dbplan.plan_run(with_layout(None), *TRT).engines == (
        dbengines.EngineLayout("shared", (), converted=True)
    )
    trt = dbplan.plan_run(config, *TRT)
    assert trt.engines == dbengines.EngineLayout("per_batch", BATCHES, converted=True)
    assert trt.converted_batches == BATCHES
    # one conversion per batch after the shared one, each its own job on a cluster
    assert [job for job, _ in trt.jobs()][:5] == [
        "convert", "convert.b1", "convert.b8", "convert.b16", "repository"
    ]  # fmt: skip
    onnx_trt = dbplan.plan_run(config, *ONNX_TRT)
    assert onnx_trt.engines == dbengines.EngineLayout("per_batch", BATCHES, converted=False)
    assert onnx_trt.converted_batches == ()  # ONNX Runtime builds them while the models load
    # runs without TensorRT engines have no layout; nothing about them changes
    for other in (("bert", "A30", "onnx", "fp16"), ("bert", "cpu", "onnx", "fp32")):
        plan = dbplan.plan_run(config, *other)
        assert plan.engines is None and "engines" not in plan.info, other
        assert "batch_models" not in plan.spec("offline"), other
    # other models keep one shared engine
    assert dbplan.plan_run(config, "tft", "A30", "trt", "fp16").engines == (
        dbengines.EngineLayout("shared", (), converted=True)
    )


def test_each_batch_engine_is_min_opt_max_at_its_batch_the_shared_one_as_before():
    trt = dbplan.plan_run(with_layout("per_batch"), *TRT)
    shared = trt.convert_spec()
    assert shared == dbplan.plan_run(with_layout("shared"), *TRT).convert_spec()
    assert shared["settings"] == {
        "min_batch": 1, "opt_batch": 16, "max_batch": 16, "workspace_mb": 8192, "shapes": {}
    }  # fmt: skip
    for batch in BATCHES:
        spec = trt.convert_spec(batch)
        assert spec["settings"] == {**shared["settings"], "min_batch": batch,
                                    "opt_batch": batch, "max_batch": batch}  # fmt: skip
        assert {k: v for k, v in spec.items() if k != "settings"} == {
            k: v for k, v in shared.items() if k != "settings"
        }
    with pytest.raises(
        ConfigError, match=r"no engine of its own for batch 4; valid choices: 1, 8, 16"
    ):
        trt.convert_spec(4)
    with pytest.raises(ConfigError, match="engines: shared\\): it has no conversion per batch"):
        dbplan.plan_run(with_layout("shared"), *TRT).convert_spec(8)


def test_an_unknown_layout_fails_naming_the_valid_choices():
    from snakemake.exceptions import WorkflowError

    with pytest.raises(
        WorkflowError, match=r"'per_engine' is not one of \['shared', 'per_batch'\]"
    ):
        with_layout("per_engine")
    unvalidated = base_config()
    unvalidated["models"]["bert"]["convert"]["tensorrt"]["engines"] = "per_engine"
    with pytest.raises(
        ConfigError,
        match=r"models\.bert\.convert\.tensorrt\.engines: unknown engine layout 'per_engine'; "
        r"valid choices: shared, per_batch",
    ):
        dbplan.plan_run(unvalidated, *TRT)
    # an engine per batch beyond what the run serves is refused (resolve refuses such an
    # offline batch first)
    with pytest.raises(ConfigError, match=r"per_batch .* \[32\] exceed triton\.max_batch_size 16"):
        dbengines.plan_layout(
            {"engines": "per_batch"},
            "x",
            offline_batches=[1, 32],
            max_batch_size=16,
            converted=True,
        )


def test_offline_points_name_the_model_of_their_engine_online_stays_on_the_shared_one():
    for path in (TRT, ONNX_TRT):
        plan = dbplan.plan_run(with_layout("per_batch"), *path)
        models = {"1": "bert_b1", "8": "bert_b8", "16": "bert_b16"}
        offline = plan.spec("offline")
        assert offline["model_name"] == "bert" and offline["batch_models"] == models
        assert [p["batch"] for p in offline["points"]] == list(BATCHES)
        assert plan.spec("accuracy")["batch_models"] == models  # each engine checked at its batch
        online = plan.spec("online")
        assert "batch_models" not in online and online["model_name"] == "bert"
        # the shared model takes every batch the dynamic batcher forms
        assert plan.triton["max_batch_size"] == 16
        shared = dbplan.plan_run(with_layout("shared"), *path)
        assert "batch_models" not in shared.spec("offline")
        assert "batch_models" not in shared.spec("accuracy")
        assert "batch_models" not in shared.spec("repository")


def test_switching_the_layout_reruns_only_what_it_changes():
    from tests.test_plan import step_specs

    for path, changed in (
        # the shared engine's conversion stays; its repository, checks and measurements change
        ("/".join(TRT), {"repository", "accuracy", "offline", "online"}),
        ("/".join(ONNX_TRT), {"repository", "accuracy", "offline", "online"}),
        ("bert/A30/onnx/fp16", set()),
        ("tft/A30/trt/fp16", set()),
    ):
        before = step_specs(with_layout("per_batch"), path)
        after = step_specs(with_layout("shared"), path)
        assert {step for step in before if before[step] != after[step]} == changed, path


def test_servers_of_a_per_batch_onnx_trt_run_wait_for_every_build():
    config = with_layout("per_batch")
    build_s = config["server"]["engine_build_timeout_s"]
    startup = config["server"]["startup_timeout_s"]
    per_batch = dbplan.plan_run(config, *ONNX_TRT).server
    assert per_batch["startup_timeout_s"] == startup + (1 + len(BATCHES)) * build_s
    assert per_batch["client_timeout_s"] == build_s
    shared = dbplan.plan_run(with_layout("shared"), *ONNX_TRT).server
    assert shared["startup_timeout_s"] == startup + build_s
    # trt engines are built by the convert jobs: no wait
    assert dbplan.plan_run(config, *TRT).server == {
        "startup_timeout_s": 120,
        "shutdown_timeout_s": 30,
    }


def test_a_search_candidate_serves_the_shared_engine_alone():
    config = with_layout("per_batch")
    config["models"]["bert"]["search"] = {
        "strategy": "grid",
        "latency_budget_ms": 100,
        "max_candidates": 4,
        "axes": {"model_instances": [1, 2]},
    }
    search = plan_search(validated(config), *TRT)
    candidate = search.variant_plan(search.grid()[1].name)
    assert candidate.engines is not None and not candidate.engines.per_batch
    assert "batch_models" not in candidate.spec("repository")
    assert candidate.info["engines"] == "shared" and "engine_batches" not in candidate.info
    assert candidate.converted_batches == ()


# ---------------------------------------------------------------------------- the dry run


def dry_run(tmp_path: Path, config: dict[str, Any], *targets: str) -> tuple[dict[str, int], str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    write_config(tmp_path, config)
    result = run_snakemake(tmp_path, "-n", *targets, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    return planned_jobs(result), out


def test_dry_run_plans_a_conversion_per_batch_and_one_repository(tmp_path):
    run = "results/bert/A30/trt/fp16"
    planned, out = dry_run(tmp_path / "per_batch", with_layout("per_batch"), f"{run}/offline.csv")
    assert planned == {
        "prepare_checkpoint": 1,
        "export": 1,
        "convert": 1,
        "convert_batch": len(BATCHES),
        "repository": 1,
        "offline": 1,
    }
    built = re.findall(rf"output: {run}/convert/batch(\d+)/model\.plan,", out)
    assert sorted(map(int, built)) == list(BATCHES)
    # the repository job takes the shared engine and every batch's
    (repository_inputs,) = re.findall(r"rule repository:\n\s+input: ([^\n]+)", out)
    assert f"{run}/convert/model.plan" in repository_inputs.split(", ")
    for batch in BATCHES:
        assert f"{run}/convert/batch{batch}/model.plan" in repository_inputs.split(", ")
    # shared: today's chain, one conversion
    planned, out = dry_run(tmp_path / "shared", with_layout("shared"), f"{run}/offline.csv")
    assert "convert_batch" not in planned and planned["convert"] == 1
    assert "/convert/batch" not in out
    # onnx-trt builds in the server: no conversion per batch either way
    planned, _ = dry_run(
        tmp_path / "onnx_trt",
        with_layout("per_batch"),
        "results/bert/A30/onnx-trt/fp16/offline.csv",
    )
    # no conversion at all: it serves the fp16 export (the halved module, as DLE's)
    assert "convert_batch" not in planned and "convert" not in planned


def would_run(spec: dict[str, Any], source: Path, artifact: Path) -> list[str]:
    """The trtexec command a convert job would run (it stops at the GPU boundary saying it)."""
    with pytest.raises(NeedsGPU, match="needs a GPU node") as stopped:
        jobs.convert(
            spec, source=str(source), artifact=str(artifact), provenance=f"{artifact}.json"
        )
    command = str(stopped.value).split("It would run: ", 1)[1]
    return shlex.split(command)


def test_each_convert_job_would_run_trtexec_at_its_batch(tmp_path, monkeypatch):
    monkeypatch.setattr(cv, "gpu_visible", lambda: False)
    monkeypatch.setattr(cv.shutil, "which", lambda _: None)  # no trtexec: current flags
    onnx = bert_signature_onnx(tmp_path / "export/model.onnx")
    plan = dbplan.plan_run(with_layout("per_batch"), *TRT)
    convert_dir = tmp_path / "results/bert/A30/trt/fp16/convert"
    expected = {
        None: (convert_dir / "model.plan", (1, 16, 16)),
        **{b: (convert_dir / f"batch{b}/model.plan", (b, b, b)) for b in BATCHES},
    }
    for batch, (artifact, (lo, opt, hi)) in expected.items():
        command = would_run(plan.convert_spec(batch), onnx, artifact)
        assert command == [
            "trtexec",
            f"--onnx={onnx}",
            f"--saveEngine={artifact}",
            f"--minShapes={shapes(lo)}",
            f"--optShapes={shapes(opt)}",
            f"--maxShapes={shapes(hi)}",
            "--memPoolSize=workspace:8192M",  # the seed's --tensorrt-max-workspace-size 8 GiB
            "--skipInference",
            "--fp16",
        ], batch
        # the same as deploybench.convert.tensorrt_command builds from the profile
        profile = {n: {"min": (lo, SEQ), "opt": (opt, SEQ), "max": (hi, SEQ)} for n in INPUTS}
        assert command == cv.tensorrt_command(
            onnx=onnx, plan=artifact, precision="fp16", profile=profile, workspace_mb=8192
        )


# ---------------------------------------------------------------------------- repositories


def models_of(repository: Path) -> dict[str, Any]:
    return {p.parent.name: read_config(p) for p in sorted(repository.glob("*/config.pbtxt"))}


def test_trt_repository_serves_each_engine_as_its_own_model(tmp_path, monkeypatch):
    """Up to the GPU: a stand-in trtexec "builds" each engine (the convert jobs run for real),
    and the repository job serves them: bert (1..16) and bert_b<b> (max_batch_size b)."""
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    write_trtexec(tmp_path / "bin")
    monkeypatch.setattr(cv, "gpu_visible", lambda: True)
    onnx = bert_signature_onnx(tmp_path / "export/model.onnx")
    plan = dbplan.plan_run(with_layout("per_batch"), *TRT)
    run_dir = tmp_path / "results/bert/A30/trt/fp16"
    artifacts = {}
    for batch in (None, *BATCHES):
        folder = run_dir / "convert" if batch is None else run_dir / f"convert/batch{batch}"
        folder.mkdir(parents=True, exist_ok=True)
        artifact = folder / "model.plan"
        jobs.convert(
            plan.convert_spec(batch),
            source=str(onnx),
            artifact=str(artifact),
            provenance=f"{artifact}.provenance.json",
        )
        record = json.loads(Path(f"{artifact}.provenance.json").read_text())["conversion"]
        lo = 1 if batch is None else batch
        hi = 16 if batch is None else batch
        assert record["profile"]["input__0"] == {
            "min": [lo, SEQ],
            "opt": [hi, SEQ],
            "max": [hi, SEQ],
        }
        artifacts[batch] = str(artifact)
    repository = run_dir / "repository"
    jobs.repository(
        plan.repository_spec(),
        artifact=artifacts[None],
        artifact_provenance=f"{artifacts[None]}.provenance.json",
        signature=[str(onnx)],
        repository=str(repository),
        batch_artifacts=[artifacts[b] for b in BATCHES],
        batch_provenances=[f"{artifacts[b]}.provenance.json" for b in BATCHES],
    )
    configs = models_of(repository)
    assert sorted(configs) == ["bert", "bert_b1", "bert_b16", "bert_b8"]
    assert configs["bert"].max_batch_size == 16
    for batch in BATCHES:
        cfg = configs[f"bert_b{batch}"]
        assert cfg.platform == "tensorrt_plan" and cfg.max_batch_size == batch
        assert [i.name for i in cfg.input] == list(INPUTS)
        assert list(cfg.dynamic_batching.preferred_batch_size) == [1]  # the run's, within b
        assert (repository / f"bert_b{batch}/1/model.plan").is_file()
    # the dry run's inputs are the job's files: per_batch's batch_artifacts, in BATCHES order
    assert [m["batch"] for m in plan.repository_spec()["batch_models"]] == list(BATCHES)


def onnx_trt_repository(tmp_path: Path, layout: str) -> dict[str, Any]:
    onnx = bert_signature_onnx(tmp_path / "export/model.onnx")
    plan = dbplan.plan_run(with_layout(layout), *ONNX_TRT)
    repository = tmp_path / f"{layout}/results/bert/A30/onnx-trt/fp16/repository"
    jobs.repository(
        plan.repository_spec(),
        artifact=str(onnx),
        artifact_provenance=f"{onnx}.provenance.json",
        signature=[str(onnx)],
        repository=str(repository),
    )
    return models_of(repository)


def accelerator_of(cfg: Any) -> dict[str, str]:
    (accelerator,) = cfg.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt"
    return dict(accelerator.parameters)


def test_onnx_trt_per_batch_configs_carry_their_profile_and_4_gib(tmp_path):
    configs = onnx_trt_repository(tmp_path, "per_batch")
    assert sorted(configs) == ["bert", "bert_b1", "bert_b16", "bert_b8"]
    cache = repo_mod.engine_cache_dir(
        tmp_path / "per_batch/results/bert/A30/onnx-trt/fp16/repository"
    )
    paths = set()
    for name, cfg in configs.items():
        batch = 16 if name == "bert" else int(name.removeprefix("bert_b"))
        lowest = 1 if name == "bert" else batch
        parameters = accelerator_of(cfg)
        assert parameters == {
            "precision_mode": "FP16",
            # DLE: model_navigator's DEFAULT_TENSORRT_MAX_WORKSPACE_SIZE, 4 * 2**30
            "max_workspace_size_bytes": str(4 * GIB),
            "trt_engine_cache_enable": "true",
            "trt_engine_cache_path": parameters["trt_engine_cache_path"],
            "trt_profile_min_shapes": shapes(lowest),
            "trt_profile_opt_shapes": shapes(batch),
            "trt_profile_max_shapes": shapes(batch),
        }, name
        assert cfg.max_batch_size == batch, name
        (warmup,) = cfg.model_warmup  # the engine is built (and run once) while it loads
        assert warmup.batch_size == batch, name
        paths.add(parameters["trt_engine_cache_path"])
    # a cache per model: ORT names an engine after the model file's name and graph, the same
    # for all four models
    assert paths == {str(cache)} | {str(cache / f"bert_b{b}") for b in BATCHES}
    assert cache.is_dir() and not any(cache.iterdir())  # emptied; sub-caches made at load
    with repo_mod.engine_build_lock(
        tmp_path / "per_batch/results/bert/A30/onnx-trt/fp16/repository"
    ) as held:
        assert sorted(map(str, held)) == sorted(paths)


def test_onnx_trt_shared_keeps_one_model_over_the_batches(tmp_path):
    configs = onnx_trt_repository(tmp_path, "shared")
    assert list(configs) == ["bert"]
    parameters = accelerator_of(configs["bert"])
    assert parameters["trt_profile_min_shapes"] == shapes(1)
    assert parameters["trt_profile_opt_shapes"] == shapes(16)
    assert parameters["trt_profile_max_shapes"] == shapes(16)
    assert parameters["max_workspace_size_bytes"] == str(4 * GIB)
    # without accelerator_workspace_mb the accelerator takes the conversion's workspace_mb
    config = with_layout("shared")
    del config["models"]["bert"]["convert"]["tensorrt"]["accelerator_workspace_mb"]
    how = dbserving.serving(dbc.resolve(config, *ONNX_TRT))
    assert how["gpu_accelerators"][0]["parameters"]["max_workspace_size_bytes"] == str(8 * GIB)


# ---------------------------------------------------------------------------- report, provenance


def test_the_report_and_provenance_say_which_layout_ran():
    per_batch = dbplan.plan_run(with_layout("per_batch"), *TRT).spec("offline")["run"]
    assert per_batch["engines"] == "per_batch" and per_batch["engine_batches"] == list(BATCHES)
    table = configuration_table({"config": copy.deepcopy(dict(per_batch))})
    assert (
        "| TensorRT engines | per_batch: one per offline batch size (1, 8, 16; min = opt = max = "
        "the batch, max_batch_size = the batch); online, accuracy: one over 1..16 |" in table
    )
    shared = dbplan.plan_run(with_layout("shared"), *TRT).spec("online")["run"]
    assert shared["engines"] == "shared" and "engine_batches" not in shared
    assert "| TensorRT engines | shared: one over batches 1..16 |" in configuration_table(
        {"config": dict(shared)}
    )
    # a run without TensorRT engines: no row
    plain = dbplan.plan_run(with_layout("per_batch"), "bert", "A30", "onnx", "fp16")
    assert "TensorRT engines" not in configuration_table({"config": dict(plain.info)})


# ---------------------------------------------------------------------------- the jobs' routing


def test_offline_measures_each_batch_on_its_own_model_online_on_the_shared(tmp_path, monkeypatch):
    """The perf job with its server, client and perf_analyzer stood in (tests/test_transport.py):
    which model each point is measured on, and what its provenance records."""
    from tests.test_transport import fake_job, write_served_configs

    shm_dir = tmp_path / "shm"
    shm_dir.mkdir()
    calls = fake_job(monkeypatch, shm_dir)
    plan = dbplan.plan_run(with_layout("per_batch"), *TRT)
    served = ["bert", *(f"bert_b{b}" for b in BATCHES)]
    write_served_configs(tmp_path / "repository", served, on_gpu=True)
    measured = {}
    for scenario in dbplan.SCENARIOS:
        calls.clear()
        out = {name: str(tmp_path / f"{scenario}.{name}") for name in ("csv", "trials", "json")}
        jobs.perf(
            plan.spec(scenario),
            repository=str(tmp_path / "repository"),
            csv=out["csv"],
            trials=out["trials"],
            provenance=out["json"],
            server_log=str(tmp_path / "server.log"),
            perf_log=str(tmp_path / "perf.log"),
        )
        measured[scenario] = {
            (c["point"].batch, c["measurement"].served_model(c["point"])) for c in calls
        }
        recorded = json.loads(Path(out["json"]).read_text())["config"]
        assert recorded["engines"] == "per_batch" and recorded["engine_batches"] == list(BATCHES)
        if scenario == "offline":
            assert recorded["batch_models"] == {str(b): f"bert_b{b}" for b in BATCHES}
    assert measured["offline"] == {(b, f"bert_b{b}") for b in BATCHES}
    assert {name for _, name in measured["online"]} == {"bert"}


def test_accuracy_checks_every_engine_at_its_batch(tmp_path, monkeypatch):
    """The accuracy job with its server and framework stood in: the shared model at the
    configured batch, each per-batch model at its own; the rows name the model."""
    import contextlib
    import csv
    from types import SimpleNamespace

    import numpy as np

    from deploybench import checkpoint, triton_client
    from deploybench.errors import AccuracyError

    names = ["output__0", "output__1"]

    def outputs(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {n: feeds["x"] + k for k, n in enumerate(names)}

    family = SimpleNamespace(
        outputs=[SimpleNamespace(name=n, shape=(4,)) for n in names],
        example_inputs=lambda batch, seed: {"x": np.full((batch, 4), seed, np.float32)},
        serving_module=lambda state: None,
        framework_outputs=lambda module, feeds, device="cpu": outputs(feeds),
        accuracy_quantities=lambda reference, actual: {},
        metric_name="F1",
        higher_is_better=True,
    )
    server = SimpleNamespace(
        http_url="http://stand-in",
        metadata=lambda: {"version": "x"},
        environment={},
        process_environment=lambda: ({}, "the stand-in's (no process)"),
    )
    asked: list[tuple[str, int]] = []
    wrong = {"model": None}

    def infer(url, model, feeds, wanted, timeout_s):
        asked.append((model, len(feeds["x"])))
        served = outputs(feeds)
        if model == wrong["model"]:
            served["output__1"] = served["output__1"] * 100  # beyond fp16 atol = rtol = 5
        return served

    monkeypatch.setattr(measure_jobs, "load_family", lambda module, hparams: family)
    monkeypatch.setattr(measure_jobs, "ready_server", lambda *args: contextlib.nullcontext(server))
    monkeypatch.setattr(checkpoint, "read_workflow_checkpoint", lambda *args: {})
    monkeypatch.setattr(triton_client, "infer_triton", infer)
    spec = dbplan.plan_run(with_layout("per_batch"), *TRT).spec("accuracy")
    files = {
        name: str(tmp_path / name) for name in ("acc.csv", "task.csv", "acc.json", "server.log")
    }

    def run() -> None:
        jobs.accuracy(
            spec,
            repository=str(tmp_path / "repository"),
            checkpoint="checkpoint.pt",
            csv=files["acc.csv"],
            task_csv=files["task.csv"],
            provenance=files["acc.json"],
            server_log=files["server.log"],
        )

    run()
    assert asked == [("bert", 16), ("bert_b1", 1), ("bert_b8", 8), ("bert_b16", 16)]
    with open(files["acc.csv"]) as f:
        rows = list(csv.DictReader(f))
    assert [(r["model"], r["batch"], r["output"]) for r in rows] == [
        (model, str(batch), name)
        for model, batch in (("bert", 16), ("bert_b1", 1), ("bert_b8", 8), ("bert_b16", 16))
        for name in names
    ]
    # an engine of one batch that misses fails the job naming it
    wrong["model"] = "bert_b8"
    Path(files["acc.csv"]).unlink()
    with pytest.raises(AccuracyError, match=r"the engine of batch 8 \(model bert_b8\) differs"):
        run()
    assert not Path(files["acc.csv"]).exists()
