"""tests.load, the suite's way to run under load (docs/tests.md): its burners burn while the
command runs, the command's exit status is its own, and no burner outlives the wrapper, even
one killed with SIGKILL."""

import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.conftest import REPO
from tests.load import BURN

# The command beside the burners: how many of its parent's (the wrapper's) children are
# burners and alive; it exits 3.
COUNT = textwrap.dedent(
    f"""
    import os, sys, psutil
    wrapper = psutil.Process(os.getppid())
    burning = [p for p in wrapper.children() if p.cmdline()[-1:] == [{BURN!r}]]
    print("burning", sum(p.status() != psutil.STATUS_ZOMBIE for p in burning))
    sys.exit(3)
    """
)


def burner_pids(output: str) -> list[int]:
    found = re.search(r"load: \d+ CPU-burning process\(es\) \(pids ([\d, ]+)\)", output)
    assert found, output
    return [int(pid) for pid in found.group(1).split(", ")]


def gone(pids: list[int], within_s: float = 10.0) -> bool:
    """Whether every one of ``pids`` has exited (a zombie awaiting its reaper has) in time."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(running(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_burners_burn_beside_the_command_and_stop_with_it():
    ran = subprocess.run(
        [sys.executable, "-m", "tests.load", "--burners", "2", "--", sys.executable, "-c", COUNT],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert "burning 2" in ran.stdout, ran.stdout
    assert gone(burner_pids(ran.stdout))


def test_no_burner_outlives_a_killed_wrapper():
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "tests.load", "--", "sleep", "60"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert wrapper.stdout is not None
    pids = burner_pids(wrapper.stdout.readline())
    wrapper.send_signal(signal.SIGKILL)
    wrapper.wait(timeout=10)
    assert gone(pids)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([], "no command"),
        (["--burners", "-1", "--", "true"], "--burners must be 0 or more, not -1"),
    ],
)
def test_a_bad_call_says_what_is_wrong(argv, said):
    ran = subprocess.run(
        [sys.executable, "-m", "tests.load", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
        check=False,
    )
    assert ran.returncode == 2 and said in ran.stderr, ran.stderr
