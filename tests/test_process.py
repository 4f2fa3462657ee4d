"""deploybench.process in real processes: children die with the job (die_with_parent), and the
job stops when the Snakemake that started it dies (stop_with_snakemake)."""

import shlex
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from deploybench.process import process_id, runs_snakemake
from tests.conftest import processes_mentioning

# A job that starts a child with the hook, after making every later libc lookup fail: if the
# child (between fork and exec) looked anything up, Popen would raise here instead.
JOB = textwrap.dedent(
    """
    import ctypes, signal, subprocess, sys, time
    from deploybench.process import die_with_parent

    preexec = die_with_parent(signal.SIGTERM)

    def refuse(*args, **kwargs):
        raise AssertionError("ctypes.CDLL called after the hook was made")

    ctypes.CDLL = refuse
    child = subprocess.Popen(["sh", "-c", sys.argv[1], "sh", sys.argv[2]], preexec_fn=preexec)
    # one write with its newline: under PYTHONUNBUFFERED print() writes the two apart, and
    # the child's "ready" (on the same pipe) can land between them
    sys.stdout.write(f"{child.pid}\\n")
    sys.stdout.flush()
    time.sleep(60)
    """
)
# The child says which signal ended it, then exits (sh runs a trap between two sleeps).
CHILD = "trap 'echo TERM > \"$1\"; exit 0' TERM; echo ready; while :; do sleep 0.05; done"


def test_child_gets_the_death_signal_when_its_job_is_killed(tmp_path):
    marker = tmp_path / "signal"
    job = subprocess.Popen(
        [sys.executable, "-c", JOB, CHILD, str(marker)], stdout=subprocess.PIPE, text=True
    )
    try:
        lines = {job.stdout.readline().strip(), job.stdout.readline().strip()}
        assert "ready" in lines, lines
        (pid,) = (int(line) for line in lines if line != "ready")
        child = psutil.Process(pid)
    finally:
        job.kill()  # SIGKILL: only the kernel can tell the child
        job.wait()
    _, alive = psutil.wait_procs([child], timeout=5)
    for left in alive:  # a failing test leaves no process behind
        left.kill()
    assert not alive
    assert marker.read_text().strip() == "TERM"


def test_child_exits_before_exec_when_its_parent_is_already_gone():
    """The hook was made in one process and the child's parent is another: what the child sees
    when the job died before prctl took effect (it was reparented), so it must not run on."""
    code = textwrap.dedent(
        """
        import os, signal, subprocess
        from deploybench.process import die_with_parent

        preexec = die_with_parent(signal.SIGTERM)
        if os.fork() == 0:
            child = subprocess.Popen(["sleep", "60"], preexec_fn=preexec)
            try:
                print(child.wait(timeout=5), flush=True)
            except subprocess.TimeoutExpired:
                child.kill()
                print("sleep ran", flush=True)
            os._exit(0)
        os.wait()
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.strip() == "143"  # 128 + SIGTERM, before exec: sleep never ran


# --- a job stops when its Snakemake dies: deploybench.process.stop_with_snakemake ------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/venv/bin/snakemake", "--profile", "p"], True),
        (["/venv/bin/python3.11", "/venv/bin/snakemake", "all"], True),  # its #! as run
        (["/usr/bin/python3", "-m", "snakemake", "--mode", "remote"], True),  # SLURM job step
        (["python", "-u", "-X", "dev", "-m", "snakemake"], True),
        (["python3", "-msnakemake"], True),
        (["/venv/bin/python3", "/w/.snakemake/scripts/tmpab12.perf.py"], False),  # the job
        (["/bin/bash", "-c", "set -euo pipefail; /venv/bin/snakemake"], False),
        (["python3", "-c", "import snakemake", "snakemake"], False),
        (["python3", "-m", "snakemake_executor_plugin_slurm"], False),
        (["/opt/snakemake-wrapper.sh", "snakemake"], False),
        ([], False),
    ],
)
def test_snakemake_is_recognised_by_the_program_it_runs(argv, expected):
    assert runs_snakemake(argv) is expected


# A stand-in Snakemake (a file named `snakemake`, run by python as its entry point is) starts
# the job as argv[1:] says and waits.
SNAKEMAKE = "import subprocess, sys, time\nsubprocess.Popen(sys.argv[1:])\ntime.sleep(120)\n"
# The job: watches its Snakemake, then waits inside graceful_signals as the perf job does, and
# records how it ended.
WATCHED_JOB = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from deploybench.process import stop_with_snakemake
    from deploybench.server import graceful_signals

    watched = stop_with_snakemake(grace_s=30)
    try:
        with graceful_signals():
            print(watched.pid if watched else None, flush=True)
            time.sleep(60)
    except BaseException as err:
        Path(sys.argv[1]).write_text(f"{type(err).__name__} {getattr(err, 'code', '')}")
        raise
    """
)


