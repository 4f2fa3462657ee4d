# Shared helpers: config validation, wildcard constraints, paths, and glue over the plan.
# What a run is and how each step does it comes from deploybench.planning.run_plan (one frozen
# plan per run, cached here); an unknown model/gpu/format/precision or a combination the config does not allow
# fails while the DAG is built, with a message naming the value and the valid choices.

import dataclasses
import functools
import json
import os
import re
from pathlib import Path

from snakemake.logging import logger
from snakemake.utils import validate

from snakemake.settings.types import DeploymentMethod

from deploybench import chart_names
from deploybench import config_search as dbsearch
from deploybench import images
from deploybench import job_imports
from deploybench import provenance
from deploybench.planning import config_search_plan as dbsearch_plan
from deploybench.planning import engines as dbengines
from deploybench.planning import export_plan as dbexport
from deploybench.planning import measurement_memory as dbmemory
from deploybench.planning import preflight_plan as dbpreflight
from deploybench.planning import resources as dbresources
from deploybench.planning import run_plan as dbplan
from deploybench.planning import schedule as dbschedule
from deploybench.planning import serving_plan as dbserving
from deploybench.planning import workflow_config as dbconfig

SCHEMA = workflow.source_path("../config/schema/config.schema.yaml")
validate(config, SCHEMA)
dbconfig.check_sizings(config, dbconfig.load_yaml(SCHEMA))
dbconfig.check_published_ran(config)
images.check_images(config)
try:  # the options the SLURM executor plugin sets itself (its own table), where it is installed
    from snakemake_executor_plugin_slurm.validation import get_forbidden_slurm_options
except ImportError:
    get_forbidden_slurm_options = dict
dbresources.check_slurm_extra(config, get_forbidden_slurm_options())
# Results record the git state of this source tree, not of the working directory.
os.environ[provenance.SOURCE_GIT_ENV] = json.dumps(
    provenance.git_state(Path(workflow.basedir))
)
USE_APPTAINER = (
    DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
)
if USE_APPTAINER:
    # Snakemake mounts the working directory (as the job's home); a job also reads this
    # deploybench package and any data configured outside the working directory.
    workflow.deployment_settings.apptainer_args = images.job_options(
        workflow.deployment_settings.apptainer_args,
        [images.package_bind(), *images.data_binds(config, os.getcwd())],
        {"PYTHONPATH": str(images.source_tree())},
    )


wildcard_constraints:
    model=r"[a-z0-9_]+",
    gpu=r"[A-Za-z0-9_-]+",
    format=r"[a-z0-9-]+",
    precision=r"[a-z0-9]+",
    export_format=r"[a-z0-9-]+",
    export_precision=r"[a-z0-9]+",
    artifact=r"model\.[a-z]+",
    checkpoint_file=r"checkpoint\.[a-z]+",
    export_image=r"[A-Za-z0-9_.-]+",


RUN_DIR = "results/{model}/{gpu}/{format}/{precision}"
# The order of a run's serving jobs when they wait together (rules accuracy, offline, online)
RUN_PRIORITY = {"accuracy": 2, "offline": 1, "online": 0}
LOG_DIR = "logs/{model}/{gpu}/{format}/{precision}"
CHECKPOINT = "results/{model}/checkpoint/{checkpoint_file}"
EXPORT = "results/{model}/export/{export_format}/{export_precision}/{artifact}"
# An export made in another framework image than the model's own: a GPU its images cannot drive
# (a V100) is served from exports made in the images that drive it (gpus.images_for_gpu).
EXPORT_IN_IMAGE = "results/{model}/export@{export_image}/{export_format}/{export_precision}/{artifact}"
CONVERTED = f"{RUN_DIR}/convert/{{artifact}}"
# engines: per_batch (deploybench/planning/engines.py): the engine of one batch size
CONVERTED_BATCH = f"{RUN_DIR}/convert/batch{{batch}}/{{artifact}}"
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


# --- Plans: every input, params and resources function of a job asks for the same plan; make
# each once (hashable keys), so that the full-matrix DAG stays quick to build.


