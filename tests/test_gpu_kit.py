"""benchmarks/gpu/kit: the GPU kit, built and run here as far as a machine without a GPU allows.

The kit is what one call on a lent GPU machine needs (benchmarks/gpu/README.md, "The kit"). Here:
the device's kit (Python 3.12, with the in-process extras) is built and must fit one call, with
the server, perf_analyzer and packages in place; a kit for this Python is built, unpacked into a
clean folder by the device command, which runs the CPU entry end to end from a copy of the
tree with the kit's tritonserver, perf_analyzer and Snakemake, on a stand-in for the GPU image's
Python: only the distributions the image has (``device_image_python``), NumPy 2 among them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from tritonclient.grpc import model_config_pb2

from deploybench.planning import run_plan as dbplan
from deploybench.planning import workflow_config as dbc
from deploybench.planning.workflow_config import deep_merge
from deploybench.triton_config import read_config
from tests.conftest import (
    REPO,
    base_config,
    kit_script,
    planned_jobs,
    processes_mentioning,
    run_snakemake,
    validated,
    write_config,
)
from tests.test_server import wait_no_processes

BUNDLE = REPO / "benchmarks" / "gpu" / "kit" / "bundle.py"
KIT_CONFIG = REPO / "benchmarks" / "gpu" / "kit" / "kit.yaml"
THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# the device command's run on the CPU entry: its online points (concurrency), one trial each
ONLINE_POINTS = [1, 2, 3, 4, 5]


def start_kit_build(out: Path, *args: str, nice: int = 0) -> subprocess.Popen[str]:
    """bundle.py building a kit into ``out`` (its wheels and stage beside it), its output in
    ``out.parent``; ``nice``: its CPU priority (19: only what other processes leave idle)."""
    log = out.parent / "bundle.out"
    with log.open("w") as stdout, (out.parent / "bundle.err").open("w") as stderr:
        return subprocess.Popen(
            [
                *(["nice", "-n", str(nice)] if nice else []),
                sys.executable,
                str(BUNDLE),
                "--out",
                str(out),
                "--build",
                str(out.parent / "build"),
                *args,
            ],
            stdout=stdout,
            stderr=stderr,
            text=True,
            start_new_session=True,  # its own process group: stopped with xz and pip
        )


def stop_kit_build(build: subprocess.Popen[str]) -> None:
    if build.poll() is None:
        os.killpg(build.pid, signal.SIGKILL)
        build.wait()


def finish_kit_build(build: subprocess.Popen[str], out: Path) -> dict:
    """The summary bundle.py printed, once it has built the kit. A build started at a low
    priority gets the default back now that a test waits for it, where this user may raise it
    (root); else it goes on at its own, beside whatever else runs (the smoke run)."""
    if build.poll() is None:
        with contextlib.suppress(PermissionError, ProcessLookupError):
            os.setpriority(os.PRIO_PGRP, build.pid, 0)
    try:
        build.wait(timeout=1800)
    finally:
        stop_kit_build(build)
    stdout = (out.parent / "bundle.out").read_text()
    stderr = (out.parent / "bundle.err").read_text()
    assert build.returncode == 0, stdout[-2000:] + stderr[-3000:]
    summary = json.loads(stdout[: stdout.index("\n}\n") + 2])
    assert "command: bash benchmarks/gpu/kit/run.sh" in stdout
    return summary


def build_kit(out: Path, *args: str) -> dict:
    return finish_kit_build(start_kit_build(out, *args), out)


@pytest.fixture(scope="module")
def device_kit_build(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """The device's kit (Python 3.12, xz -6: most of its minutes are xz's CPU), built in the
    background at the lowest priority from the first test that needs a kit: it takes the CPU
    the kit's runs on this machine leave idle (their measurement windows, servers starting),
    and its tests come last in this module. Stopped at the module's end if still going."""
    out = tmp_path_factory.mktemp("device-kit") / "kit"
    build = start_kit_build(out, nice=19)
    yield build, out
    stop_kit_build(build)


@pytest.fixture(scope="module")
def device_kit(device_kit_build: tuple[subprocess.Popen[str], Path]) -> tuple[dict, Path]:
    build, out = device_kit_build
    return finish_kit_build(build, out), out