def gone(pid: int) -> bool:
    """The process has exited (a zombie has too: PID 1 here reaps no orphans)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("through", ["direct", "shell"])
def test_job_stops_as_on_sigterm_when_its_snakemake_is_killed(tmp_path, through):
    """SIGKILL to the stand-in Snakemake alone: its job (its direct child, or under a shell
    that stays, as under ``bash -c`` or apptainer) unwinds as on SIGTERM and exits."""
    entry = tmp_path / "bin" / "snakemake"
    entry.parent.mkdir()
    entry.write_text(SNAKEMAKE)
    marker = tmp_path / "ended"
    job = [sys.executable, "-c", WATCHED_JOB, str(marker)]
    if through == "shell":  # a second command keeps bash from exec'ing the job
        job = ["bash", "-c", f"{shlex.join(job)}; exit $?"]
    snakemake = subprocess.Popen([sys.executable, str(entry), *job], stdout=subprocess.PIPE)
    try:
        assert snakemake.stdout is not None
        assert snakemake.stdout.readline().strip() == str(snakemake.pid).encode()
        descendants = psutil.Process(snakemake.pid).children(recursive=True)
        (script,) = [p for p in descendants if p.cmdline()[:2] == [sys.executable, "-c"]]
        snakemake.kill()  # it stays a zombie until waited for below: that counts as dead
        assert wait_until(lambda: gone(script.pid), timeout=10)
    finally:
        snakemake.kill()
        snakemake.wait()
        # this test's processes only: the session's others (the background smoke run) go on
        for left in processes_mentioning(str(tmp_path)):
            left.kill()
    assert marker.read_text() == "Terminated 143"


# A job that watches the process named by argv[1:3] (pid, start); argv[3] picks the variant.
WATCHING = textwrap.dedent(
    """
    import errno, os, signal, sys, time
    from deploybench.process import ProcessId, stop_when_gone

    if sys.argv[3] == "no pidfd":  # as on Linux < 5.3
        def refuse(pid):
            raise OSError(errno.ENOSYS, "pidfd_open")
        os.pidfd_open = refuse
    if sys.argv[3] == "ignores SIGTERM":
        signal.signal(signal.SIGTERM, lambda *_: None)
    stop_when_gone(ProcessId(int(sys.argv[1]), int(sys.argv[2])), "parent", grace_s=1, poll_s=0.1)
    print("watching", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize(
    ("variant", "ends_by"),
    [("pidfd", signal.SIGTERM), ("no pidfd", signal.SIGTERM), ("ignores SIGTERM", signal.SIGKILL)],
)
def test_watcher_stops_the_job_when_the_watched_process_dies(variant, ends_by):
    parent = subprocess.Popen(["sleep", "60"])
    try:
        watched = process_id(parent.pid)
        assert watched is not None
        job = subprocess.Popen(
            [sys.executable, "-c", WATCHING, str(watched.pid), str(watched.start), variant],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert job.stdout is not None and job.stdout.readline().strip() == "watching"
        time.sleep(0.3)
        assert job.poll() is None  # the watched process lives: the job runs on
        started = time.monotonic()
        parent.kill()  # not reaped yet: a zombie is dead
        assert job.wait(timeout=10) == -ends_by
        assert time.monotonic() - started < (5 if ends_by == signal.SIGTERM else 8)
    finally:
        parent.kill()
        parent.wait()