@functools.cache
def model_plan(model):
    return dbexport.plan_model(config, model)


@functools.cache
def _export_plan(model, export_format, precision, image=None):
    return dbexport.plan_export(config, model, export_format, precision, image)


@functools.cache
def _run_plan(model, gpu, fmt, precision):
    return dbplan.plan_run(config, model, gpu, fmt, precision)


@functools.cache
def _runs():
    """Every run the config allows (``model/gpu/format/precision``), resolved once."""
    return tuple(dbconfig.all_runs(config))


@functools.cache
def _runs_on(gpu):
    """The runs of ``_runs()`` on ``gpu`` (a preflight job's: a DAG's preflight jobs would
    each read every run otherwise, quadratic in the GPUs)."""
    return tuple(r for r in _runs() if run_fields(r)[1] == gpu)


def plan_of(wildcards):
    """The plan of the run named by the job's wildcards."""
    return _run_plan(
        wildcards.model, wildcards.gpu, wildcards.format, wildcards.precision
    )


def export_plan(wildcards):
    return _export_plan(
        wildcards.model,
        wildcards.export_format,
        wildcards.export_precision,
        dict(wildcards.items()).get("export_image"),
    )


def run_spec(step):
    """For `params: spec=` — the job spec of ``step`` from the run's plan."""
    return lambda w: plan_of(w).spec(step)


def in_run(pattern, plan, **extra):
    """``pattern`` filled with the run's wildcards."""
    return pattern.format(
        model=plan.model,
        gpu=plan.gpu,
        format=plan.format,
        precision=plan.precision,
        **extra,
    )


def results_of(paths):
    """The accuracy and perf CSVs of runs given as ``model/gpu/format/precision``."""
    files = []
    for path in paths:
        plan = _run_plan(*path.split("/"))
        files += [f"{in_run(RUN_DIR, plan)}/{name}" for name in RESULT_FILES]
    return files


def target_results():
    """The results of every run listed under `targets` in the config."""
    return results_of(config["targets"])


@functools.cache
def report_set_runs(report_set):
    """The runs report set ``report_set`` shows, of every run the config allows (each model's
    report page reads them)."""
    return tuple(dbconfig.in_report_set(config, report_set, _runs()))


def report_set_results(report_set):
    """The results of every run report set ``report_set`` shows (the `cpu` target: set `cpu`)."""
    return results_of(report_set_runs(report_set))


# --- Containers


# Images the workflow builds (rule container_image), by name.
BUILT_IMAGES = sorted(n for n, i in config["images"].items() if images.is_built(i))


def image_build(wildcards):
    """An image's config with its definition and requirements as paths in the source tree."""
    return images.in_source_tree(config["images"][wildcards.image], workflow.basedir)


def image_of(w, role):
    """The name of the image that runs ``role`` (framework | triton) for the job with wildcards
    ``w``: a run's (the newest that drive its GPU), an export's, or the model's own."""
    fields = dict(w.items())
    if "gpu" in fields and "format" in fields:
        return plan_of(w).containers[role]
    if fields.get("export_image"):
        return fields["export_image"]
    return model_plan(w.model).containers[role]


def container_free(w):
    """A job of a run on a `gpus` entry served without containers (`serving: python`): it runs
    natively, in this venv, even under --sdm apptainer."""
    gpu = dict(w.items()).get("gpu")
    return gpu in config["gpus"] and dbserving.container_free(config["gpus"][gpu])


def container_of(role):
    """For `container:` — the image that runs this job (used with --sdm apptainer); None (no
    container) for a job of a container-free run."""

    def image(w):
        if container_free(w):
            return None
        name = image_of(w, role)
        return images.container_uri(name, config["images"][name])

    # what the image must import follows from it (deploybench.job_imports)
    image.role = role
    return image


def snakemakes_own(w):
    """For `container:` of a rule that runs where Snakemake runs, in its environment, with
    `--sdm apptainer` too: no image (rules/report.smk says why)."""
    return None


