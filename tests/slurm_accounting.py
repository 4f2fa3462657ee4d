"""A real slurmdbd over a real MariaDB on this machine, for the tests that read SLURM's accounting
database with sacctmgr (tests/test_slurm_qos.py).

Everything lives in a temporary directory of its own: MariaDB's data and socket (TCP on
127.0.0.1, a free port), a munged with its own key and socket, slurmdbd on a free port, and a
slurm.conf (``AccountingStorageType=accounting_storage/slurmdbd``, the munge socket in
``AccountingStoragePass``) that ``SLURM_CONF`` points sacctmgr at. /etc/slurm, /etc/munge and the
test cluster's daemons (tests/slurm_cluster.py) are left alone, so both can run at once. There
is no slurmctld: sacctmgr talks only to slurmdbd. The daemons run in the foreground as this
process's children (they die with it) and are stopped, and the directory removed, even when the
start or the tests fail. Needs root and the Debian packages slurmdbd, mariadb-server, munge and
slurm-client (envs/test-packages.sh installs them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.slurm_cluster import _die_with_parent, _stop, _wait

CLUSTER = "dbacct-test"
BINARIES = (
    "/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db", "/usr/bin/mariadb", "/usr/sbin/slurmdbd",
    "/usr/bin/sacctmgr", "/usr/sbin/munged", "/usr/sbin/mungekey",
)  # fmt: skip
LABEL = "test slurmdbd"  # how its start-up errors name it
DB_USER, DB_PASS, DB_NAME = "slurm", "deploybench-test", "slurm_acct_db"


def unavailable_reason() -> str | None:
    """Why no accounting database can be started here, or None."""
    if os.geteuid() != 0:
        return "the test slurmdbd needs root (slurmdbd and munged run as root here)"
    missing = [b for b in BINARIES if not os.access(b, os.X_OK)]
    if missing:
        return (
            "slurmdbd/MariaDB/munge packages not installed (run envs/test-packages.sh): "
            f"missing {missing}"
        )
    return None


@dataclass(frozen=True)
class Accounting:
    """A running slurmdbd: ``env`` (SLURM_CONF) points SLURM's commands at it."""

    scratch: Path
    slurm_conf: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.slurm_conf)}

    def sacctmgr(self, *args: str) -> str:
        """``sacctmgr args`` against this slurmdbd (``-i``: commit at once); its stdout."""
        out = subprocess.run(
            ["sacctmgr", *args], capture_output=True, text=True, env=self.env, timeout=30,
            check=False,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"sacctmgr {' '.join(args)}: {out.stderr or out.stdout}")
        return out.stdout

    def log(self, name: str) -> str:
        path = self.scratch / name
        return path.read_text(errors="replace") if path.exists() else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ok(cmd: list[str], env: dict[str, str] | None = None) -> bool:
    try:
        out = subprocess.run(cmd, capture_output=True, env=env, timeout=10, check=False)
    except (subprocess.TimeoutExpired, OSError):
        return False
    return out.returncode == 0


def _daemon(
    cmd: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
            preexec_fn=_die_with_parent(),  # noqa: PLW1509 (the child only calls prctl)
        )  # fmt: skip


