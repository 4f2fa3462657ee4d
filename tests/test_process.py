"""Children that die with the job: deploybench.process.die_with_parent, in real processes."""

import subprocess
import sys
import textwrap

import psutil

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
    print(child.pid, flush=True)
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