snakemakes_own.role = job_imports.DRIVER_ROLE


def container_of_image(w):
    """For `container:` of a job for any image (`{image}`): that image."""
    return images.container_uri(w.image, config["images"][w.image])


container_of_image.role = job_imports.EVERY_ROLE


@functools.cache
def image_role_imports():
    """Role → what the jobs of the rules declaring its image import (read once all rules are
    defined: at job time)."""
    return job_imports.role_imports(job_imports.rules_by_role(workflow.rules))


def image_input(role):
    """The built image as an input (so it is built first, and a rebuilt image reruns the jobs
    it ran) — only when jobs run in containers; a native run needs no image (no function for
    Snakemake to call per job)."""
    if not USE_APPTAINER:
        return []

    def inputs(w):
        name = image_of(w, role)
        if container_free(w):
            return []
        if not images.is_built(config["images"][name]):
            return []
        return [images.sif_path(name)]

    return inputs


# --- Preflight (rules/preflight.smk): one job per GPU and image, before the runs on a cluster
PREFLIGHT = "results/preflight/{gpu}/{image}.json"
PREFLIGHT_LOG = "logs/preflight/{gpu}/{image}"
# A target's run: results/{model}/{gpu}/{format}/{precision}/...
RUN_TARGET = re.compile(r"^results/([^/]+)/([^/]+)/([^/]+)/([^/]+)/")


@functools.cache
def _preflight_plan(gpu, image):
    return dbpreflight.plan_preflight(
        config, gpu, image, image_role_imports(), runs=_runs_on(gpu), plan=_run_plan
    )


def preflight_spec(wildcards):
    """For `params: spec=` of the preflight_check rule."""
    return _preflight_plan(wildcards.gpu, wildcards.image)


def measurement_threads(wildcards):
    """For `threads:` of a measurement job: its GPU's `slurm.cpus`, at most Snakemake's cores
    (the profile's `cores`); without it, those cores."""
    cpus = (config["gpus"][wildcards.gpu].get("slurm") or {}).get("cpus")
    return min(int(cpus), workflow.cores) if cpus else workflow.cores


def preflight_resources():
    """For `resources:` of the preflight_check rule: what a job on that GPU asks for."""
    return gpu_resources()


# Targets that start runs (their results, or the rules that stand for runs).
RUN_RULES = ("all", "cpu", "search", "report")


def preflight_runs():
    """The runs `snakemake preflight` checks: the config's `targets` (`--config
    'targets=[tft/A30/trt/fp16]'` names others). Naming a run's results beside `preflight`
    would start the run too: that fails here, before anything is submitted."""
    targets = [str(t) for t in workflow.dag_settings.targets]
    if "preflight" not in targets:
        return config["targets"]
    matches = [m for t in targets if (m := RUN_TARGET.match(t)) and m[1] != "preflight"]
    starting = [t for t in targets if t in RUN_RULES] + [m.string for m in matches]
    if starting:
        runs = ",".join(sorted({"/".join(m.groups()) for m in matches}))
        raise dbconfig.ConfigError(
            f"`preflight` checks runs without starting them, but {', '.join(starting)} would "
            "start them: name the runs to check with "
            f"--config 'targets=[{runs or '<model>/<gpu>/<format>/<precision>'}]' instead"
        )
    return config["targets"]


def log_submissions(runs):
    """What each run's jobs will ask a cluster for (--time, grouped as submitted), checked
    against what caps a job's time where it can be read: its partition's MaxTime (sinfo), the
    MaxWall of its QOS and of the partition's own QOS (sacctmgr)."""
    read = {}
    for path in runs:
        plan = _run_plan(*run_fields(path))
        for line in plan.submissions():
            logger.info(line)
        partition = (config["gpus"][plan.gpu].get("slurm") or {}).get("partition")
        limits = dbschedule.cluster_time_limits(
            plan.gpu, partition, plan.gpu_request.qos, logger.info, read
        )
        plan.check_time_limits(limits)