@pytest.fixture(scope="module")
def local_kit(
    tmp_path_factory: pytest.TempPathFactory,
    device_kit_build: tuple[subprocess.Popen[str], Path],
) -> Path:
    """A kit for this machine's Python, not the device's: it is not carried, so xz's fastest
    preset (the same files in a larger archive: seconds, not minutes of CPU). The device's kit
    starts building first, in the background (``device_kit_build``)."""
    out = tmp_path_factory.mktemp("local-kit") / "kit"
    build_kit(out, "--python", THIS_PYTHON, "--gpu", "cpu", "--not-carried")
    return out / "kit.tar.xz"


def working_tree_copy(dest: Path) -> Path:
    """What a device call receives (bundle.py's list of the files that travel)."""
    for path in kit_script("bundle").travelling_files(REPO):
        if (REPO / path).is_file():
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / path, dest / path)
    return dest


def kit_environment(out: Path, python: Path, kit: Path, kit_dir: Path, **more: str) -> dict:
    """run.sh's environment: the kit, the stand-in image's Python, the smoke sizing, and none of
    this venv's overrides."""
    env = {
        **os.environ,
        "OUT": str(out),
        "PYTHON": str(python),
        "KIT_ARCHIVE": str(kit),
        "KIT_DIR": str(kit_dir),
        "KIT_CONFIGFILES": "config/smoke.yaml",
        **more,
    }
    for name in ("DEPLOYBENCH_TRITONSERVER", "DEPLOYBENCH_PERF_ANALYZER", "PYTHONPATH"):
        env.pop(name, None)
    return env


