"""The real tritonserver (pytriton's binary, python backend) under our process management."""

import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from deploybench import server as srv
from tests.conftest import processes_mentioning

MODEL_PY = textwrap.dedent(
    """
    import json, time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            params = json.loads(args["model_config"]).get("parameters", {})
            behaviour = params.get("behaviour", {}).get("string_value", "")
            if behaviour == "slow":
                time.sleep(60)
            if behaviour == "broken":
                raise RuntimeError("this model is broken on purpose")
            self.delay = {"busy": 0.01, "hang": 3600}.get(behaviour, 0)

        def execute(self, requests):
            time.sleep(self.delay)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]) for r in requests]
    """
)


def make_repository(root: Path, behaviour: str = "") -> Path:
    model = root / "repo" / "ident"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(MODEL_PY)
    (model / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        f'parameters {{ key: "behaviour" value: {{ string_value: "{behaviour}" }} }}\n'
    )
    return root / "repo"


def wait_no_processes(text: str, timeout: float = 20.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = processes_mentioning(text)
        if not left:
            return []
        time.sleep(0.25)
    return processes_mentioning(text)


def test_server_starts_serves_and_stops(tmp_path):
    import numpy as np

    from deploybench.triton_client import infer_triton

    repo = make_repository(tmp_path)
    with srv.TritonServer(repo, tmp_path / "server.log") as server:
        assert server.is_running()
        assert server.metadata()["name"] == "triton"
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        out = infer_triton(server.http_url, "ident", {"x": x}, ["y"])
        np.testing.assert_array_equal(out["y"], x)
    assert not server.is_running()
    assert wait_no_processes(str(repo)) == []
    assert "--model-repository" in (tmp_path / "server.log").read_text()


def test_broken_model_fails_start_with_its_log(tmp_path):
    repo = make_repository(tmp_path, "broken")
    with pytest.raises(srv.ServerError, match="exited with code") as err:
        srv.TritonServer(repo, tmp_path / "server.log", startup_timeout_s=60).start()
    assert "broken on purpose" in str(err.value)
    assert wait_no_processes(str(repo)) == []


def test_server_never_ready_times_out_and_is_stopped(tmp_path):
    repo = make_repository(tmp_path, "slow")
    started = time.monotonic()
    with pytest.raises(srv.ServerError, match="not ready within 4 s"):
        srv.TritonServer(
            repo, tmp_path / "server.log", startup_timeout_s=4, shutdown_timeout_s=3
        ).start()
    assert time.monotonic() - started < 30
    assert wait_no_processes(str(repo)) == []


def test_taken_ports_are_retried(tmp_path, monkeypatch):
    """Another process holds the port we probed: the server restarts on fresh ports."""
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    real_free_ports = srv.free_ports
    calls = []

    def first_call_taken(count):
        calls.append(count)
        ports = real_free_ports(count)
        return [taken, *ports[1:]] if len(calls) == 1 else ports

    monkeypatch.setattr(srv, "free_ports", first_call_taken)
    repo = make_repository(tmp_path)
    try:
        with srv.TritonServer(repo, tmp_path / "server.log") as server:
            assert server.http_port != taken
    finally:
        blocker.close()
    assert len(calls) == 2
    assert wait_no_processes(str(repo)) == []


CHILD = """
import sys, time
from pathlib import Path
from deploybench.server import TritonServer, graceful_signals
with graceful_signals(), TritonServer(Path(sys.argv[1]), Path(sys.argv[2])):
    print("READY", flush=True)
    time.sleep(600)
"""


def start_child(tmp_path, repo):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(repo), str(tmp_path / "s.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "READY"
    assert processes_mentioning(str(repo))  # server and its stub are up
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signalled_job_stops_its_server(tmp_path, sig):
    repo = make_repository(tmp_path)
    proc = start_child(tmp_path, repo)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) != 0
    assert wait_no_processes(str(repo)) == []


def test_killed_job_takes_its_server_down(tmp_path):
    """SIGKILL cannot be handled: the kernel's parent-death signal stops the server."""
    repo = make_repository(tmp_path)
    proc = start_child(tmp_path, repo)
    proc.kill()
    proc.wait(timeout=10)
    assert wait_no_processes(str(repo), timeout=40) == []


def test_the_server_runs_with_the_runs_environment(tmp_path, monkeypatch):
    """A run's `server.environment` (TF32 in libtorch) reaches the tritonserver process."""
    seen = tmp_path / "seen"
    fake = tmp_path / "tritonserver"
    fake.write_text(f'#!/bin/sh\necho "$TORCH_ALLOW_TF32_CUBLAS_OVERRIDE" > {seen}\nexit 3\n')
    fake.chmod(0o755)
    monkeypatch.setenv("DEPLOYBENCH_TRITONSERVER", str(fake))
    server = srv.TritonServer(
        tmp_path / "repo", tmp_path / "server.log", startup_timeout_s=5, start_attempts=1,
        environment={"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"},
    )  # fmt: skip
    (tmp_path / "repo").mkdir()
    with pytest.raises(srv.ServerError):
        server.start()
    assert seen.read_text() == "1\n"


def test_the_provenance_holds_the_servers_environment_as_its_process_has_it(tmp_path, monkeypatch):
    """A result's provenance records the server process's environment (its /proc/<pid>/environ
    while it runs, else the Popen env it was started with), not the measuring job's: the run's
    `server.environment` (here what a plan with tf32_matmul gives: serving_plan.TF32_MATMUL_ENV,
    tests/test_plan.py), the variables that decide how it computes, no other, and the TF32 state
    they make. (A job-side test: no planning here, tests/test_python310.py runs it on 3.10.)"""
    from deploybench import provenance
    from deploybench.planning.serving_plan import TF32_MATMUL_ENV

    planned = dict(TF32_MATMUL_ENV)  # TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1
    fake = tmp_path / "tritonserver"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")  # runs until stopped, never ready
    fake.chmod(0o755)
    monkeypatch.setenv("DEPLOYBENCH_TRITONSERVER", str(fake))
    for name, value in {
        "CUDA_VISIBLE_DEVICES": "3",
        "OMP_NUM_THREADS": "2",
        "TF_ENABLE_ONEDNN_OPTS": "0",
        "TORCH_HUB_TOKEN": "s3cret",  # a credential's name under a recorded prefix: left out
        "DEPLOYBENCH_TEST_PASSWORD": "s3cret",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    server = srv.TritonServer(tmp_path / "repo", tmp_path / "server.log", environment=planned)
    process = server._spawn(server.command())
    try:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # the job's, after: not the server's
        running = provenance.server_environment(server)
    finally:
        server.stop()
    assert running["source"] == f"/proc/{process.pid}/environ"
    recorded = running["variables"]
    assert recorded["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "1"
    assert running["tf32"].startswith("cuBLAS TF32 allowed by TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1")
    assert recorded["CUDA_VISIBLE_DEVICES"] == "3" and recorded["OMP_NUM_THREADS"] == "2"
    assert recorded["TF_ENABLE_ONEDNN_OPTS"] == "0"
    # as the server got it (the venv's libpython first), not as this process has it
    assert recorded["LD_LIBRARY_PATH"] == server.started_environment["LD_LIBRARY_PATH"]
    assert "s3cret" not in str(running) and "HOME" not in recorded and "PATH" not in recorded
    # stopped: the Popen env it was started with, the same variables
    stopped = provenance.server_environment(server)
    assert stopped["source"] == "the environment it was started with (Popen env)"
    assert stopped["variables"] == recorded and stopped["tf32"] == running["tf32"]


def test_the_tf32_state_of_a_servers_environment():
    from deploybench.provenance import tf32_state

    assert tf32_state({}).startswith("default")
    # PyTorch's check_env: only "1" allows it
    assert tf32_state({"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "0"}).startswith("default")
    assert tf32_state({"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "true"}).startswith("default")
    off = tf32_state({"NVIDIA_TF32_OVERRIDE": "0", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"})
    assert off == (
        "TF32 off in NVIDIA's libraries (cuBLAS, cuDNN) by NVIDIA_TF32_OVERRIDE=0, over "
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1"
    )


def test_a_jobs_server_record_holds_its_environment(tmp_path):
    """What the accuracy and perf jobs write as `tritonserver` in their provenance (and each
    attempt's): the real server's metadata and its process's environment."""
    from deploybench.jobs.measure import ready_server, served_by
    from deploybench.planning.serving_plan import TF32_MATMUL_ENV

    repo = make_repository(tmp_path)
    with ready_server(
        str(repo), str(tmp_path / "server.log"), {"environment": TF32_MATMUL_ENV}
    ) as s:
        record = served_by(s)
        pid = s.process.pid
    assert record["name"] == "triton" and record["version"]
    environment = record["environment"]
    assert environment["source"] == f"/proc/{pid}/environ"
    assert environment["variables"]["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "1"
    assert environment["tf32"].startswith("cuBLAS TF32 allowed")


# A job's server (deploybench.jobs.measure.ready_server) signalled while it starts: in the readiness wait
# (its model loads slowly) and as the engine lock is released once it is ready (the lock is
# wrapped to pause there). The job reports where it is on stdout, then waits for the signal.
JOB_IN_WINDOW = """
import contextlib, sys, time
from pathlib import Path
from deploybench import server
from deploybench import model_repository
from deploybench.jobs.measure import ready_server
from deploybench.server import graceful_signals

repo, server_log, window = sys.argv[1:4]
if window == "readiness":
    wait_ready = server.TritonServer._wait_ready

    def announced_wait(self):
        print("IN WINDOW", flush=True)
        wait_ready(self)

    server.TritonServer._wait_ready = announced_wait
else:
    lock = model_repository.engine_build_lock

    @contextlib.contextmanager
    def pausing_lock(path):
        with lock(path) as caches:
            yield caches
        print("IN WINDOW", flush=True)
        time.sleep(60)

    model_repository.engine_build_lock = pausing_lock
with graceful_signals(), ready_server(repo, server_log, {"shutdown_timeout_s": 5}):
    print("SERVING", flush=True)
"""


@pytest.mark.parametrize("window", ["readiness", "lock released"])
def test_sigterm_while_the_jobs_server_starts_stops_it_whole(tmp_path, window):
    repo = make_repository(tmp_path, "slow" if window == "readiness" else "")
    server_log = tmp_path / "server.log"
    job = subprocess.Popen(
        [sys.executable, "-c", JOB_IN_WINDOW, str(repo), str(server_log), window],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert job.stdout.readline().strip() == "IN WINDOW"
        # the server and its model's stub are up, with the python backend's regions
        shm_prefix = re.search(r"shm-region-prefix-name=(\S+)", server_log.read_text())[1]
        deadline = time.monotonic() + 20
        while len(processes_mentioning(str(repo))) < 2 or not regions(shm_prefix):
            assert time.monotonic() < deadline, "no server, stub and regions within 20 s"
            time.sleep(0.1)
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=30) == 128 + signal.SIGTERM, job.stderr.read()  # Terminated
        # Gone by the time the job is: its own stop ran (the kernel's parent-death signal
        # would only begin the server's shutdown as the job exits).
        assert processes_mentioning(str(repo)) == []
        assert regions(shm_prefix) == []
    finally:
        job.kill()
        wait_no_processes(str(repo))


def regions(shm_prefix: str) -> list[Path]:
    return sorted(srv.SHM_DIR.glob(f"{shm_prefix}*"))


def test_a_stop_signal_held_while_a_child_starts_is_raised_once_it_is_assigned():
    """TritonServer's Popen runs in held_signals: the child is assigned before Terminated."""
    code = textwrap.dedent(
        """
        import os, signal
        from deploybench.server import graceful_signals, held_signals
        child = None
        try:
            with graceful_signals(), held_signals():
                os.kill(os.getpid(), signal.SIGTERM)
                child = "assigned"
        finally:
            print(child)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert (result.returncode, result.stdout) == (128 + signal.SIGTERM, "assigned\n")