def preflight_reports(wildcards):
    """Rule preflight's input: the report of every image the requested runs use, on each of
    their GPUs."""
    pairs = set()
    runs = preflight_runs()
    log_submissions(runs)
    for path in runs:
        plan = _run_plan(*run_fields(path))
        if dbserving.container_free(config["gpus"][plan.gpu]):
            continue  # no image serves it
        for image in plan.containers.values():
            pairs.add((plan.gpu, image))
    return [PREFLIGHT.format(gpu=g, image=i) for g, i in sorted(pairs)]


def preflight_input(role):
    """With `preflight.required`, a GPU job's input: its GPU and image's passed preflight
    (without it, no function for Snakemake to call per job)."""
    if not config.get("preflight", {}).get("required"):
        return []

    def inputs(w):
        plan = plan_of(w)
        if plan.device != "gpu":
            return []
        if container_free(w):
            return []  # the preflight checks images; this run uses none
        return [PREFLIGHT.format(gpu=plan.gpu, image=plan.containers[role])]

    return inputs


# --- Checkpoint, export and the served artifact


def checkpoint_of(model):
    """The workflow's checkpoint file of ``model`` (its name depends on the framework)."""
    return CHECKPOINT.format(
        model=model, checkpoint_file=model_plan(model).checkpoint_file
    )


def checkpoint_name(wildcards):
    """The configured checkpoint file (so replacing it reruns everything), if any; checks that
    the requested checkpoint file is the one the model's framework writes."""
    expected = checkpoint_of(wildcards.model)
    requested = CHECKPOINT.format(**wildcards)
    if requested != expected:
        raise dbconfig.ConfigError(
            f"model {wildcards.model!r} writes {expected!r}, not {requested!r}"
        )
    source = model_plan(wildcards.model).configured_checkpoint
    return [source] if source else []


def conversion_source(wildcards):
    """What the run's conversion starts from: its export, or the checkpoint for a converter that
    halves the framework module (torchscript-fp16)."""
    plan = plan_of(wildcards)
    if plan.converts_from_checkpoint:
        return checkpoint_of(wildcards.model)
    return export_path(plan.export)


def export_path(export):
    return (EXPORT if export.image_key is None else EXPORT_IN_IMAGE).format(
        model=export.model.name,
        export_format=export.format,
        export_precision=export.precision,
        artifact=export.artifact,
        export_image=export.image_key,
    )


def export_artifact(wildcards):
    """The checkpoint an export is made from; checks that the requested export file is the one
    its format produces."""
    export = export_plan(wildcards)
    if wildcards.artifact != export.artifact:
        raise dbconfig.ConfigError(
            f"export format {export.format!r} writes {export.artifact!r}, not {wildcards.artifact!r}"
        )
    return checkpoint_of(wildcards.model)


def export_source(wildcards):
    """The export this export is made from, if the model makes it from another one."""
    export = export_plan(wildcards)
    if export.source is None:
        return []
    source = _export_plan(
        export.model.name, export.source, export.precision, export.image
    )
    return [export_path(source)]


def served_artifact(wildcards):
    """The converted artifact if the run needs a conversion, else the export itself."""
    plan = plan_of(wildcards)
    if plan.conversion is None:
        return export_path(plan.export)
    return in_run(CONVERTED, plan, artifact=plan.artifact)


def served_provenance(wildcards):
    """The sidecar of the served artifact: the repository job checks the artifact against it."""
    return f"{served_artifact(wildcards)}.provenance.json"


def served_signature(wildcards):
    """The ONNX export whose inputs a native backend serves (see RunPlan.serves_export_inputs)."""
    plan = plan_of(wildcards)
    return [export_path(plan.export)] if plan.serves_export_inputs else []


def batch_artifacts(suffix=""):
    """With engines: per_batch, a trt run's engine per batch (``suffix``: of its sidecar), in
    the order of the repository spec's batch_models; none for a search candidate, which serves
    the shared engine alone."""

    def files(w):
        if hasattr(w, "variant"):
            return []
        plan = plan_of(w)
        return [
            in_run(CONVERTED_BATCH, plan, batch=b, artifact=plan.artifact) + suffix
            for b in plan.converted_batches
        ]

    return files


