# Shared helpers: config validation, wildcard constraints, and what each run needs.
# Every helper resolves the run through deploybench.config, so an unknown model/gpu/format/
# precision or a combination the config does not allow fails while the DAG is built, with a
# message naming the value and the valid choices.

import functools
import os
import re

from snakemake.utils import validate

from snakemake.settings.types import DeploymentMethod

from deploybench import config as dbconfig
from deploybench import images
from deploybench.models import CHECKPOINT_FILES, framework_of
from deploybench.convert import conversion_settings
from deploybench.repository import serving

SCHEMA = workflow.source_path("../config/schema/config.schema.yaml")
validate(config, SCHEMA)
dbconfig.check_sizings(config, dbconfig.load_yaml(SCHEMA))
images.check_images(config)
USE_APPTAINER = (
    DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
)
if USE_APPTAINER:
    # Snakemake mounts the working directory; a job also reads this deploybench (mounted
    # read-only and put on the container's PYTHONPATH) and any data configured outside the
    # working directory (checkpoints, task data sets).
    SOURCE_TREE = str(images.source_tree())
    workflow.deployment_settings.apptainer_args = images.job_options(
        workflow.deployment_settings.apptainer_args,
        [f"{SOURCE_TREE}:{SOURCE_TREE}:ro", *images.data_binds(config, os.getcwd())],
        {"PYTHONPATH": SOURCE_TREE},
    )


wildcard_constraints:
    model=r"[a-z0-9_]+",
    gpu=r"[A-Za-z0-9_]+",
    format=r"[a-z0-9-]+",
    precision=r"[a-z0-9]+",
    export_format=r"[a-z0-9-]+",
    export_precision=r"[a-z0-9]+",
    artifact=r"model\.[a-z]+",
    checkpoint_file=r"checkpoint\.[a-z]+",


RUN_DIR = "results/{model}/{gpu}/{format}/{precision}"
LOG_DIR = "logs/{model}/{gpu}/{format}/{precision}"
CHECKPOINT = "results/{model}/checkpoint/{checkpoint_file}"
EXPORT = "results/{model}/export/{export_format}/{export_precision}/{artifact}"
CONVERTED = f"{RUN_DIR}/convert/{{artifact}}"
REPOSITORY = f"{RUN_DIR}/repository"
RESULT_FILES = ("accuracy.csv", "task.csv", "offline.csv", "online.csv")
# Artifacts that are directories (a TF SavedModel) get their own rule variants.
DIRECTORY_ARTIFACTS = sorted(
    {f["artifact"] for f in config["formats"].values() if f.get("directory")}
)
FILE_ARTIFACTS = sorted(
    {f["artifact"] for f in config["formats"].values()} - set(DIRECTORY_ARTIFACTS)
)


def one_of(names):
    """A wildcard constraint matching exactly ``names``."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


@functools.cache
def _resolved(model, gpu, fmt, precision):
    # every params/input function of a job asks for the same run; merge and check it once
    return dbconfig.resolve(config, model, gpu, fmt, precision)


@functools.cache
def _runs():
    """Every run the config allows (``model/gpu/format/precision``), resolved once."""
    return tuple(dbconfig.all_runs(config))


def run_of(wildcards):
    return _resolved(
        wildcards.model, wildcards.gpu, wildcards.format, wildcards.precision
    )


def in_run(pattern, run, **extra):
    """``pattern`` filled with the run's wildcards."""
    return pattern.format(
        model=run.model,
        gpu=run.gpu,
        format=run.format,
        precision=run.precision,
        **extra,
    )


def results_of(paths):
    """The accuracy and perf CSVs of runs given as ``model/gpu/format/precision``."""
    files = []
    for path in paths:
        model, gpu, fmt, precision = path.split("/")
        run = _resolved(model, gpu, fmt, precision)
        files += [f"{in_run(RUN_DIR, run)}/{name}" for name in RESULT_FILES]
    return files


def target_results():
    """The results of every run listed under `targets` in the config."""
    return results_of(config["targets"])


def gpu_results(gpu):
    """The results of every run the config allows on ``gpu`` (every model, format, precision)."""
    return results_of(r for r in _runs() if r.split("/")[1] == gpu)


def model_base(model):
    """A model's settings before any gpu sizing (export and checkpoint do not depend on it)."""
    if model not in config["models"]:
        raise dbconfig.ConfigError(
            f"unknown model {model!r}; valid choices: {', '.join(sorted(config['models']))}"
        )
    return config["models"][model]


def model_identity(model):
    """What defines the network: module, hyper-parameters, weights source, seed."""
    m = model_base(model)
    keys = ("module", "hparams", "checkpoint", "checkpoint_ema", "seed")
    return {k: m.get(k) for k in keys}