@contextlib.contextmanager
def slurm_accounting() -> Iterator[Accounting]:
    """Start MariaDB, munged and slurmdbd, register the cluster; yield; stop them all and
    remove their directory."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    # short: socket paths must fit in 108 bytes
    scratch = Path(tempfile.mkdtemp(prefix="dbacct-"))
    scratch.chmod(0o755)
    munge_dir, key_dir, data = scratch / "munge", scratch / "munge-key", scratch / "db"
    for path, mode in ((munge_dir, 0o755), (key_dir, 0o700), (data, 0o700)):
        path.mkdir()
        path.chmod(mode)
    munge_socket, db_socket = munge_dir / "munge.sock", scratch / "mysqld.sock"
    db_port, dbd_port, ctld_port = _free_port(), _free_port(), _free_port()
    slurm_conf = scratch / "slurm.conf"
    accounting = Accounting(scratch, slurm_conf)
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        subprocess.run(["mungekey", "--create", f"--keyfile={key_dir}/munge.key"], check=True)
        daemons.append(
            _daemon(
                [
                    "/usr/sbin/munged", "--foreground", "--force", f"--socket={munge_socket}",
                    f"--key-file={key_dir}/munge.key", f"--pid-file={key_dir}/munged.pid",
                    f"--seed-file={key_dir}/munged.seed",
                ],
                scratch / "munged.log",
            )
        )  # fmt: skip
        subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
             "--auth-root-authentication-method=socket", "--skip-test-db"],
            capture_output=True, check=True, timeout=120,
        )  # fmt: skip
        daemons.append(
            _daemon(
                [
                    "/usr/sbin/mariadbd", "--no-defaults", f"--datadir={data}",
                    f"--socket={db_socket}", f"--port={db_port}", "--bind-address=127.0.0.1",
                    "--user=root", f"--pid-file={scratch}/mysqld.pid", "--skip-log-bin",
                    "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
                    "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0",
                ],
                scratch / "mysqld.log",
            )
        )  # fmt: skip
        mariadb = ["mariadb", f"--socket={db_socket}", "-u", "root"]
        _wait(
            "MariaDB answering",
            lambda: _ok([*mariadb, "-e", "SELECT 1"]),
            lambda: accounting.log("mysqld.log"),
            label=LABEL,
            poll_s=0.2,
        )
        subprocess.run(
            [*mariadb, "-e", (
                f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASS}';"
                f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';"
            )],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        _wait(
            "munged answering",
            lambda: _ok(["munge", "-S", str(munge_socket), "-n"]),
            lambda: accounting.log("munged.log"),
            label=LABEL,
            poll_s=0.2,
        )
        dbd_conf = scratch / "slurmdbd.conf"  # slurmdbd reads it beside SLURM_CONF
        dbd_conf.write_text(
            "\n".join([
                "AuthType=auth/munge",
                f"AuthInfo=socket={munge_socket}",
                "DbdHost=localhost",
                "DbdAddr=127.0.0.1",
                f"DbdPort={dbd_port}",
                "SlurmUser=root",
                f"PidFile={scratch}/slurmdbd.pid",
                "StorageType=accounting_storage/mysql",
                "StorageHost=127.0.0.1",
                f"StoragePort={db_port}",
                f"StorageUser={DB_USER}",
                f"StoragePass={DB_PASS}",
                f"StorageLoc={DB_NAME}",
                "",
            ])
        )  # fmt: skip
        dbd_conf.chmod(0o600)  # slurmdbd refuses one others can read
        slurm_conf.write_text(
            "\n".join([
                f"ClusterName={CLUSTER}",
                "SlurmctldHost=localhost(127.0.0.1)",  # none runs: sacctmgr needs only slurmdbd
                f"SlurmctldPort={ctld_port}",
                # what asks the absent slurmctld (sinfo, the plugin's `scontrol show config`)
                # fails at once, not after the default 10 s of retries
                "MessageTimeout=1",
                "SlurmUser=root",
                "AuthType=auth/munge",
                f"AuthInfo=socket={munge_socket}",
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={dbd_port}",
                # with slurmdbd and munge, the socket of the munged to use
                f"AccountingStoragePass={munge_socket}",
                "NodeName=localhost CPUs=1 State=UNKNOWN",
                "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ])
        )  # fmt: skip
        daemons.append(
            _daemon(["/usr/sbin/slurmdbd", "-D"], scratch / "slurmdbd.log", env=accounting.env)
        )
        _wait(
            "slurmdbd answering",
            lambda: _ok(["sacctmgr", "-n", "-P", "show", "qos"], env=accounting.env),
            lambda: accounting.log("slurmdbd.log"),
            label=LABEL,
            poll_s=0.2,
        )
        accounting.sacctmgr("-i", "add", "cluster", CLUSTER)
        yield accounting
    finally:
        for proc in reversed(daemons):  # slurmdbd, MariaDB, then munged
            _stop(proc)
        shutil.rmtree(scratch, ignore_errors=True)