def repository_of(wildcards):
    return in_run(REPOSITORY, plan_of(wildcards))


# --- Resources: what a job asks the executor for
# snakemake-executor-plugin-slurm turns `gpu` (+ `gpu_model`) into `--gpus=<model>:1`,
# `slurm_partition` into -p and `constraint` into -C (profiles/slurm); locally `gpu` counts
# against `--resources gpu=N`. Values come from the GPU's GpuRequest (`gpus.<gpu>.slurm`).


# What a job on each GPU's device asks for (a run's plan holds its GPU's: RunPlan.gpu_request).
GPU_REQUESTS = {
    gpu: dbresources.gpu_request_of(settings, config.get("slurm") or {})
    for gpu, settings in config["gpus"].items()
}


def gpu_resources():
    """For `resources:` of the jobs that run on the `{gpu}`'s device (convert, accuracy,
    offline, online, preflight_check): one whole GPU on a GPU device, in its partition; none on
    a CPU device. One entry per GpuRequest field; a value every GPU shares is given as it is,
    since Snakemake calls a function per job and field."""

    def setting(key):
        values = {getattr(request, key) for request in GPU_REQUESTS.values()}
        if len(values) == 1:
            return values.pop()
        return lambda w: getattr(GPU_REQUESTS[w.gpu], key)

    return {f.name: setting(f.name) for f in dataclasses.fields(dbresources.GpuRequest)}


# --- Time limits (deploybench/planning/schedule.py): on a GPU whose partition caps a job's time
# (`gpus.<gpu>.slurm.max_runtime`), scenarios are measured in parts and merged (rules/perf.smk).
PARTED_GPUS = dbresources.gpus_measured_in_parts(config)
PART_STEM = f"{RUN_DIR}/parts/{{scenario}}.{{part}}"
PART_LOG = f"{LOG_DIR}/parts/{{scenario}}.{{part}}"


wildcard_constraints:
    part=r"[0-9]+",


def scenario_parts(suffix):
    """For merge_parts' input: file ``suffix`` of each part of the run's scenario."""

    def files(w):
        plan = plan_of(w)
        return [
            in_run(f"{PART_STEM}.{suffix}", plan, scenario=w.scenario, part=k)
            for k in range(plan.parts[w.scenario])
        ]

    return files


def run_group(step=None):
    """For `group:` of a run's jobs: the group job the plan puts it in on a cluster (None:
    submitted alone). ``step``: the rule's step; a measurement's is its scenario (and part).
    """

    def group(w):
        job = step or w.scenario
        if hasattr(w, "part"):
            job = dbschedule.part_key(job, int(w.part))
        return plan_of(w).group_of(job)

    return group


def site_resources(step=None):
    """For `resources:` of the CPU-only jobs (checkpoint, export, repository): the site's
    account, QOS, reservation and extra options (`slurm:`), as every job asks for them. A run's
    ``step`` in the run's group job asks for none: the group job takes its GPU jobs' (SLURM
    takes one value for the whole allocation)."""
    request = dbresources.site_request(config["slurm"])

    def setting(key):
        if request[key] is None:
            return None  # asked by no job: no function for Snakemake to call per job

        def value(w):
            if step is not None and plan_of(w).group_of(step) is not None:
                return None
            return request[key]

        return value

    return {key: setting(key) for key in request}


def run_runtime(step):
    """For `resources: runtime=` of a run's step: its time limit on a cluster (minutes)."""
    return lambda w: plan_of(w).runtime[step]


def model_runtime(step):
    """For `resources: runtime=` of a model's checkpoint and export steps."""
    return lambda w: model_plan(w.model).runtime[step]


def framework_mem_mb(wildcards):
    """For `resources: mem_mb=` of the framework jobs (checkpoint, export, convert)."""
    return model_plan(wildcards.model).mem_mb


