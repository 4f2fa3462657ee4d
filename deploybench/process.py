"""Processes of a job: its children die with it, and it stops when its Snakemake dies.

A job killed outright (SIGKILL, the OOM killer) runs no cleanup, so the kernel must stop its
children: ``prctl(PR_SET_PDEATHSIG)``, set in the child between fork and exec. Only
async-signal-safe work may run there (the forking process may have threads — TensorFlow's,
pytest's — holding locks the child inherits), so libc and ``prctl`` are looked up here, in the
parent, and the child only makes the call.

The other way round, nothing tells a job that the Snakemake which started it was killed
outright: the job, its tritonserver and perf_analyzer would go on measuring (and write their
CSV) while a restarted Snakemake starts the same measurement beside them. Snakemake starts a
script job from a worker thread, through ``bash -c`` (exec'd into the job's python, or not),
perhaps through ``apptainer exec``; under SLURM the Snakemake is the job step's own
(``srun ... python -m snakemake``). So :func:`stop_with_snakemake` looks up the job's nearest
ancestor that runs Snakemake, whichever it is, and watches it from a daemon thread (a pidfd, or
``/proc`` where there is none); ``PR_SET_PDEATHSIG`` would not do: it fires when the parent
*thread* ends, and the parent may be a shell. When that Snakemake dies, the job sends itself
SIGTERM, the stop SLURM and Snakemake send, so it unwinds the same way (servers stopped, shared
memory removed; outputs are written whole or not at all), and SIGKILL if it is still there
after a grace period.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import select
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache
def _prctl() -> Callable[..., int]:
    """libc's ``prctl``, with its C signature declared so that a call converts no more than
    ints (resolved once: ``dlopen``/``dlsym`` take the loader's lock, unsafe after fork)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl  # type: ignore[no-any-return]


def die_with_parent(sig: signal.Signals) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess``: the kernel sends the child ``sig`` when the calling
    process dies. Make it in the process that starts the child, just before starting it. (The
    kernel sends it when the *thread* that started the child ends: start it from one that lives
    as long as the child should.)

    The child exits at once (status 128 + ``sig``) if that process died before the call took
    effect: then the death signal was never sent, and the child's parent is no longer it.
    """
    prctl = _prctl()
    parent = os.getpid()
    signum = int(sig)

    def preexec() -> None:  # between fork and exec: syscalls only
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(128 + signum)

    return preexec


# --- the job stops when its Snakemake dies --------------------------------------------------

# How long a job has, after the SIGTERM, to stop its server and remove what it made before it
# is killed: above the server's default shutdown timeout (30 s) and the sweep after it.
STOP_GRACE_S = 60.0

_PYTHON = re.compile(r"python[0-9.]*")
_SNAKEMAKE_MODULES = ("snakemake", "snakemake.__main__")
_PYTHON_VALUED = ("-W", "-X")  # python options whose value is the next argument


class ProcessId(NamedTuple):
    """One process: its pid, and its start time (clock ticks after boot) since pids are reused."""

    pid: int
    start: int


class _Stat(NamedTuple):
    ppid: int
    start: int
    state: str


def _stat(pid: int) -> _Stat | None:
    """``/proc/<pid>/stat``'s parent, start time and state; None once the process is reaped."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # after the command name, which is in parentheses and may itself hold ") "
    fields = text[text.rindex(")") + 2 :].split()
    return _Stat(ppid=int(fields[1]), start=int(fields[19]), state=fields[0])


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [os.fsdecode(arg) for arg in raw.split(b"\0")[:-1]]


def process_id(pid: int) -> ProcessId | None:
    """The running process ``pid`` as a :class:`ProcessId`; None when there is none."""
    stat = _stat(pid)
    return ProcessId(pid, stat.start) if stat is not None else None


def runs_snakemake(argv: Sequence[str]) -> bool:
    """Whether a command line runs Snakemake: its ``snakemake`` entry point (run directly, or
    as ``python .../bin/snakemake`` as the kernel runs the script's ``#!``) or ``python -m
    snakemake`` (SLURM's job step, Snakemake's spawned jobs). Program names, not text: the
    job's own script under ``.snakemake/scripts/``, or a ``bash -c`` that mentions snakemake,
    are not Snakemake."""
    if not argv:
        return False
    program = Path(argv[0]).name
    if program == "snakemake":
        return True
    if not _PYTHON.fullmatch(program):
        return False
    args = iter(argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, None) in _SNAKEMAKE_MODULES
        if arg.startswith("-m"):
            return arg[2:] in _SNAKEMAKE_MODULES
        if arg == "--":
            return Path(next(args, "")).name == "snakemake"
        if arg in _PYTHON_VALUED:
            next(args, None)
        elif arg.startswith("-c") or arg == "-":
            return False  # a command or stdin, not a script
        elif not arg.startswith("-"):
            return Path(arg).name == "snakemake"  # the script python runs
    return False


def nearest_ancestor(
    matches: Callable[[list[str]], bool], pid: int | None = None
) -> ProcessId | None:
    """The nearest ancestor of ``pid`` (this process) whose command line ``matches``; None when
    there is none in sight (the chain ends at pid 0: the top of this PID namespace)."""
    stat = _stat(os.getpid() if pid is None else pid)
    seen: set[int] = set()
    while stat is not None and stat.ppid > 0 and stat.ppid not in seen:
        ancestor = stat.ppid
        seen.add(ancestor)
        stat = _stat(ancestor)
        if stat is not None and matches(_cmdline(ancestor)):
            return ProcessId(ancestor, stat.start)
    return None


def is_alive(process: ProcessId) -> bool:
    """Whether the process still runs (a zombie has died: its parent has not reaped it yet)."""
    stat = _stat(process.pid)
    return stat is not None and stat.start == process.start and stat.state not in "ZXx"


def wait_gone(process: ProcessId, poll_s: float = 1.0) -> None:
    """Block until the process has died: on its pidfd, or by looking every ``poll_s`` where
    there is no pidfd (Linux < 5.3, a seccomp filter)."""
    try:
        fd = os.pidfd_open(process.pid)
    except ProcessLookupError:
        return
    except OSError:
        while is_alive(process):
            time.sleep(poll_s)
        return
    try:
        if not is_alive(process):  # the pid was another's by the time the pidfd was opened
            return
        poller = select.poll()
        poller.register(fd, select.POLLIN)  # readable once the process has exited
        while not poller.poll():
            pass
    finally:
        os.close(fd)


def stop_when_gone(
    process: ProcessId, what: str, *, grace_s: float = STOP_GRACE_S, poll_s: float = 1.0
) -> threading.Thread:
    """Watch ``process`` from a daemon thread; when it dies, send this process SIGTERM (its
    cleanup runs as on any SIGTERM), and SIGKILL if it has not exited ``grace_s`` later."""

    def watch() -> None:
        wait_gone(process, poll_s)
        log.error("%s (pid %d) that started this job is gone; stopping the job", what, process.pid)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        log.error("the job did not stop within %g s of SIGTERM; killing it", grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name=f"watch-{what}-{process.pid}", daemon=True)
    thread.start()
    return thread


def stop_with_snakemake(*, grace_s: float = STOP_GRACE_S) -> ProcessId | None:
    """Make this job stop when the Snakemake that started it dies (the nearest ancestor that
    :func:`runs_snakemake`); the Snakemake watched, or None when none is in sight (the job then
    runs unwatched: started by hand, or in a container with its own PID namespace)."""
    snakemake = nearest_ancestor(runs_snakemake)
    if snakemake is None:
        log.warning(
            "no Snakemake process among this job's ancestors: it will not stop if its "
            "Snakemake is killed"
        )
        return None
    log.info("watching Snakemake (pid %d): this job stops if it dies", snakemake.pid)
    stop_when_gone(snakemake, "Snakemake", grace_s=grace_s)
    return snakemake