# Images the workflow builds (rule container_image), by name.
BUILT_IMAGES = sorted(n for n, i in config["images"].items() if images.is_built(i))


def image_build(wildcards):
    """An image's config with its definition and requirements as paths in the source tree."""
    return images.in_source_tree(config["images"][wildcards.image], workflow.basedir)


def image_of(model, role):
    """The name of the image that runs ``role`` (framework | triton) jobs of ``model``."""
    return model_base(model)["containers"][role]


def container_of(role):
    """For `container:` — the image that runs this job (used with --sdm apptainer)."""
    return lambda w: images.container_uri(
        image_of(w.model, role), config["images"][image_of(w.model, role)]
    )


def image_input(role):
    """The built image as an input (so it is built first, and a rebuilt image reruns the jobs
    it ran) — only when jobs run in containers; a native run needs no image."""

    def inputs(w):
        name = image_of(w.model, role)
        if not USE_APPTAINER or not images.is_built(config["images"][name]):
            return []
        return [images.sif_path(name)]

    return inputs


def configured_checkpoint(wildcards):
    """The configured checkpoint file (so replacing it reruns everything), if any."""
    source = model_base(wildcards.model).get("checkpoint")
    dbconfig.check_path(f"models.{wildcards.model}.checkpoint", source)
    return [source] if source else []


def checkpoint_of(model):
    """The workflow's checkpoint file of ``model`` (its name depends on the framework)."""
    framework = framework_of(model_base(model)["module"])
    return CHECKPOINT.format(model=model, checkpoint_file=CHECKPOINT_FILES[framework])


def checkpoint_name(wildcards):
    """Check that the requested checkpoint file is the one the model's framework writes."""
    expected = checkpoint_of(wildcards.model)
    requested = CHECKPOINT.format(**wildcards)
    if requested != expected:
        raise dbconfig.ConfigError(
            f"model {wildcards.model!r} writes {expected!r}, not {requested!r}"
        )
    return configured_checkpoint(wildcards)


def export_artifact(wildcards):
    """Check that the requested export file is the one its format produces."""
    fmt = wildcards.export_format
    if fmt not in config["formats"]:
        raise dbconfig.ConfigError(
            f"unknown export format {fmt!r}; valid choices: {', '.join(sorted(config['formats']))}"
        )
    expected = config["formats"][fmt]["artifact"]
    if wildcards.artifact != expected:
        raise dbconfig.ConfigError(
            f"export format {fmt!r} writes {expected!r}, not {wildcards.artifact!r}"
        )
    return checkpoint_of(wildcards.model)


def export_source(wildcards):
    """The export this export is made from, if the model makes it from another one."""
    model = model_base(wildcards.model)
    source = model["export"].get("sources", {}).get(wildcards.export_format)
    if source is None:
        return []
    return [export_path(wildcards.model, source, wildcards.export_precision)]


def export_path(model, export_format, precision):
    # every export format is also a served format of the same name (e.g. onnx, tf-savedmodel)
    return EXPORT.format(
        model=model,
        export_format=export_format,
        export_precision=precision,
        artifact=config["formats"][export_format]["artifact"],
    )


def export_of(run):
    return export_path(run.model, run.export_format, run.export_precision)


def served_artifact(wildcards):
    """The converted artifact if the run needs a conversion, else the export itself."""
    run = run_of(wildcards)
    if run.converter is None:
        return export_of(run)
    return in_run(CONVERTED, run, artifact=run.format_settings["artifact"])


def served_provenance(wildcards):
    """The sidecar of the served artifact: the repository job checks the artifact against it."""
    return f"{served_artifact(wildcards)}.provenance.json"


def served_signature(wildcards):
    """The ONNX graph whose inputs a native backend serves (ONNX export drops unused inputs, and
    a TensorRT plan takes those of the ONNX it was built from); none on CPU, where the python
    backend takes every input and the runtime picks its own."""
    run = run_of(wildcards)
    if run.device == "cpu" or run.export_format != "onnx":
        return []
    return [export_of(run)]


def run_info(wildcards):
    """What identifies a run in its results and provenance."""
    run = run_of(wildcards)
    how = serving(run)
    return {
        "path": run.path,
        "model": run.model,
        "gpu": run.gpu,
        "gpu_name": run.gpu_settings["name"],
        "format": run.format,
        "precision": run.precision,
        "device": run.device,
        "backend": how["backend"],
        "runtime": how["runtime"],
        "dataset": run.settings.get("dataset"),
        "max_batch_size": run.settings["triton"]["max_batch_size"],
        "model_instances": run.settings["triton"]["model_instances"],
    }


def repository_of(wildcards):
    return in_run(REPOSITORY, run_of(wildcards))


def offline_points(wildcards):
    run = run_of(wildcards)
    return [
        {"batch": b, "concurrency": 1}
        for b in run.settings["perf"]["offline"]["batch_sizes"]
    ]