def measurement_mem_mb(wildcards):
    """For `resources: mem_mb=` of the measurement jobs (offline, online, their parts): the
    inputs perf_analyzer keeps over its longest window, plus a baseline
    (deploybench/planning/measurement_memory.py); more than the node's fails here."""
    part = int(wildcards.part) if hasattr(wildcards, "part") else None
    w = wildcards
    return _measurement_mem_mb(w.model, w.gpu, w.format, w.precision, w.scenario, part)


@functools.cache
def _measurement_mem_mb(model, gpu, fmt, precision, scenario, part):
    # Snakemake evaluates a job's resources more than once
    plan = _run_plan(model, gpu, fmt, precision)
    return dbmemory.plan_measurement_mem_mb(
        config, plan, scenario, part, table=published_table()
    )


@functools.cache
def published_table():
    """The published rates by model entry (what sizes a measurement's memory), read once."""
    return dbmemory.published_table(config)


# --- Plots and reports ---------------------------------------------------------------------
PUBLISHED = workflow.source_path("../config/reference/published.csv")
PLOTS = chart_names.RUN_CHARTS
SCENARIOS = dbplan.SCENARIOS
PLOT_STEM = f"{RUN_DIR}/plots/{{name}}"
REPORT_DIR = "reports/{report_set}"
COMPARISON_STEM = f"{REPORT_DIR}/{{model}}/{chart_names.comparison_chart('{scenario}')}"


wildcard_constraints:
    report_set=r"[A-Za-z0-9_-]+",


def plot_files(ext):
    """A run's chart files with extension ``ext`` (patterns over the run's wildcards)."""
    return [f"{RUN_DIR}/plots/{name}.{ext}" for name in PLOTS]


def comparison_files():
    return [
        f"{REPORT_DIR}/{{model}}/{chart_names.comparison_chart(scenario)}.{ext}"
        for scenario in SCENARIOS
        for ext in ("svg", "png", "html")
    ]


def run_fields(path):
    """``model/gpu/format/precision`` as a tuple."""
    return tuple(path.split("/"))


# The report set of the runs under `targets`: the default target draws their charts and pages.
TARGETS_REPORT = "targets"
if TARGETS_REPORT in config["report"]["sets"]:
    raise dbconfig.ConfigError(
        f"report.sets: {TARGETS_REPORT!r} is the report set of the runs under `targets` "
        "(the default target's pages); give the configured set another name"
    )


def runs_in_report(report_set, model):
    """The runs of ``model`` on the GPUs of report set ``report_set`` (``targets``: the runs
    of ``model`` under `targets`)."""
    if report_set == TARGETS_REPORT:
        runs = [r for r in config["targets"] if run_fields(r)[0] == model]
        if not runs:
            raise dbconfig.ConfigError(
                f"model {model!r} has no run under `targets` (report set {TARGETS_REPORT!r})"
            )
        return runs
    sets = config["report"]["sets"]
    if report_set not in sets:
        raise dbconfig.ConfigError(
            f"unknown report set {report_set!r}; valid choices: {', '.join(sorted(sets))}"
        )
    runs = [r for r in report_set_runs(report_set) if run_fields(r)[0] == model]
    if not runs:
        gpus = ", ".join(sets[report_set]["gpus"])
        raise dbconfig.ConfigError(
            f"model {model!r} has no run on the GPUs of report set {report_set!r} ({gpus})"
        )
    return runs


def published_needs(model):
    """What a run of ``model`` needs before its rows are set beside the published ones."""
    return (config["models"].get(model) or {}).get("published_needs") or {}


