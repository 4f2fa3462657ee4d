from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import psutil
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.dle_fixtures import tft_reference_checkpoint, write_tft_train_checkpoint

# The modules whose tests start real processes (tritonserver, perf_analyzer, Snakemake, a SLURM
# cluster, stand-in images, pip) or build real networks: marked `slow`, so that `make
# test-fast` (`-m "not e2e and not slow and not rehearsal"`) runs the rest in under 3 minutes.
# Where the time goes: docs/tests.md.
SLOW_MODULES = frozenset(
    {
        "test_bert", "test_bert_engines", "test_browser", "test_checkpoint", "test_containers",
        "test_gpus", "test_nnunet", "test_published_ratios", "test_schedule", "test_compare", "test_cuda_driver",
        "test_driver", "test_energy_node", "test_fp16_accuracy", "test_gpu_engines",
        "test_gpu_kit", "test_image_post", "test_image_versions", "test_import_paths",
        "test_load", "test_locks", "test_measurement_memory", "test_model_contracts",
        "test_non_finite", "test_numpy2_stub", "test_perf_inputs", "test_pip_gpu",
        "test_preflight", "test_process", "test_published", "test_python310", "test_resnet50",
        "test_server", "test_slurm", "test_slurm_qos", "test_tails_run",
        "test_tensorrt_versions", "test_torchscript_on_gpu", "test_triton_metrics",
    }
)  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
    # The shared smoke run starts in the background with the session (smoke_run_in_background):
    # the modules with a test that needs it run last, whole (their module fixtures are set up
    # once), and the others meanwhile. The order within each part is unchanged.
    waiting = {item.module for item in items if uses_smoke_run(item)}
    items[:] = [i for i in items if i.module not in waiting] + [
        i for i in items if i.module in waiting
    ]


def uses_smoke_run(item: pytest.Item) -> bool:
    """Whether the test needs the shared smoke run, through any of its fixtures."""
    return "smoke_run" in getattr(item, "fixturenames", ())


REPO = Path(__file__).resolve().parent.parent
# The stand-in apptainer's builds reach PyPI only (tests/standin_image.py), never NGC's
# registry, which this machine cannot reach: that is what the build's network check asks for.
os.environ.setdefault("DEPLOYBENCH_BUILD_HOSTS", "pypi.org:443")
BIN = Path(sys.executable).parent

# A shell that starts the suite in the background (`make test &`) leaves SIGINT ignored, and
# every child inherits that: the tests that stop jobs with Ctrl-C would see it go nowhere. A
# handled signal is reset to its default in the children (exec), so handle it here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


SMOKE = REPO / "config" / "smoke.yaml"
# Where the shared smoke run keeps TFT's DLE-layout checkpoint (relative to its workdir).
SMOKE_TFT_CHECKPOINT = "checkpoints/electricity_bin"
# The shared smoke run reads energy from the stand-in NVML (tests/fixtures/fake_libnvidia_ml.c)
# at its default power: a GPU's chain, up to the driver, on the CPU.
SMOKE_NVML_POWER_W = 150.0
# How far two measurements of one configuration on this kind of shared 2-core machine may lie
# apart while the rest of the suite runs beside them (the smoke run shares the cores with the
# tests; alone the machine moves 10-50 % between runs, and one CI run saw energy per inference
# 1.71 ± 0.62 times apart between two of the smoke run's measurements): the threshold at which
# a difference between two real measurements is more than the machine. No test asserts that
# two measurements here agree more closely (docs/tests.md).
RUN_TO_RUN_PCT = 100.0


def base_config() -> dict[str, Any]:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def seed_models(config: dict[str, Any]) -> set[str]:
    """The model entries that reproduce a seed page's model: those whose published model
    (``reference.model``, by default the entry's name) has rows in the shipped published table.
    A model added without a seed page is not one: the tests of DLE's facts leave it out."""
    import csv

    with (REPO / "config" / "reference" / "published.csv").open() as f:
        published = {row["model"] for row in csv.DictReader(f)}
    return {
        name
        for name, settings in config["models"].items()
        if settings.get("reference", {"model": name})["model"] in published
    }


