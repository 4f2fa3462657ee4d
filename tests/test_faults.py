"""Faults: each leaves no orphan process, no partial output, no leaked shared memory, and says
what went wrong. Real tritonserver, perf_analyzer and Snakemake throughout.

The workflow-level faults break a copy of the shared smoke run and force its TFT ``offline``
job to run again; the process-level ones use a tiny python-backend model (tests/test_server.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pandas as pd
import psutil
import pytest
import yaml

from deploybench import perf
from deploybench import server as srv
from deploybench.perf_inputs import write_input_data
from deploybench.transport import Transport
from tests.conftest import (
    ONCE_A_POINT,
    leaked_shm,
    planned_jobs,
    processes_mentioning,
    run_snakemake,
    shm_regions,
    snakemake_command,
)
from tests.test_server import make_repository, wait_no_processes

RUN = "results/tft/cpu/onnx/fp32"
T = TypeVar("T")


def wait_for(find: Callable[[], T | None], timeout: float = 120.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = find()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {find.__doc__}")


def named(workdir: Path, name: str) -> Callable[[], psutil.Process | None]:
    """A finder of the process of ``workdir`` whose program is ``name`` (or, for a path
    fragment like the job's script, whose command line contains it)."""

    def find() -> psutil.Process | None:
        for proc in processes_mentioning(str(workdir)):
            try:
                cmdline = proc.cmdline()
                if Path(cmdline[0]).name == name or ("/" in name and name in " ".join(cmdline)):
                    return proc
            except (psutil.NoSuchProcess, IndexError):
                continue
        return None

    find.__doc__ = f"a {name!r} process of {workdir}"
    return find


class ForcedOfflineJob:
    """The smoke run's TFT ``offline`` job forced to run again in a copy of the workdir, with
    its temporary files in the copy so that leftovers can be seen."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.tmp = workdir / "tmp"
        self.tmp.mkdir()
        self.shm_before = shm_regions()
        cmd, env = snakemake_command(
            workdir, f"{RUN}/offline.csv", "--forcerun", "offline", env={"TMPDIR": str(self.tmp)}
        )
        # its own process group, as a command run from a terminal has
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )

    def measuring(self) -> psutil.Process:
        """Wait until perf_analyzer runs (its input data is in the job's TMPDIR)."""
        return wait_for(named(self.workdir, "perf_analyzer"), timeout=180)

    def finish(self) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=180)
        return self.proc.returncode, out

    def assert_nothing_left(self) -> None:
        assert wait_no_processes(str(self.workdir)) == []
        assert not (self.workdir / RUN / "offline.csv").exists()
        assert not (self.workdir / RUN / "offline.trials.csv").exists()
        assert not list((self.workdir / RUN).glob(".offline*")), "partial output left"
        # the job's and perf_analyzer's temporary folders (a library's session file may stay)
        assert list(self.tmp.glob("deploybench-*")) == [], "temporary files left"
        assert leaked_shm(self.shm_before) == set(), "shared memory left"
        # Snakemake knows the job did not finish: the next run measures it again.
        assert planned_jobs(run_snakemake(self.workdir, "-n", f"{RUN}/offline.csv")) == {
            "offline": 1
        }


pytestmark = pytest.mark.e2e


def test_server_dying_mid_measurement_fails_the_job_cleanly(copy_of):
    job = ForcedOfflineJob(copy_of)
    job.measuring()
    wait_for(named(copy_of, "tritonserver")).kill()
    code, out = job.finish()
    assert code != 0
    assert "tritonserver died (exit code -9)" in out
    job.assert_nothing_left()


@pytest.mark.parametrize("target", ["job", "job and its children"])
def test_sigterm_as_slurm_sends_it_stops_everything(copy_of, target):
    """SLURM's time limit or preemption sends SIGTERM to the job's processes."""
    job = ForcedOfflineJob(copy_of)
    job.measuring()
    script = wait_for(named(copy_of, ".snakemake/scripts/"))
    victims = [script] + (script.children(recursive=True) if target != "job" else [])
    for proc in victims:  # one may have ended by itself since it was listed (a short-lived tool)
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    code, out = job.finish()
    assert code != 0
    assert "Error in rule offline" in out
    job.assert_nothing_left()


def test_a_job_stopped_after_its_first_point_measures_only_the_rest_when_run_again(copy_of):
    """SLURM's time limit or preemption (SIGTERM to the job) once the first point's trials are
    all done: the job keeps its finished trials beside its outputs (deploybench.partial), not
    in them; run again, it measures only the trials missing, and its CSVs hold every point
    once, the first point's trials from the first attempt, as the provenance says."""
    from deploybench.partial import finished_points, partial_path, read

    run = copy_of / RUN
    kept = partial_path(run / "offline.csv")
    job = ForcedOfflineJob(copy_of)

    def first_point_done() -> list | None:
        """the first point's trials all kept"""
        return finished_points(read(kept)) or None

    first = wait_for(first_point_done, timeout=600)[0]
    wait_for(named(copy_of, ".snakemake/scripts/")).send_signal(signal.SIGTERM)
    code, out = job.finish()
    assert code != 0 and "Error in rule offline" in out
    job.assert_nothing_left()  # no CSV, no process, no shared memory: only the kept trials
    before = read(kept)
    by_first = {(int(r["batch"]), int(r["concurrency"]), int(r["trial"])) for r in before.trials}
    assert {(r["batch"], r["concurrency"], r["trial"]) for r in first} <= by_first
    assert {r["attempt"] for r in before.trials} == {1}

    result = run_snakemake(copy_of, f"{RUN}/offline.csv", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not kept.exists()  # the CSVs are written: nothing left to resume
    log = (copy_of / "logs" / RUN.removeprefix("results/") / "offline.log").read_text()
    assert f"attempt 2: {len(by_first)} trials of" in log, log[-3000:]
    trials = pd.read_csv(run / "offline.trials.csv")
    points = pd.read_csv(run / "offline.csv")
    keys = ["batch", "concurrency"]
    assert not points.duplicated(keys).any()
    assert not trials.duplicated([*keys, "trial"]).any()
    per_point = trials.groupby(keys).size()
    assert len(per_point) == len(points) and (per_point == points.set_index(keys)["trials"]).all()
    attempt = {
        (int(r.batch), int(r.concurrency), int(r.trial)): int(r.attempt)
        for r in trials.itertuples()
    }
    assert {k for k, a in attempt.items() if a == 1} == by_first
    assert {k for k, a in attempt.items() if a == 2} == set(attempt) - by_first != set()
    # the kept trials' requests count in the point's pooled tail
    assert points["p99_pooled_ms"].notna().all()
    provenance = json.loads((run / "offline.provenance.json").read_text())
    attempts = provenance["config"]["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert {tuple(t) for t in attempts[0]["trials"]} == by_first
    assert {tuple(t) for t in attempts[1]["trials"]} == set(attempt) - by_first
    assert all(a["tritonserver"] and a["host"]["hostname"] for a in attempts)


def test_ctrl_c_stops_snakemake_and_its_jobs(copy_of):
    """Ctrl-C in the terminal: SIGINT to Snakemake's process group while a measurement runs."""
    job = ForcedOfflineJob(copy_of)
    job.measuring()
    os.killpg(job.proc.pid, signal.SIGINT)
    code, _ = job.finish()
    assert code != 0
    job.assert_nothing_left()


def test_killed_snakemake_stops_its_job_and_a_restart_measures_alone(copy_of):
    """SIGKILL to Snakemake alone (not its group, as the OOM killer or ``kill -9 <pid>`` do)
    mid-measurement: its job stops as on SIGTERM instead of measuring on (and writing the CSV)
    beside the next Snakemake, which then measures the run by itself."""
    job = ForcedOfflineJob(copy_of)
    job.measuring()
    job.proc.kill()
    job.finish()  # reaps Snakemake once the job, which shares its output pipe, has ended too
    assert wait_no_processes(str(copy_of)) == []
    # it stopped, not measured on to the end: no offline.csv (assert_nothing_left below)
    log = (copy_of / "logs" / RUN.removeprefix("results/") / "offline.log").read_text()
    assert f"Snakemake (pid {job.proc.pid}) that started this job is gone" in log
    job.assert_nothing_left()
    # What a user does next: unlock (Snakemake leaves its lock when killed) and run again.
    assert run_snakemake(copy_of, "--unlock").returncode == 0
    once = copy_of / "once.yaml"  # the restart's statistics do not matter
    once.write_text(yaml.safe_dump({"sizings": {"cpu": {"tft": {"perf": ONCE_A_POINT}}}}))
    result = run_snakemake(copy_of, f"{RUN}/offline.csv", "--configfile", str(once))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (copy_of / RUN / "offline.csv").exists()


def test_a_second_stop_signal_does_not_cut_the_cleanup_short(tmp_path):
    """SLURM signals every process of a job, and a job whose Snakemake died signals itself: the
    cleanup the first SIGTERM (or Ctrl-C) started runs to its end all the same."""
    code = textwrap.dedent(
        """
        import os, signal, sys, time
        from pathlib import Path
        from deploybench.server import graceful_signals

        first, marker = signal.Signals[sys.argv[1]], Path(sys.argv[2])
        try:
            with graceful_signals():
                os.kill(os.getpid(), first)
                time.sleep(10)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # during the cleanup, and after the block
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            marker.write_text("cleaned")
        """
    )
    for first, code_expected in (("SIGTERM", 143), ("SIGINT", -signal.SIGINT)):
        marker = tmp_path / first
        result = subprocess.run(
            [sys.executable, "-c", code, first, str(marker)],
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == code_expected, result.stderr
        assert marker.read_text() == "cleaned"


def test_truncated_export_is_caught_before_serving(copy_of):
    artifact = copy_of / "results/tft/export/onnx/fp32/model.onnx"
    data = artifact.read_bytes()
    artifact.write_bytes(data[: len(data) // 2])
    result = run_snakemake(copy_of, f"{RUN}/accuracy.csv")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "results/tft/export/onnx/fp32/model.onnx changed after the job that wrote it" in out
    assert "snakemake --forcerun results/tft/export/onnx/fp32/model.onnx" in out
    assert not (copy_of / RUN / "repository").exists()
    assert not list((copy_of / RUN).glob(".repository*")), "staging folder left"
    assert processes_mentioning(str(copy_of)) == []
    # The advice works: forcing the artifact plans its export and everything after it.
    dry = run_snakemake(
        copy_of, "-n", f"{RUN}/accuracy.csv", "--forcerun", str(artifact.relative_to(copy_of))
    )
    assert planned_jobs(dry) == {"export": 1, "repository": 1, "accuracy": 1}


# Process level: the ident model of tests/test_server.py, real server and perf_analyzer.


def input_data(tmp_path: Path) -> Path:
    path = tmp_path / "data.json"
    write_input_data({"x": np.ones((1, 4), np.float32)}, path)
    return path


def measure(
    server: srv.TritonServer, data: Path, **settings: float
) -> dict[str, float | int | bool]:
    measurement = perf.Measurement(
        "ident",
        server.grpc_url,
        Transport("grpc", "system"),
        data,
        perf.MeasureSettings(
            **{"request_count": 50, "warmup_factor": 0, "max_retries": 0, **settings}
        ),
        check_server=server.check_alive,
    )
    return perf.measure_point(measurement, perf.Point(1, 1))


def test_hung_perf_analyzer_is_killed_and_its_shared_memory_removed(tmp_path):
    """The model never answers: perf_analyzer waits forever, so the timeout must end it."""
    repo = make_repository(tmp_path, "hang")
    data = input_data(tmp_path)
    before = shm_regions()
    started = time.monotonic()
    with (
        pytest.raises(perf.PerfError, match="hung past its timeout of 3 s"),
        srv.TritonServer(repo, tmp_path / "server.log", shutdown_timeout_s=5) as server,
        perf.shared_memory_lock(["x"], ["y"]),
    ):
        measure(server, data, timeout_s=3)
    assert time.monotonic() - started < 60
    assert wait_no_processes(str(tmp_path)) == []  # perf_analyzer (its data is here), server
    assert leaked_shm(before) == set()


def test_killed_server_leaves_no_shared_memory(tmp_path):
    repo = make_repository(tmp_path)
    server = srv.TritonServer(repo, tmp_path / "server.log").start()
    regions = server.shm_regions()
    assert regions and all(r.exists() for r in regions)  # the python backend's, named by us
    server.process.kill()  # type: ignore[union-attr]
    server.process.wait()  # type: ignore[union-attr]
    assert all(r.exists() for r in regions)  # a killed server cannot unlink its own
    server.stop()
    assert not any(r.exists() for r in regions)
    assert wait_no_processes(str(repo)) == []


def test_two_measurements_at_once_neither_shares_ports_nor_shared_memory(tmp_path, caplog):
    """Two perf jobs of models with the same tensor names start together on one machine: each
    gets its own server and ports; perf_analyzer's regions (named after the tensors) are taken
    by one at a time."""
    results: dict[int, object] = {}
    ports: dict[int, int] = {}
    # both servers up before either measures (one may start seconds later on a loaded machine)
    both_up = threading.Barrier(2, timeout=180)

    def one(i: int) -> None:
        root = tmp_path / str(i)
        root.mkdir()
        try:
            with srv.TritonServer(make_repository(root, "busy"), root / "server.log") as server:
                ports[i] = server.grpc_port
                both_up.wait()
                with perf.shared_memory_lock(["x"], ["y"]):
                    results[i] = measure(server, input_data(root))
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            results[i] = err
            both_up.abort()  # the other need not wait for this one

    before = shm_regions()
    with caplog.at_level(logging.WARNING, logger="deploybench.perf"):
        threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
    assert all(isinstance(r, dict) and r["throughput"] > 0 for r in results.values()), results
    assert len(results) == 2 and ports[0] != ports[1]
    assert "waiting for it to finish" in caplog.text
    assert wait_no_processes(str(tmp_path)) == []
    assert leaked_shm(before) == set()


LOCK_HOLDER = """
import time
from deploybench import perf
with perf.shared_memory_lock(["held"], ["out"]):
    print("LOCKED", flush=True)
    time.sleep(600)
"""


def test_a_lock_holder_killed_outright_releases_the_lock(tmp_path):
    """flock: a SIGKILLed measurement cannot leave the shared-memory names locked."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            LOCK_HOLDER,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "LOCKED"
    child.kill()
    child.wait()
    done = threading.Event()

    def take() -> None:
        with perf.shared_memory_lock(["held"], ["out"]):
            done.set()

    threading.Thread(target=take, daemon=True).start()
    assert done.wait(timeout=10)