def report_runs(wildcards):
    """What the report page reads for each run."""
    entries = []
    for path in runs_in_report(wildcards.report_set, wildcards.model):
        plan = _run_plan(*run_fields(path))
        base = in_run(RUN_DIR, plan)
        entries.append(
            {
                "path": path,
                "offline": f"{base}/offline.csv",
                "online": f"{base}/online.csv",
                "provenance": f"{base}/offline.provenance.json",
                "plots": [in_run(p, plan) for p in plot_files("png")],
                "accelerator": plan.accelerator,
                # a GPU run is set beside the published rows once its images' preflight on
                # that GPU passed (the reports of a failed one are never written)
                "preflight": (
                    [
                        PREFLIGHT.format(gpu=plan.gpu, image=i)
                        for i in plan.containers.values()
                    ]
                    if plan.device == "gpu"
                    and not dbserving.container_free(config["gpus"][plan.gpu])
                    else []
                ),
                # the checkpoint's record (its source file's sha256), for a model whose rows
                # are compared only with the published weights (publication_gate)
                "checkpoint": (
                    f"{checkpoint_of(plan.model)}.provenance.json"
                    if "checkpoint" in published_needs(plan.model)
                    else None
                ),
                # the conversion's record (TF-TRT: its engines) for the configuration table
                "conversion": (
                    f"{in_run(CONVERTED, plan, artifact=plan.artifact)}.provenance.json"
                    if plan.conversion is not None
                    else None
                ),
                # a search's section: on the pages of configured sets only (the default
                # target's page would otherwise run the search)
                "search": (
                    search_files(plan)
                    if path in config["search_targets"]
                    and wildcards.report_set != TARGETS_REPORT
                    else None
                ),
            }
        )
    return entries


def report_inputs(wildcards):
    runs = report_runs(wildcards)
    return {
        "csv": [r[s] for r in runs for s in SCENARIOS],
        "provenance": [r["provenance"] for r in runs],
        "conversion": [r["conversion"] for r in runs if r["conversion"]],
        "checkpoint": sorted({r["checkpoint"] for r in runs if r["checkpoint"]}),
        "preflight": sorted({p for r in runs for p in r["preflight"]}),
        "plots": [p for r in runs for p in r["plots"]],
        "search": [f for r in runs if r["search"] for f in r["search"].values()],
    }


def plots_spec(wildcards):
    """For `params: spec=` of rule plots (jobs.plots)."""
    plan = plan_of(wildcards)
    return {
        "run_path": plan.path,
        "stems": {name: in_run(PLOT_STEM, plan, name=name) for name in PLOTS},
        "options": config["report"]["plots"],
    }


def report_spec(wildcards):
    """For `params: spec=` of rule model_report (jobs.report)."""
    return {
        "model": wildcards.model,
        "runs": report_runs(wildcards),
        "stems": {
            s: COMPARISON_STEM.format(
                report_set=wildcards.report_set, model=wildcards.model, scenario=s
            )
            for s in SCENARIOS
        },
        "options": config["report"]["plots"],
    }


def target_reports():
    """The charts of every run under `targets`, and the `targets` page of each of their models."""
    charts = [
        in_run(chart, _run_plan(*run_fields(run)))
        for run in config["targets"]
        for chart in plot_files("html")
    ]
    models = sorted({run_fields(run)[0] for run in config["targets"]})
    return charts + [f"reports/{TARGETS_REPORT}/{model}.html" for model in models]


def all_reports():
    """Every configured report set's page of every model that has runs in it."""
    pages = []
    for report_set in config["report"]["sets"]:
        models = sorted({run_fields(r)[0] for r in report_set_runs(report_set)})
        pages += [f"reports/{report_set}/{m}.html" for m in models]
    return pages


# --- The serving-configuration search (rules/search.smk) -----------------------------------
SEARCH_DIR = f"{RUN_DIR}/search"
CANDIDATE_DIR = f"{SEARCH_DIR}/{{variant}}"
CANDIDATE_LOG = f"{LOG_DIR}/search/{{variant}}"
SEARCH_STEP = f"{SEARCH_DIR}/quick/step{{step}}.json"
SEARCH_SETTINGS = f"{SEARCH_DIR}/settings.json"
PARETO_STEM = f"{SEARCH_DIR}/pareto"
BEST_DIR = f"{RUN_DIR}/best"


wildcard_constraints:
    variant=dbsearch.VARIANT_PATTERN,
    step=r"[0-9]+",


@functools.cache
def _search_plan(model, gpu, fmt, precision):
    return dbsearch_plan.plan_search(config, model, gpu, fmt, precision)


