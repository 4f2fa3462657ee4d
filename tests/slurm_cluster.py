"""A real one-node SLURM cluster on this machine, for the SLURM tests.

Debian's slurmctld/slurmd/munge over loopback, as root (recipe and pitfalls:
../shared/notes/slurm.md). Installs nothing: ``envs/test-packages.sh`` (run by ``make test``) installs
the packages. :func:`slurm_cluster` writes ``/etc/slurm/slurm.conf`` and ``gres.conf`` (the
plugin's in-job step drops ``SLURM_CONF``, so the config must be at the standard path), backs up
and restores any that were there, runs the daemons in the foreground as its own children (so
they are reaped, and die with the test process), and tears everything down even when the
start or the tests fail.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SLURM_ETC = Path("/etc/slurm")
CONFIG_FILES = ("slurm.conf", "gres.conf")
PARTITION = "main"
# The one stand-in GPU is typed, so a typed request (`--gpus=a30:1`) can be scheduled as well as
# `--gpus=1`.
GPU_TYPE = "a30"
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN = Path("/run/munge")
# What the packages install (slurmctld, slurmd, slurm-client, munge).
BINARIES = (
    "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/sbatch",
    "/usr/bin/squeue", "/usr/bin/sinfo", "/usr/bin/scancel", "/usr/bin/srun", "/usr/bin/munge",
)  # fmt: skip
START_TIMEOUT_S = 60
HEADER = "# deploybench test cluster (tests/slurm_cluster.py); removed when the tests end"
_PR_SET_PDEATHSIG = 1


def unavailable_reason() -> str | None:
    """Why no cluster can be started here, or None."""
    if os.geteuid() != 0:
        return "the test SLURM cluster needs root (it writes /etc/slurm and starts daemons)"
    missing = [b for b in BINARIES if not os.access(b, os.X_OK)]
    if missing:
        return f"SLURM/munge packages not installed (run envs/test-packages.sh): missing {missing}"
    return None


@dataclass(frozen=True)
class Cluster:
    host: str
    partition: str
    scratch: Path

    def squeue(self) -> list[str]:
        """Job ids of the jobs SLURM still holds as pending or running."""
        out = _run(["squeue", "-h", "-t", "PENDING,RUNNING,CONFIGURING,COMPLETING", "-o", "%i"])
        return out.split()

    def log(self, daemon: str) -> str:
        path = self.scratch / f"{daemon}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _run(cmd: list[str], timeout: float = 30) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=timeout).stdout


def _die_with_parent() -> Callable[[], None]:
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def set_pdeathsig() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return set_pdeathsig


def _node_line(host: str) -> str:
    # slurmd -C: "NodeName=vm CPUs=2 Boards=1 ... RealMemory=24103"; keep ~10 % of memory back
    fields = dict(f.split("=", 1) for f in _run(["/usr/sbin/slurmd", "-C"]).split("\n")[0].split())
    fields["NodeName"] = host
    fields["RealMemory"] = str(int(int(fields["RealMemory"]) * 0.9))
    node = " ".join(f"{k}={v}" for k, v in fields.items())
    return f"{node} NodeAddr=127.0.0.1 Gres=gpu:{GPU_TYPE}:1 State=UNKNOWN"


def slurm_conf(host: str, scratch: Path) -> str:
    return "\n".join([
        HEADER,
        "ClusterName=deploybench-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"StateSaveLocation={scratch}/state",
        f"SlurmdSpoolDir={scratch}/spool",
        f"SlurmctldPidFile={scratch}/slurmctld.pid",
        f"SlurmdPidFile={scratch}/slurmd.pid",
        f"SlurmctldLogFile={scratch}/slurmctld.log",
        f"SlurmdLogFile={scratch}/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        # without it a job with no memory request takes the whole node
        "DefMemPerCPU=1000",
        "SchedulerType=sched/backfill",
        "ReturnToService=2",
        # finished jobs stay visible to squeue (the status command used without slurmdbd) and
        # to scontrol for an hour, longer than the module (300 s, the default, could expire a
        # job a test reads later while the module runs beside the smoke run). Not 0 (no purge):
        # Slurm then reports 2, and snakemake-executor-plugin-slurm 2.8.0 (`check_active_jobs`)
        # turns from squeue to sacct below 3 x its first status interval, and sacct has no
        # accounting here: Snakemake would never see its jobs end
        "MinJobAge=3600",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        "GresTypes=gpu",
        _node_line(host),
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ])  # fmt: skip


def gres_conf(host: str) -> str:
    # a GPU GRES needs a File=; /dev/null stands in for the device (jobs get
    # CUDA_VISIBLE_DEVICES=0 and take turns on it), so GPU requests can be scheduled here
    return f"AutoDetect=off\nNodeName={host} Name=gpu Type={GPU_TYPE} File=/dev/null\n"


def _munge_works() -> bool:
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, check=True, timeout=10)
        subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, check=True, timeout=10)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
        return False
    return True


def _wait(
    what: str,
    ready: Callable[[], bool],
    diagnostics: Callable[[], str],
    label: str = "test SLURM cluster",
    poll_s: float = 0.5,
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(poll_s)
    raise RuntimeError(f"{label}: {what} not within {START_TIMEOUT_S}s\n{diagnostics()}")


def skip_or_fail_unavailable(reason: str | None, tests: str) -> None:
    """Skip ``tests`` where their daemons cannot run here (``reason``); on CI fail instead:
    make test installs them (envs/test-packages.sh)."""
    if not reason:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the {tests} (make test runs envs/test-packages.sh): {reason}")
    pytest.skip(reason)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _node_state(host: str) -> str:
    try:
        return _run(["sinfo", "-h", "-n", host, "-o", "%T"], timeout=10).strip()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return ""


@contextlib.contextmanager
def slurm_cluster(scratch: Path) -> Iterator[Cluster]:
    """Start munge (unless one already answers), slurmctld and slurmd; yield when the node is
    idle; then cancel every job, stop what was started, restore /etc/slurm, remove ``scratch``."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    host = socket.gethostname().split(".")[0]
    scratch.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool", "etc-backup"):
        (scratch / sub).mkdir(exist_ok=True)
    cluster = Cluster(host, PARTITION, scratch)
    daemons: list[subprocess.Popen[bytes]] = []
    backed_up: list[str] = []
    try:
        SLURM_ETC.mkdir(exist_ok=True)
        conf = SLURM_ETC / "slurm.conf"
        # one left by a test run that was killed is ours, not the site's: not kept
        stale = conf.is_file() and conf.read_text().startswith(HEADER)
        for name in CONFIG_FILES:
            if (SLURM_ETC / name).exists() and not stale:
                shutil.move(SLURM_ETC / name, scratch / "etc-backup" / name)
                backed_up.append(name)
        (SLURM_ETC / "slurm.conf").write_text(slurm_conf(host, scratch))
        (SLURM_ETC / "gres.conf").write_text(gres_conf(host))

        if not _munge_works():
            if not MUNGE_KEY.exists():
                _run(["mungekey", "--create"])
            shutil.chown(MUNGE_KEY, "munge", "munge")
            MUNGE_KEY.chmod(0o400)
            MUNGE_RUN.mkdir(exist_ok=True)
            shutil.chown(MUNGE_RUN, "munge", "munge")
            with open(scratch / "munged.log", "wb") as munge_log:
                daemons.append(
                    subprocess.Popen(
                        ["/usr/sbin/munged", "--foreground", "--force"],
                        user="munge",
                        group="munge",
                        stdout=munge_log,
                        stderr=subprocess.STDOUT,
                        preexec_fn=_die_with_parent(),  # noqa: PLW1509 (the child only calls prctl)
                    )
                )
            _wait("munged answering", _munge_works, lambda: cluster.log("munged"))

        for daemon in ("slurmctld", "slurmd"):
            daemons.append(
                subprocess.Popen(
                    [f"/usr/sbin/{daemon}", "-D"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    preexec_fn=_die_with_parent(),  # noqa: PLW1509 (the child only calls prctl)
                )
            )
        _wait(
            f"node {host} idle",
            lambda: _node_state(host) == "idle",
            lambda: (
                f"sinfo: {_node_state(host)!r}\n--- slurmctld.log\n{cluster.log('slurmctld')}"
                f"\n--- slurmd.log\n{cluster.log('slurmd')}"
            ),
        )
        yield cluster
    finally:
        if daemons and any(d.poll() is None for d in daemons):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                _run(["scancel", "--user=root"], timeout=10)
                deadline = time.monotonic() + 20
                while cluster.squeue() and time.monotonic() < deadline:
                    time.sleep(0.5)
        for proc in reversed(daemons):  # slurmd, slurmctld, then munged
            _stop(proc)
        for name in CONFIG_FILES:
            (SLURM_ETC / name).unlink(missing_ok=True)
        for name in backed_up:
            shutil.move(scratch / "etc-backup" / name, SLURM_ETC / name)
        shutil.rmtree(scratch, ignore_errors=True)