def run_kit(tree: Path, env: dict, *args: str) -> tuple[subprocess.CompletedProcess[str], str]:
    run = subprocess.run(
        ["bash", "benchmarks/gpu/kit/run.sh", *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    return run, run.stdout + run.stderr


def run_kit_cutting(
    tree: Path, env: dict, cut: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    """``run_kit``, and once ``cut`` (a partial file) holds a finished point, SIGUSR1 to
    run.sh: its share's timer (share.sh), fired now, so that the run is cut while that
    scenario has points still to measure."""
    from deploybench.partial import finished_points, read

    proc = subprocess.Popen(
        ["bash", "benchmarks/gpu/kit/run.sh", *args],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def watch() -> None:
        while proc.poll() is None:
            try:
                finished = finished_points(read(cut))
            except (OSError, KeyError, ValueError):  # the file written or removed as it is read
                finished = []
            if finished:
                proc.send_signal(signal.SIGUSR1)
                return
            time.sleep(0.05)  # the sooner, the likelier the other points are mid-trial

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, _ = proc.communicate(timeout=1200)
    watcher.join()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, ""), out


def test_the_device_command_runs_the_cpu_entry_end_to_end(local_kit, device_image_python, tmp_path):
    """What a lent GPU's call does, on the CPU entry: the canary, then fp32 and fp16 each its
    own Snakemake run, packed after each, and the in-process checks when asked. fp16's share
    runs out in its online scenario, after its first point: the call says it cut the run
    (exit status 4, not timeout's 124) and which points it kept, and returns them, marked
    partial, in the summary, the table and the archive."""
    tree = working_tree_copy(tmp_path / "tree")
    out, kit_dir = tmp_path / "out", tmp_path / "unpacked"
    # five online points of one trial each, so that the cut comes with one finished and
    # others not: the first point finishes with its trial, and the four after it leave the
    # cut four trials (3 s at least each) to land. Two left were too few for a CI machine
    # running two test workers beside the smoke run: the cut came 10 s after the first point,
    # as the run finished. One trial a point, not the smoke sizing's three: what is checked
    # here is the chain, not the statistics (the smoke run checks those).
    five_points = tmp_path / "five-online-points.yaml"
    perf = {"trials": 1, "online": {"concurrency": ONLINE_POINTS, "batch": 1}}
    five_points.write_text(yaml.safe_dump({"sizings": {"cpu": {"tft": {"perf": perf}}}}))
    env = kit_environment(
        out,
        device_image_python,
        local_kit,
        kit_dir,
        KIT_CONFIGFILES=f"config/smoke.yaml {five_points}",
        # a 2-core CI machine at smoke size: more than a GPU call's 540 s
        KIT_BUDGET_S="900",
        # the in-process checks as on a GPU, on the CPU at smoke size
        KIT_IN_PROCESS="1",
        # (not nnU-Net: its fp16 3-D convolutions take minutes on a CPU even at smoke size;
        # 2 timed calls, not run.sh's 20: fp16 FastPitch takes half a second a call on a CPU)
        KIT_IN_PROCESS_ARGS="--device cpu --configfile config/smoke.yaml --models fastpitch bert"
        " --iterations 2",
    )
    runs = [f"results/tft/cpu/ts-trace/{p}" for p in ("fp32", "fp16")]
    cut = tree / runs[1] / "online.partial.jsonl"
    run, log = run_kit_cutting(tree, env, cut, "cpu", "fp32", "fp16")
    assert run.returncode == 4, log[-5000:]  # cut, and nothing failed
    assert {p.name for p in out.iterdir()} == {
        "run.log", "environment.json", "nvidia-smi.txt", "gpu-apps.csv", "canary.json",
        "summary.txt", "beside_published.md", "results.tar.gz",
    }  # fmt: skip
    assert "fp16: CUT at its share" in log, log[-5000:]
    # what the call says it kept (its lines up to the next of the kit's own)
    kept_section = log.split("fp16: CUT at its share", 1)[1].split("\n[kit", 1)[0]
    assert "\n  offline: complete\n" in kept_section, kept_section
    # the cut comes as the first point finishes; the next may finish a trial later only if
    # the cut took a whole trial to land, and then both are listed (never a finished run)
    planned = len(ONLINE_POINTS)
    said = re.search(rf"\n  online: (\d) of {planned} points kept \((.+)\)", kept_section)
    assert said, kept_section
    points_kept = int(said.group(1))
    expected = [f"batch 1 conc. {c}" for c in ONLINE_POINTS][:points_kept]
    assert 1 <= points_kept < planned and said.group(2) == ", ".join(expected), kept_section
    environment = json.loads((out / "environment.json").read_text())
    # the kit's server and perf_analyzer, under NumPy 2 as on the GPU image
    assert environment["numpy"].startswith("2.")
    assert environment["tritonserver"] == str(kit_dir / "pytriton/tritonserver/bin/tritonserver")
    assert environment["perf_analyzer_rc"] == 0
    assert "2.41.0" in environment["perf_analyzer_version"]
    assert environment["kit"]["python"] == THIS_PYTHON
    # the canary ran first, FP16 included, under NumPy 2 (tensors cross the stub by DLPack)
    canary = json.loads((out / "canary.json").read_text())
    assert canary["passed"] and canary["device"] == "cpu", canary
    assert log.index("canary: passed") < log.index("snakemake results/tft/cpu/ts-trace/fp32")
    # fp32 before fp16, each its own run
    assert log.index("fp32: snakemake exit status 0") < log.index("ts-trace/fp16 (")
    with tarfile.open(out / "results.tar.gz") as archive:
        names = set(archive.getnames())
        for run_dir in runs:
            for csv in ("accuracy", "offline", "online"):
                if run_dir == runs[1] and csv == "online":  # cut: its kept trials only
                    assert f"{run_dir}/online.partial.jsonl" in names
                    assert f"{run_dir}/online.csv" not in names
                    continue
                assert f"{run_dir}/{csv}.csv" in names
                assert f"{run_dir}/{csv}.provenance.json" in names
        assert not any(n.endswith(".pt") for n in names)  # artifacts stay behind
        assert "results/kit-in-process/torchscript_on_gpu.csv" in names
        assert "results/kit-canary/canary.json" in names
        archive.extractall(tmp_path / "back", filter="data")
    # the CPU default's fp16 run, as a GPU's: fp16 TorchScript made on the run's device and
    # served with FP16 tensors, which perf_analyzer was sent as base64 (perf_inputs.BASE64_TYPES)
    fp16 = tree / runs[1]
    served = read_config(fp16 / "repository/tft/config.pbtxt")
    types = {model_config_pb2.DataType.Name(t.data_type) for t in served.input}
    assert "TYPE_FP16" in types and "TYPE_FP32" not in types, types
    conversion = json.loads((fp16 / "convert/model.pt.provenance.json").read_text())
    assert conversion["conversion"]["parameters"]["device"] == "cpu"
    for run_dir in runs:
        back = tmp_path / "back" / run_dir
        assert pd.read_csv(back / "accuracy.csv")["passed"].all()
        offline = pd.read_csv(back / "offline.csv")
        assert len(offline) == 2  # the smoke sizing's points
        assert (offline["throughput"] > 0).all()
    assert len(pd.read_csv(tmp_path / "back" / runs[0] / "online.csv")) == planned
    # the smoke run's offline batch 1 beside the published A100 ts-trace row of electricity
    # (205 infer/s; traffic's is 200.3), each column named by what measured it
    beside = (out / "beside_published.md").read_text()
    assert "| offline | 1 | 1 | 205.0, 5.3 |" in beside, beside
    assert re.search(r"\| CPU .+ \(\d+ cores\) \(cpu fp16\): infer/s", beside), beside
    in_process = pd.read_csv(tmp_path / "back" / "results/kit-in-process/torchscript_on_gpu.csv")
    assert set(in_process["model"]) == {"fastpitch", "bert"}, in_process
    assert in_process["error"].isna().all(), in_process
    summary = (out / "summary.txt").read_text()
    assert "accuracy: passed" in summary and "offline" in summary and "online" in summary
    assert "ts-trace/fp16" in summary
    # fp16's online point that finished, marked partial; the other not shown
    assert f"PARTIAL: {points_kept} of {planned} points finished" in summary, summary
    partial_row = r"^\| online \| 1 \| 1 \| .+ \| .+ \(partial\); [^|]+ \|$"
    assert re.search(partial_row, beside, re.MULTILINE), beside
    assert "no GPU" in (out / "gpu-apps.csv").read_text()
    # kept for a commit as it came back: benchmarks/gpu/results/<date>-<gpu>/
    kept = kit_script("keep").keep(out, tmp_path / "kept")
    assert kept.name == f"{environment['date'][:10]}-cpu"
    assert (kept / "run.log").is_file() and (kept / "canary.json").is_file()
    assert (kept / runs[0] / "online.csv").read_bytes() == (
        tmp_path / "back" / runs[0] / "online.csv"
    ).read_bytes()
    assert (kept / runs[1] / "online.partial.jsonl").is_file()
    assert json.loads((kept / "kept.json").read_text())["tree"]["commit"]


def test_a_run_past_its_share_is_cut_as_slurm_cuts_a_job_and_leaves_no_timer():
    """share.sh: at its share the command's whole process group gets SIGTERM (its jobs keep
    their trials, deploybench.partial) and CUT says so, with the command's own status; a
    command that ends within its share is not cut; no timer outlives either."""
    share = REPO / "benchmarks" / "gpu" / "kit" / "share.sh"
    # (durations no other process sleeps: what is left is found by its command line)
    script = f"""
        source {share}
        run_with_share 1 bash -c 'trap "echo stopped by TERM; exit 7" TERM; sleep 31.7 & wait'
        echo "cut: status $? CUT=$CUT"
        run_with_share 29.3 bash -c 'exit 3'
        echo "in time: status $? CUT=$CUT"
    """
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert "stopped by TERM\ncut: status 7 CUT=1\n" in done.stdout, done.stdout + done.stderr
    assert "in time: status 3 CUT=0" in done.stdout
    assert time.monotonic() - started < 15  # neither the 29.3-s share nor the 31.7-s sleep
    assert wait_no_processes("31.7", timeout=5) == wait_no_processes("29.3", timeout=5) == []


def test_a_broken_kit_stops_at_the_canary_naming_the_step(local_kit, device_image_python, tmp_path):
    """A kit whose perf_analyzer cannot load its CUDA runtime (the link to pytriton's copy
    missing, as a library perf_analyzer cannot find on a machine): the call stops in the canary,
    at its first perf_analyzer step, within its deadline, before any Snakemake run, and keeps
    what it has."""
    # the kit less that link, copied member by member (run.sh's tarfile reads any tar)
    broken = tmp_path / "broken.tar"
    removed = "perf-analyzer/lib/libcudart.so.12"
    left_out = []
    with tarfile.open(local_kit) as kit, tarfile.open(broken, "w") as copy:
        for member in kit:  # in one pass: each member's data follows its header
            if member.name.removeprefix("./") == removed:
                left_out.append(member.name)
                continue
            copy.addfile(member, kit.extractfile(member) if member.isfile() else None)
    assert len(left_out) == 1, left_out
    tree = working_tree_copy(tmp_path / "tree")
    out = tmp_path / "out"
    env = kit_environment(out, device_image_python, broken, tmp_path / "unpacked")
    run, log = run_kit(tree, env, "cpu")
    assert run.returncode == 3, log[-5000:]
    assert "STOPPED at step 'canary perf_float32'" in log, log[-3000:]
    canary = json.loads((out / "canary.json").read_text())
    assert canary["failed_step"] == "perf_float32"
    failed = canary["steps"][-1]
    assert "libcudart.so.12" in failed["detail"], failed
    assert canary["seconds"] < 60  # the canary's deadline: the call stops within it
    assert "snakemake results/" not in log and not (tree / "results" / "tft").exists()
    with tarfile.open(out / "results.tar.gz") as archive:
        assert "results/kit-canary/canary.json" in archive.getnames()
    assert processes_mentioning(str(tmp_path)) == []


def test_gpu_results_are_committed_and_run_outputs_are_not():
    """benchmarks/gpu/results/ holds what lent GPUs measured (evidence); the workflow's own
    results/ and logs/ at the top stay ignored."""

    def ignored(path: str) -> bool:
        check = subprocess.run(
            ["git", "check-ignore", "-q", path], cwd=REPO, capture_output=True, check=False
        )
        assert check.returncode in (0, 1), check.stderr
        return check.returncode == 0

    kept = "benchmarks/gpu/results/2026-11-27-NVIDIA_H200"
    assert not ignored(f"{kept}/results/tft/H200-pip/ts-trace/fp32/offline.csv")
    assert not ignored(f"{kept}/logs/tft/H200-pip/ts-trace/fp32/offline.log")
    assert not ignored("benchmarks/gpu/results/x")
    # Snakemake's log of the kit's runs, kept beside them (keep.py); the workflow's own stays out
    assert not ignored(f"{kept}/.snakemake/log/2026-11-27T120000.000000.snakemake.log")
    assert ignored(".snakemake/log/x.snakemake.log")
    assert ignored("results/tft/cpu/onnx/fp32/offline.csv") and ignored("logs/x.log")


def test_a_triton_root_without_a_server_is_refused_naming_it(tmp_path, monkeypatch):
    from deploybench import tools
    from deploybench.errors import ToolNotFound

    monkeypatch.setenv("DEPLOYBENCH_TRITON_ROOT", str(tmp_path))
    monkeypatch.delenv("DEPLOYBENCH_TRITONSERVER", raising=False)
    with pytest.raises(
        ToolNotFound, match=f"DEPLOYBENCH_TRITON_ROOT={tmp_path}: no bin/tritonserver"
    ):
        tools.tritonserver_binary()


def kit_config() -> dict:
    return validated(deep_merge(base_config(), yaml.safe_load(KIT_CONFIG.read_text())))


KIT_ENTRIES = ("H100-pip", "H200-pip")


@pytest.mark.parametrize("gpu", KIT_ENTRIES)
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_kit_sizing_measures_a_subset_of_the_published_points(gpu, precision):
    run = dbc.resolve(kit_config(), "tft", gpu, "ts-trace", precision)
    # the published serving configuration, unchanged
    assert run.settings["triton"]["max_batch_size"] == 1024
    assert run.settings["triton"]["model_instances"] == 2
    assert [p["batch"] for p in dbplan.offline_points(run)] == [1, 16, 256, 1024]
    assert dbplan.online_points(run) == [{"batch": 16, "concurrency": c} for c in (8, 64, 256)]
    assert run.settings["perf"]["trials"] == 2


@pytest.mark.parametrize("gpu", KIT_ENTRIES)
def test_the_kit_runs_plan_without_images(gpu, tmp_path):
    write_config(tmp_path, kit_config())
    targets = [
        f"results/tft/{gpu}/ts-trace/{p}/{f}.csv"
        for p in ("fp32", "fp16")
        for f in ("accuracy", "offline", "online")
    ]
    result = run_snakemake(tmp_path, "-n", "--scheduler", "greedy", *targets, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_jobs(result) == {
        "prepare_checkpoint": 1,
        "export": 1,
        "convert": 1,  # fp16 from the checkpoint, on the GPU
        "repository": 2,
        "accuracy": 2,
        "offline": 2,
        "online": 2,
    }


def test_beside_published_shows_energy_per_inference_and_why_not(tmp_path):
    """beside_published.md: each measured point's energy per inference (mJ ± its interval),
    marked when the GPU throttled; a run without energy (not measured, or a CSV from before
    the energy columns) shows "—" and the line under the table says why."""
    beside = kit_script("beside_published")
    point = {"scenario": "offline", "batch": 1, "concurrency": 1, "throughput": 300.0,
             "throughput_ci95": 2.0, "p99_latency_ms": 4.0, "stable": True}  # fmt: skip
    fp32 = tmp_path / "results/tft/H100-pip/ts-trace/fp32"
    fp32.mkdir(parents=True)
    measured = {"energy_per_inference_j": 0.6123, "energy_per_inference_j_ci95": 0.0041,
                "throttled": False, "throttle_reasons": "", "energy_status": "nvml"}  # fmt: skip
    throttled = {"batch": 16, "energy_per_inference_j": 0.05, "stable": False,
                 "energy_per_inference_j_ci95": None, "throttled": True,
                 "throttle_reasons": "sw power cap", "energy_status": "nvml"}  # fmt: skip
    pd.DataFrame([point | measured, point | throttled]).to_csv(fp32 / "offline.csv", index=False)
    fp16 = tmp_path / "results/tft/H100-pip/ts-trace/fp16"
    fp16.mkdir(parents=True)
    pd.DataFrame([point]).to_csv(fp16 / "offline.csv", index=False)  # no energy columns

    text = beside.table(tmp_path, "H100-pip", "A100", ["fp32", "fp16"])
    assert "| offline | 1 | 1 | 205.0, 5.3 | 300.0 ± 2.0, 4.00; 612 ± 4.1 | " in text, text
    assert "300.0 ± 2.0, 4.00; — |" in text, text  # fp16: no energy columns
    assert "(unstable); 50 (throttled: sw power cap) |" in text, text
    assert "- H100-pip fp32: energy nvml" in text, text
    assert "- H100-pip fp16: energy no energy columns" in text, text


# The device's kit, last: it builds in the background while the tests above run.


def test_the_device_kit_fits_one_call_with_the_tree(device_kit):
    summary, out = device_kit
    assert summary["fits"]
    assert summary["call_bytes"] <= summary["call_limit_bytes"] == 64 * 1024 * 1024
    assert summary["kit_bytes"] == sum(p.stat().st_size for p in out.iterdir())
    # no entry named: run.sh picks H100-pip or H200-pip by the GPU nvidia-smi names
    assert summary["command"] == "bash benchmarks/gpu/kit/run.sh"


def test_the_device_kit_holds_the_server_perf_analyzer_and_packages(device_kit):
    _, out = device_kit
    manifest = json.loads((out / "kit.json").read_text())
    assert manifest["python"] == "3.12" and manifest["in_process"]
    with tarfile.open(out / "kit.tar.xz") as archive:
        members = {m.name.removeprefix("./"): m for m in archive.getmembers()}
    names = set(members)
    server = "pytriton/tritonserver/"
    assert f"{server}bin/tritonserver" in names
    assert f"{server}backends/python/libtriton_python.so" in names
    assert f"{server}python_backend_stubs/3.12/triton_python_backend_stub" in names
    # one Python's stub, and no pytriton package (it cannot be imported there)
    assert not any(n.startswith(f"{server}python_backend_stubs/3.11") for n in names)
    assert "pytriton/__init__.py" not in names
    assert members["perf-analyzer/bin/perf_analyzer"].mode & 0o111
    for link in ("libcudart.so.12", "libb64.so.0d"):
        member = members[f"perf-analyzer/lib/{link}"]
        assert member.issym()
        target = os.path.normpath(f"perf-analyzer/lib/{member.linkname}")
        assert target in names, (link, target)
    packages = {n.split("/")[1] for n in names if n.startswith("site/")}
    for package in ("snakemake", "jsonschema", "tritonclient", "gevent", "transformers", "monai"):
        assert package in packages, package
    assert any(
        n.startswith("site/rpds/") and n.endswith("cpython-312-x86_64-linux-gnu.so") for n in names
    )
    # the versions the CPU default runs
    from importlib.metadata import version

    assert f"snakemake=={version('snakemake')}" in manifest["packages"]