def search_of(wildcards):
    """The search plan of the run named by the job's wildcards."""
    return _search_plan(
        wildcards.model, wildcards.gpu, wildcards.format, wildcards.precision
    )


def candidate_spec(step):
    """For `params: spec=` of a candidate's job: the run's step, served as the variant."""
    return lambda w: search_of(w).variant_plan(w.variant).spec(step)


def candidate_runtime(step):
    return lambda w: search_of(w).variant_plan(w.variant).runtime[step]


def candidate_mem_mb(wildcards):
    """For `resources: mem_mb=` of a candidate's measurement: as its run's online job's."""
    plan = search_of(wildcards).variant_plan(wildcards.variant)
    return dbmemory.plan_measurement_mem_mb(
        config, plan, "online", table=published_table()
    )


def candidate_path(plan, variant, name):
    """A file of candidate ``variant`` of the run of ``plan`` (its repository, online.csv)."""
    return in_run(f"{CANDIDATE_DIR}/{name}", plan, variant=variant)


def candidate_repository(wildcards):
    search_of(wildcards).variant(wildcards.variant)  # a variant this run can serve
    return candidate_path(plan_of(wildcards), wildcards.variant, "repository")


def search_spec(wildcards):
    return search_of(wildcards).spec()


def run_wildcards(wildcards):
    return {k: wildcards[k] for k in ("model", "gpu", "format", "precision")}


def walk_step(wildcards, step):
    """Step ``step`` of the run's quick walk, once made (checkpoint search_step): its file
    and state."""
    made = checkpoints.search_step.get(**run_wildcards(wildcards), step=step)
    path = made.output.state
    with open(path) as f:
        return path, json.load(f)


def walk_previous_step(wildcards):
    """A walk step reads the step before it (none for the first)."""
    step = int(wildcards.step)
    return [walk_step(wildcards, step - 1)[0]] if step else []


def walk_candidates(wildcards):
    """... and every candidate that step had measured or asked for."""
    step = int(wildcards.step)
    if not step:
        return []
    state = walk_step(wildcards, step - 1)[1]
    plan = plan_of(wildcards)
    return [
        candidate_path(plan, n, "online.csv")
        for n in state["measured"] + state["pending"]
    ]


def searched_variants(wildcards):
    """The candidates the choice reads, and the walk's last step (quick) if any."""
    search = search_of(wildcards)
    if search.settings.strategy == "grid":
        return [v.name for v in search.grid()], []
    # each step but the last measures one candidate at least: the walk ends within the cap
    for step in range(search.settings.max_candidates + 2):
        path, state = walk_step(wildcards, step)
        if state["done"]:
            return state["measured"], [path]
    raise dbconfig.ConfigError(f"{search.run.path}: the quick walk did not end")


def searched(name):
    """For the choice's input: file ``name`` of every candidate the search measured."""

    def files(wildcards):
        plan = plan_of(wildcards)
        return [candidate_path(plan, n, name) for n in searched_variants(wildcards)[0]]

    return files


def walk_end(wildcards):
    """The quick walk's last step (none for a grid)."""
    return searched_variants(wildcards)[1]


def search_plots_spec(wildcards):
    plan = plan_of(wildcards)
    return {
        "run_path": plan.path,
        "stem": in_run(PARETO_STEM, plan),
        "options": config["report"]["plots"],
    }


def search_files(plan):
    """A run's search results: its table, choice and chart (as the report reads them)."""
    # planned (and so checked) now: a bad search fails the DAG
    _search_plan(plan.model, plan.gpu, plan.format, plan.precision)
    return {
        "csv": in_run(f"{RUN_DIR}/search.csv", plan),
        "choice": in_run(f"{BEST_DIR}/choice.json", plan),
        "chart": in_run(f"{PARETO_STEM}.png", plan),
    }


def search_results(paths):
    """What `snakemake search` builds for runs given as ``model/gpu/format/precision``."""
    return [
        f for path in paths for f in search_files(_run_plan(*run_fields(path))).values()
    ]