def online_points(wildcards):
    batch, concurrency = dbconfig.online_grid(run_of(wildcards))
    return [{"batch": batch, "concurrency": c} for c in concurrency]


def measure_settings(wildcards):
    perf = run_of(wildcards).settings["perf"]
    return {
        "request_count": perf["request_count"],
        "measurement_interval_ms": perf["measurement_interval_ms"],
        "max_retries": perf["max_retries"],
        "retry_request_step": perf["retry_request_step"],
        "warmup_factor": perf["warmup_factor"],
        "timeout_s": perf["timeout_s"],
    }


# --- SLURM / GPU requests ------------------------------------------------------------------
# Resource callables of the rules that run on the GPU (convert, accuracy, offline, online).
# snakemake-executor-plugin-slurm turns `gpu` (+ `gpu_model`) into `--gpus=<model>:1`,
# `slurm_partition` into -p and `constraint` into -C (profiles/slurm); locally `gpu` counts
# against `--resources gpu=N`. Values come from `gpus.<gpu>.slurm` in the config; None leaves a
# request to the cluster's default. A run on a CPU device asks for no GPU.


def gpu_request(wildcards):
    """One whole GPU for a run on a GPU device, none on a CPU device."""
    return 1 if run_of(wildcards).device == "gpu" else 0


def slurm_setting(key):
    """The run's `gpus.<gpu>.slurm.<key>` (partition | gpu_model | constraint), or None."""

    def value(wildcards):
        run = run_of(wildcards)
        if key == "gpu_model" and run.device != "gpu":
            return None
        return (run.gpu_settings.get("slurm") or {}).get(key)

    return value


# --- Plots and reports ---------------------------------------------------------------------
PUBLISHED = workflow.source_path("../config/reference/published.csv")
PLOTS = (
    "offline_throughput",
    "offline_latency",
    "online_latency_breakdown",
    "online_throughput_latency",
    "published_offline",
    "published_online",
)
SCENARIOS = ("offline", "online")
PLOT_STEM = f"{RUN_DIR}/plots/{{name}}"
REPORT_DIR = "reports/{report_set}"
COMPARISON_STEM = f"{REPORT_DIR}/{{model}}/comparison_{{scenario}}"


wildcard_constraints:
    report_set=r"[A-Za-z0-9_-]+",


def plot_files(ext):
    """A run's chart files with extension ``ext`` (patterns over the run's wildcards)."""
    return [f"{RUN_DIR}/plots/{name}.{ext}" for name in PLOTS]


def comparison_files():
    return [
        f"{REPORT_DIR}/{{model}}/comparison_{scenario}.{ext}"
        for scenario in SCENARIOS
        for ext in ("svg", "png", "html")
    ]


def run_fields(path):
    """``model/gpu/format/precision`` as a tuple."""
    return tuple(path.split("/"))


def runs_in_report(report_set, model):
    """The runs of ``model`` on the GPUs of report set ``report_set``."""
    sets = config["report"]["sets"]
    if report_set not in sets:
        raise dbconfig.ConfigError(
            f"unknown report set {report_set!r}; valid choices: {', '.join(sorted(sets))}"
        )
    gpus = sets[report_set]["gpus"]
    runs = [r for r in _runs() if run_fields(r)[:2] in {(model, g) for g in gpus}]
    if not runs:
        raise dbconfig.ConfigError(
            f"model {model!r} has no run on the GPUs of report set {report_set!r} ({', '.join(gpus)})"
        )
    return runs


def report_runs(wildcards):
    """What the report page reads for each run."""
    entries = []
    for path in runs_in_report(wildcards.report_set, wildcards.model):
        run = _resolved(*run_fields(path))
        base = in_run(RUN_DIR, run)
        entries.append(
            {
                "path": path,
                "offline": f"{base}/offline.csv",
                "online": f"{base}/online.csv",
                "provenance": f"{base}/offline.provenance.json",
                "plots": [in_run(p, run) for p in plot_files("png")],
                "accelerator": run.format_settings.get("accelerator", "none"),
            }
        )
    return entries


def report_inputs(wildcards):
    runs = report_runs(wildcards)
    return {
        "csv": [r[s] for r in runs for s in SCENARIOS],
        "provenance": [r["provenance"] for r in runs],
        "plots": [p for r in runs for p in r["plots"]],
    }


def all_reports():
    """Every configured report set's page of every model that has runs in it."""
    pages = []
    for report_set, settings in config["report"]["sets"].items():
        models = sorted(
            {run_fields(r)[0] for r in _runs() if run_fields(r)[1] in settings["gpus"]}
        )
        pages += [f"reports/{report_set}/{m}.html" for m in models]
    return pages