def validated(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as the workflow sees it: checked against the schema, its defaults filled in."""
    from snakemake.utils import validate

    validate(config, str(REPO / "config" / "schema" / "config.schema.yaml"))
    return config


def smoke_config() -> dict[str, Any]:
    """The shipped config with config/smoke.yaml layered over it (as ``--configfile`` does)."""
    from deploybench.planning.workflow_config import deep_merge

    return deep_merge(base_config(), yaml.safe_load(SMOKE.read_text()))


# `perf` settings that measure once a point, with no duration floor: for the tests that need a
# measurement, not its statistics (the smoke run checks those)
ONCE_A_POINT = {"trials": 1, "min_duration_ms": 0}


def orchestration_config() -> dict[str, Any]:
    """``smoke_config()`` with TFT measured ``ONCE_A_POINT``: for the tests of where and how
    jobs run (containers, SLURM)."""
    config = smoke_config()
    config["sizings"]["cpu"]["tft"]["perf"].update(ONCE_A_POINT)
    return config


# The workflow's rules as Snakemake parses them (its API, in a process of its own: the Snakefile
# sets up logging and the environment), each with the `role` of its `container:` function.
WORKFLOW_RULES_PROBE = """
import json, sys, tempfile
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import OutputSettings, ResourceSettings
with tempfile.TemporaryDirectory() as work, SnakemakeApi(OutputSettings(quiet=True)) as api:
    workflow = api.workflow(
        resource_settings=ResourceSettings(cores=1), snakefile=Path(sys.argv[1]), workdir=Path(work)
    )
    workflow.dag()
    rules = workflow._workflow.rules
    print(json.dumps([[r.name, getattr(r.container_img, "role", None)] for r in rules]))
"""


def workflow_rules() -> list[Any]:
    """The Snakefile's rules: ``name`` and ``container_img`` (with its ``role``, or None)."""
    out = subprocess.run(
        [sys.executable, "-c", WORKFLOW_RULES_PROBE, str(REPO / "Snakefile")],
        capture_output=True, text=True, check=True, cwd=REPO,
    ).stdout  # fmt: skip
    return [
        SimpleNamespace(name=name, container_img=SimpleNamespace(role=role) if role else None)
        for name, role in json.loads(out.splitlines()[-1])
    ]


def write_config(workdir: Path, config: dict[str, Any]) -> None:
    (workdir / "config").mkdir(exist_ok=True)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``text`` (a test's own folder)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def shm_regions() -> set[str]:
    """Shared-memory regions now in /dev/shm (our lock files are meant to stay)."""
    from deploybench.server import SHM_DIR

    return {p.name for p in SHM_DIR.iterdir() if not p.name.endswith(".lock")}


def held_shm() -> set[str]:
    """The /dev/shm regions a live process has open or mapped: in use (on a shared machine,
    another job's)."""
    from deploybench.server import SHM_DIR

    held = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            maps = (proc / "maps").read_text()
            links = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:  # gone, or not ours to read
            continue
        paths = [line.split(maxsplit=5)[-1] for line in maps.splitlines()] + links
        held |= {Path(p).name for p in paths if p.startswith(f"{SHM_DIR}/")}
    return held


def leaked_shm(before: set[str]) -> set[str]:
    """The regions made since ``before`` that no live process holds: left behind. Another job's
    regions in use, made meanwhile on a shared machine, are not."""
    made = shm_regions() - before
    return made - held_shm() if made else made


def snakemake_command(
    workdir: Path,
    *args: str,
    snakefile: Path = REPO / "Snakefile",
    env: dict[str, str] | None = None,
    path_first: tuple[Path, ...] = (),
) -> tuple[list[str], dict[str, str]]:
    """Snakemake with the local profile, and its environment (``path_first`` before the venv
    on PATH)."""
    cmd = [
        str(BIN / "snakemake"),
        "--snakefile", str(snakefile),
        "--directory", str(workdir),
        "--profile", str(REPO / "profiles" / "local"),
        *args,
    ]  # fmt: skip
    path = os.pathsep.join([*map(str, path_first), str(BIN), os.environ.get("PATH", "")])
    return cmd, {**os.environ, **(env or {}), "PATH": path}


def run_snakemake(
    workdir: Path, *args: str, timeout: float = 900, **options: Any
) -> subprocess.CompletedProcess[str]:
    cmd, env = snakemake_command(workdir, *args, **options)
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def planned_jobs(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    """Rule → job count from a dry run's "Job stats" table ({} when nothing is to be done)."""
    out = result.stdout + result.stderr
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1]
    jobs = {}
    for line in table.splitlines()[3:]:
        match = re.match(r"^(\S+)\s+(\d+)$", line.strip())
        if not match:
            break
        if match.group(1) != "total":
            jobs[match.group(1)] = int(match.group(2))
    return jobs


@pytest.fixture
def config() -> dict[str, Any]:
    return base_config()


# `make test` runs the suite on two pytest-xdist workers (docs/tests.md "Where the time goes"):
# the name of this one ("gw0", "gw1"), None in a plain pytest session.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
# Ctrl-C (pytest_keyboard_interrupt): a worker's session ends without waiting for the smoke run
INTERRUPTED = threading.Event()


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    INTERRUPTED.set()


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this session shares (their own folders' parent)."""
    return tmp_path_factory.getbasetemp().parent


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (made if missing) among this session's workers."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# beside the smoke run's output: the command lines of the processes it left when it ended, and
# then its exit status (the file the other workers wait for)
LEFT_BEHIND = "left-behind.json"
RETURNCODE = "returncode"


class BackgroundSmokeRun:
    """The shared smoke run's Snakemake, started in the background in a session of its own
    (its process group: stopped whole), its output in files beside the run's folder, and its
    exit status in ``returncode`` there once it ends (the other workers wait for that file)."""

    # about 15 minutes on an idle machine, longer beside the other tests; allow for a machine
    # shared with other work
    TIMEOUT_S = 3000

    def __init__(self, workdir: Path, output: Path) -> None:
        self.workdir, self.output = workdir, output
        self.stdout, self.stderr = output / "stdout", output / "stderr"
        self.returncode_file = output / RETURNCODE
        cmd, env = snakemake_command(workdir, "all", "cpu", "search")
        if XDIST_WORKER and os.geteuid() == 0:
            # ahead of the two workers' tests on two cores: the tests that need it wait for it
            cmd = ["nice", "-n", "-5", *cmd]
        self.deadline = time.monotonic() + self.TIMEOUT_S
        self.last_seen_by, self.killed_reported = "the session's start", False
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=err, env=env, start_new_session=True
            )
        self.recorder = threading.Thread(target=self._record_end, daemon=True)
        self.recorder.start()

    def _record_end(self) -> None:
        """Its exit status, and the processes it left (before any test uses its folder: the
        other worker's tests run commands on it), in its output folder."""
        code = self.proc.wait()
        left = [" ".join(proc.info["cmdline"]) for proc in processes_mentioning(str(self.workdir))]
        (self.output / LEFT_BEHIND).write_text(json.dumps(left))
        written = self.returncode_file.with_suffix(".partial")
        written.write_text(str(code))
        written.rename(self.returncode_file)  # whole, or not there

    def wait(self) -> subprocess.CompletedProcess[str]:
        """Its end (stopped at the deadline: a timeout fails the test that waits)."""
        try:
            self.proc.wait(timeout=max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        self.recorder.join()
        return subprocess.CompletedProcess(
            self.proc.args, self.proc.returncode, self.stdout.read_text(), self.stderr.read_text()
        )

    def check_alive(self, test: str) -> None:
        """Fails once, naming the test last seen with it running, if it was killed by a signal
        (it is never signalled but by ``stop``)."""
        if self.proc.poll() is None:
            self.last_seen_by = test
        elif self.proc.returncode < 0 and not self.killed_reported:
            self.killed_reported = True
            signame = signal.Signals(-self.proc.returncode).name
            elsewhere = " (or a test on the other worker)" if XDIST_WORKER else ""
            pytest.fail(
                f"the background smoke run was killed ({signame}) during or just after"
                f" {self.last_seen_by}{elsewhere}: a test may stop only its own processes"
                " (or the OOM killer took it)",
                pytrace=False,
            )

    def stop(self) -> None:
        """Snakemake stopped as Ctrl-C stops it (its jobs with it), killed after a minute."""
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class SmokeRunOfAnotherWorker:
    """The shared smoke run as a worker that did not start it sees it: its folder, and its end
    when the worker that started it writes its exit status."""

    def __init__(self, workdir: Path, output: Path) -> None:
        self.workdir, self.output = workdir, output
        self.deadline = time.monotonic() + BackgroundSmokeRun.TIMEOUT_S

    def wait(self) -> subprocess.CompletedProcess[str]:
        returncode = self.output / RETURNCODE
        while not returncode.exists():
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"the smoke run in {self.workdir} did not end in time")
            time.sleep(1)
        text = {name: (self.output / name).read_text() for name in ("stdout", "stderr")}
        code = int(returncode.read_text())
        return subprocess.CompletedProcess([], code, text["stdout"], text["stderr"])

    def check_alive(self, test: str) -> None:
        """The worker that started it checks it."""

    def stop(self) -> None:
        """The worker that started it stops it."""


@pytest.fixture(scope="session", autouse=True)
def smoke_run_in_background(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BackgroundSmokeRun | SmokeRunOfAnotherWorker | None]:
    """One real run of every model on the CPU default at smoke sizes (shared by e2e tests):
    the default target, rule `cpu` (fp32) and TFT's 2x2 grid search (`search`), through real
    tritonserver and perf_analyzer, started with the session when a selected test needs it
    (`smoke_run` waits for it; those tests run last). The CPU's fp16 chain runs in
    tests/test_gpu_kit.py, as the GPU kit runs it.

    ``DEPLOYBENCH_SMOKE_RUN=<dir>`` reuses a finished one while iterating on the tests (the
    tests only copy it); CI always makes its own."""
    if os.environ.get("DEPLOYBENCH_SMOKE_RUN") or not any(
        uses_smoke_run(item) for item in request.session.items
    ):
        yield None
        return
    if XDIST_WORKER:  # one run for the workers: the first to make the folder starts it
        shared = shared_folder(tmp_path_factory)
        wd, output = shared / "smoke-run", shared / "smoke-run-output"
        try:
            output.mkdir()
        except FileExistsError:
            yield SmokeRunOfAnotherWorker(wd, output)
            return
        wd.mkdir()
    else:
        wd = tmp_path_factory.mktemp("smoke-run")
        output = tmp_path_factory.mktemp("smoke-run-output")
    config = smoke_config()
    # The default run's TFT serves a checkpoint as DLE 23.04+'s train.py writes it
    # (``TFTpart2.`` names), with the weights of the DLE reference fixture.
    _, _, state = tft_reference_checkpoint("TFTpart2")
    write_tft_train_checkpoint(wd / SMOKE_TFT_CHECKPOINT, state)
    config["models"]["tft"]["checkpoint"] = SMOKE_TFT_CHECKPOINT
    # energy from the stand-in NVML (its counter advances at SMOKE_NVML_POWER_W), 0.3 s of idle
    # (3 windows) before and after each sweep, no settling
    from tests.nvml_standin import build_fake_nvml

    library = build_fake_nvml(tmp_path_factory.mktemp("fake-nvml"))
    config["energy"] = {
        "meter": {"cpu": "nvml"},
        "settle_s": 0,
        "idle_s": 0.3,
        "idle_windows": 3,
        "nvml_library": str(library),
    }
    write_config(wd, config)
    run = BackgroundSmokeRun(wd, output)
    yield run
    if XDIST_WORKER and not INTERRUPTED.is_set() and not request.session.shouldstop:
        # the other worker may be waiting for it: this one ran out of tests first
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.wait()
    run.stop()  # a session that ends before its tests (-x, Ctrl-C) leaves nothing running


@pytest.fixture(autouse=True)
def leaves_the_smoke_run_alone(
    request: pytest.FixtureRequest,
    smoke_run_in_background: BackgroundSmokeRun | SmokeRunOfAnotherWorker | None,
) -> Iterator[None]:
    """A test during which the background smoke run was killed is named: a test stops only its
    own processes (the smoke run is a child of this session too). Checked as each test starts
    and ends (a signal takes a moment to land: the next test's start names the last one)."""
    run = smoke_run_in_background
    if run is not None:
        run.check_alive(request.node.nodeid)
    yield
    if run is not None:
        run.check_alive(request.node.nodeid)


@pytest.fixture(scope="session")
def smoke_run(
    smoke_run_in_background: BackgroundSmokeRun | SmokeRunOfAnotherWorker | None,
) -> Path:
    """The shared smoke run's folder, once it has finished (smoke_run_in_background)."""
    reuse = os.environ.get("DEPLOYBENCH_SMOKE_RUN")
    if reuse:
        return Path(reuse)
    assert smoke_run_in_background is not None
    result = smoke_run_in_background.wait()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert json.loads((smoke_run_in_background.output / LEFT_BEHIND).read_text()) == []
    return smoke_run_in_background.workdir


@pytest.fixture(scope="session")
def reported(
    smoke_run: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, int]]:
    """A copy of the shared CPU run with `snakemake report` run in it, and the jobs its dry run
    planned (tests/test_report.py, tests/test_browser.py): made once for the workers."""
    if not XDIST_WORKER:
        return _reported(smoke_run, tmp_path_factory.mktemp("report"))
    shared = shared_folder(tmp_path_factory)
    with locked(shared / "report.lock"):
        return _reported(smoke_run, shared / "report")


def _reported(smoke_run: Path, folder: Path) -> tuple[Path, dict[str, int]]:
    """``reported`` in ``folder``, or what an earlier call made there."""
    work, made = folder / "work", folder / "planned.json"
    if made.exists():
        return work, json.loads(made.read_text())
    shutil.copytree(smoke_run, work, symlinks=True)
    planned = planned_jobs(run_snakemake(work, "-n", "report"))
    result = run_snakemake(work, "report")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    made.write_text(json.dumps(planned))
    return work, planned


@pytest.fixture
def copy_of(smoke_run: Path, tmp_path: Path) -> Path:
    """A copy of the finished smoke run (mtimes and Snakemake metadata kept) to break things in."""
    copy = tmp_path / "copy"
    shutil.copytree(smoke_run, copy, symlinks=True)
    return copy


# NumPy 2, as a GPU image has (the device tool's KINDS.md: numpy 2.5); this venv keeps NumPy 1
# (nvidia-pytriton pins numpy<2).
NUMPY_2 = "numpy==2.2.6"
KIT = REPO / "benchmarks" / "gpu" / "kit"


def _venv_with_numpy_2(folder: Path) -> Path:
    """A venv (no pip) at ``folder`` whose site-packages holds NumPy 2; its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = folder / "lib" / version / "site-packages"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # not compiled here (5 s of the 7): Python compiles what is imported, on first import
    subprocess.run([*pip, "--no-deps", "--no-compile", "--target", str(site), NUMPY_2], check=True)
    return site


@pytest.fixture(scope="session")
def numpy2_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python whose NumPy is 2.x and whose other packages are this venv's: a venv holding only
    NumPy, with this venv's site-packages behind it (a ``.pth``). Its own venv, not
    ``PYTHONPATH``, because Triton's python-backend stub takes the packages of the venv of the
    ``python3`` first on ``PATH`` and ignores ``PYTHONPATH`` (seen here)."""
    venv = tmp_path_factory.mktemp("numpy2") / "venv"
    site = _venv_with_numpy_2(venv)
    (site / "zz_workflow.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin" / "python"


def kit_script(name: str) -> ModuleType:
    """benchmarks/gpu/kit/<name>.py, a script, as a module (bundle's file lists and readers,
    keep's folder)."""
    spec = importlib.util.spec_from_file_location(f"kit_{name}", KIT / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def device_image_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stand-in for a lent GPU machine's Python: a venv holding only the distributions its
    image has (``benchmarks/gpu/kit/device-image.txt``, from the device tool's KINDS.md) that this venv also has,
    with what this venv's versions of them require, linked from this venv, and NumPy 2 as the
    image has. No Snakemake, jsonschema, tritonclient,
    pytriton or CUDA 12 runtime: what the GPU kit forgets to carry is missing here too."""
    venv = tmp_path_factory.mktemp("device-image") / "venv"
    site = _venv_with_numpy_2(venv)
    listed = kit_script("bundle").requirement_names(KIT / "device-image.txt")
    image = {canonicalize_name(name) for name in listed} - {"numpy"}
    purelib = Path(sysconfig.get_paths()["purelib"])
    # each top-level entry of this venv's site-packages and the distributions owning it
    owners: dict[str, set[str]] = {}
    files: dict[str, list[Path]] = {}
    requires: dict[str, list[str]] = {}
    for dist in importlib.metadata.distributions(path=[str(purelib)]):
        name = canonicalize_name(dist.metadata["Name"])
        entries = [Path(f) for f in dist.files or [] if not str(f).startswith("..")]
        files[name] = entries
        requires[name] = dist.requires or []
        for entry in entries:
            owners.setdefault(entry.parts[0], set()).add(name)
    # with what this venv's versions of them require (the image's own versions have theirs)
    wanted, todo = image & set(files), list(image & set(files))
    while todo:
        for requirement in map(Requirement, requires.get(todo.pop(), [])):
            needed = canonicalize_name(requirement.name)
            marker = requirement.marker
            applies = marker is None or marker.evaluate({"extra": ""})
            if applies and needed in files and needed not in wanted:
                wanted.add(needed)
                todo.append(needed)
    for name in sorted(wanted):
        for entry in files[name]:
            top = entry.parts[0]
            # a folder other distributions share (a namespace such as google/): its own parts
            depth = 1 if owners[top] <= wanted else 2
            if len(entry.parts) < depth:
                continue
            link = site.joinpath(*entry.parts[:depth])
            if not link.exists() and not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(purelib.joinpath(*entry.parts[:depth]))
    return venv / "bin" / "python"
