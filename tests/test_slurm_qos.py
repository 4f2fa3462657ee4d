"""A QOS's MaxWall caps a job's time as the partition's MaxTime does (deploybench/planning/schedule.py):
SLURM leaves a job over it pending for ever (QOSMaxWallDurationPerJobLimit). The MaxWall is read
with sacctmgr, here from a real slurmdbd over a real MariaDB started for this module
(tests/slurm_accounting.py), and a run that asks for more is refused while the DAG is built,
naming the QOS, its MaxWall and what to do.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from deploybench.errors import ConfigError
from deploybench.planning import run_plan as dbplan
from deploybench.planning import schedule
from deploybench.planning.schedule import (
    TimeLimit,
    check_time_limits,
    cluster_time_limits,
    parse_max_wall,
    partition_qos,
    qos_max_minutes,
)
from tests.conftest import base_config, validated, write_config
from tests.slurm_accounting import Accounting, slurm_accounting, unavailable_reason
from tests.slurm_cluster import skip_or_fail_unavailable
from tests.test_slurm import slurm_snakemake

RUN = ("tft", "A30", "trt", "fp16")
# the QOS made in the test's accounting database: name -> MaxWall (None: none)
QOS = {"short": "00:30:00", "long": "04:00:00", "nolimit": None}
DAEMONS = ("munged", "mariadbd", "slurmdbd")


def a30_config(**slurm: object) -> dict:
    """The shipped config, A30's `slurm` settings updated with ``slurm``."""
    config = base_config()
    config["gpus"]["A30"]["slurm"].update(slurm)
    return validated(config)


def fake_command(tmp_path: Path, name: str, stdout: str, rc: int = 0, stderr: str = "") -> str:
    """An executable that prints ``stdout`` (and ``stderr``) and exits ``rc``."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\nprintf '%s' '{stdout}'\nprintf '%s' '{stderr}' >&2\nexit {rc}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


# ------------------------------------------------------------------------------ parsing


def test_max_wall_formats_read_as_minutes():
    assert [parse_max_wall(t) for t in ("30:00", "00:30:00", "1-00:00:00", "04:00:00")] == [
        30, 30, 1440, 240
    ]  # fmt: skip
    assert parse_max_wall("") is None and parse_max_wall("  ") is None  # no MaxWall: no limit
    with pytest.raises(ValueError, match="not a SLURM time"):
        parse_max_wall("1:2:3:4")


def test_qos_output_is_matched_by_name(tmp_path):
    """`sacctmgr -n -P show qos <name> format=Name,MaxWall` prints `name|maxwall`, the name in
    lower case; an empty MaxWall is no limit, no line an unknown QOS."""
    sacctmgr = fake_command(tmp_path, "sacctmgr", "normal|\nshort|00:30:00\n")
    assert qos_max_minutes("short", sacctmgr) == (30, "QOS short: MaxWall 00:30:00 (30 min)")
    assert qos_max_minutes("Short", sacctmgr)[0] == 30
    assert qos_max_minutes("normal", sacctmgr) == (None, "QOS normal: no MaxWall")
    minutes, found = qos_max_minutes("gpu", sacctmgr)
    assert minutes is None and "sacctmgr knows no QOS gpu" in found


def test_sacctmgr_absent_or_failing_is_no_limit_and_said(tmp_path):
    """Without sacctmgr, or without slurmdbd (sacctmgr fails), there is no QOS limit: the log
    line says why, nothing is raised."""
    minutes, found = qos_max_minutes("short", str(tmp_path / "no-sacctmgr"))
    assert minutes is None and found.startswith("could not run sacctmgr:")
    assert "MaxWall not checked" in found
    failing = fake_command(
        tmp_path, "sacctmgr", "", rc=1,
        stderr="sacctmgr: error: Sending PersistInit msg: Connection refused",
    )  # fmt: skip
    assert qos_max_minutes("short", failing) == (
        None,
        (
            "sacctmgr show qos short gave no MaxWall (sacctmgr: error: Sending PersistInit msg: "
            "Connection refused)"
        ),
    )


def test_partitions_own_qos_is_read_with_scontrol(tmp_path):
    line = "PartitionName=gpu AllowGroups=ALL QoS=gpu_part DefaultTime=NONE MaxTime=08:00:00\n"
    assert partition_qos("gpu", fake_command(tmp_path, "scontrol", line)) == (
        "gpu_part", "partition gpu: QOS gpu_part"
    )  # fmt: skip
    none = fake_command(tmp_path, "scontrol2", line.replace("gpu_part", "N/A"))
    assert partition_qos("gpu", none) == (None, "partition gpu: no QOS of its own")
    failing = fake_command(tmp_path, "scontrol3", "", rc=1, stderr="slurm_load_partitions: x")
    assert partition_qos("gpu", failing)[0] is None


def test_the_smallest_limit_decides_and_the_error_names_what_sets_it():
    """min(partition MaxTime, QOS MaxWall): the error names the one (or those) at the minimum,
    and each one's way out."""
    jobs, groups = [("convert", 60), ("offline", 100)], {"convert": None, "offline": None}
    partition = TimeLimit(480, "partition 'gpu' allows 480 min a job", "use another partition")
    qos = TimeLimit(90, "QOS 'short' allows 90 min a job", "use another QOS")
    check_time_limits("r", "A30", [partition], jobs, groups, None)  # fits
    with pytest.raises(ConfigError) as err:
        check_time_limits("r", "A30", [partition, qos], jobs, groups, None)
    assert str(err.value) == (
        "r: QOS 'short' allows 90 min a job, but offline 100 min: set gpus.A30.slurm.max_runtime "
        "to 90 or less (the measurements are then split into parts that fit) or use another QOS"
    )
    both = TimeLimit(90, "partition 'gpu' allows 90 min a job", "use another partition")
    with pytest.raises(ConfigError, match="partition 'gpu' allows 90 min a job and QOS 'short'"):
        check_time_limits("r", "A30", [both, qos], jobs, groups, None)
    check_time_limits("r", "A30", [], jobs, groups, None)  # nothing read: nothing refused


def test_limits_are_read_once_and_each_logged(monkeypatch):
    """The partition's MaxTime, its own QOS's MaxWall and the job's QOS's, each read once for
    every run that shares them; the partition's QOS is not read twice when it is the job's, nor
    asked for where sinfo could not read the partition (each try waits for the controller)."""
    calls: list[str] = []

    def reader(kind, answer, found):
        def read(name, *_):
            calls.append(f"{kind} {name}")
            return answer(name), found.format(name)

        return read

    sinfo = {"gpu": 480, "down": None}
    monkeypatch.setattr(
        schedule, "partition_max_minutes",
        reader("sinfo", sinfo.get, "partition {}: MaxTime 8:00:00 (480 min)"),
    )  # fmt: skip
    monkeypatch.setattr(schedule, "partition_qos", reader("scontrol", lambda _: "part", "{}"))
    walls = {"part": 240, "short": 30}
    monkeypatch.setattr(schedule, "qos_max_minutes", reader("sacctmgr", walls.get, "{}"))
    logged: list[str] = []
    read: dict = {}
    limits = cluster_time_limits("A30", "gpu", "short", logged.append, read)
    assert [t.minutes for t in limits] == [480, 240, 30]
    assert "partition 'gpu''s own QOS 'part' allows 240 min" in limits[1].source
    assert "gpus.A30.slurm.qos or slurm.qos" in limits[2].remedy
    assert cluster_time_limits("H100", "gpu", "short", logged.append, read) == [
        limits[0], limits[1], TimeLimit(30, limits[2].source, limits[2].remedy.replace("A30", "H100"))
    ]  # fmt: skip
    assert calls == ["sinfo gpu", "scontrol gpu", "sacctmgr part", "sacctmgr short"]
    assert logged == ["partition gpu: MaxTime 8:00:00 (480 min)", "gpu", "part", "short"]
    assert [t.minutes for t in cluster_time_limits("A30", "gpu", "PART", print, read)] == [480, 240]
    assert cluster_time_limits("A30", None, None, print, read) == []
    # sinfo could not read partition `down`: scontrol is not asked, the QOS still is
    monkeypatch.setattr(
        schedule, "partition_max_minutes",
        reader("sinfo", sinfo.get, "sinfo -p {} gave no MaxTime (Unable to contact slurm controller)"),
    )  # fmt: skip
    calls.clear()
    assert [t.minutes for t in cluster_time_limits("A30", "down", "short", print, read)] == [30]
    assert calls == ["sinfo down"]


# ------------------------------------------------------------------- real slurmdbd


@pytest.fixture(scope="module")
def accounting() -> Iterator[Accounting]:
    """slurmdbd over MariaDB with this module's QOS, up for this module's tests only."""
    skip_or_fail_unavailable(unavailable_reason(), "QOS tests")
    with slurm_accounting() as acct:
        for name, wall in QOS.items():
            acct.sacctmgr("-i", "add", "qos", name, *([f"MaxWall={wall}"] if wall else []))
        yield acct


@pytest.fixture
def slurm_conf(accounting: Accounting, monkeypatch: pytest.MonkeyPatch) -> Accounting:
    """SLURM's commands (sacctmgr) of this test and its children ask the test's slurmdbd."""
    monkeypatch.setenv("SLURM_CONF", str(accounting.slurm_conf))
    return accounting


def test_sacctmgr_reads_the_qos_maxwall(slurm_conf):
    """`sacctmgr -i add qos short MaxWall=00:30:00`, read back as 30 minutes."""
    shown = slurm_conf.sacctmgr("-n", "-P", "show", "qos", "format=Name,MaxWall").split()
    assert {"short|00:30:00", "long|04:00:00", "nolimit|"} <= set(shown), shown
    assert qos_max_minutes("short") == (30, "QOS short: MaxWall 00:30:00 (30 min)")
    assert qos_max_minutes("long")[0] == 240
    assert qos_max_minutes("nolimit") == (None, "QOS nolimit: no MaxWall")
    assert qos_max_minutes("missing")[0] is None


def test_a_run_over_its_qos_maxwall_is_refused_by_the_plan(slurm_conf):
    """The workflow's own steps (rules/common.smk log_submissions): the limits read for the run's
    partition and QOS, then the plan's check. Over QOS short's 30 minutes: refused, naming the
    QOS, its MaxWall and the fix; under QOS long's 4 h with max_runtime 240 it fits."""
    config = a30_config(partition=None, qos="short")
    plan = dbplan.plan_run(config, *RUN)
    assert plan.gpu_request.qos == "short"
    logged: list[str] = []
    limits = cluster_time_limits("A30", None, plan.gpu_request.qos, logged.append, {})
    assert logged == ["QOS short: MaxWall 00:30:00 (30 min)"]
    with pytest.raises(ConfigError) as err:
        plan.check_time_limits(limits)
    message = str(err.value)
    assert message.startswith(
        "tft/A30/trt/fp16: QOS 'short' allows 30 min a job (its MaxWall, read with sacctmgr), "
        "but group job run "
    ), message
    assert "set gpus.A30.slurm.max_runtime to 30 or less" in message
    assert "submit with a QOS whose MaxWall is longer (gpus.A30.slurm.qos or slurm.qos)" in message

    fits = dbplan.plan_run(a30_config(partition=None, qos="long", max_runtime=240), *RUN)
    fits.check_time_limits(cluster_time_limits("A30", None, "long", print, {}))
    # the site's QOS (`slurm.qos`) where the GPU names none
    site = a30_config(partition=None)
    site["slurm"]["qos"] = "short"
    plan = dbplan.plan_run(site, *RUN)
    with pytest.raises(ConfigError, match="QOS 'short' allows 30 min"):
        plan.check_time_limits(cluster_time_limits("A30", None, plan.gpu_request.qos, print, {}))


def test_snakemake_preflight_refuses_a_run_over_its_qos_maxwall(slurm_conf, tmp_path):
    """End to end: `snakemake -n preflight` with profiles/slurm (SLURM_CONF on the test's
    slurmdbd; no slurmctld, so sinfo reads no MaxTime and says so) refuses the run over QOS
    short's MaxWall before anything is submitted; under QOS long with max_runtime 240 it fits."""
    config = a30_config(qos="short")
    write_config(tmp_path, config)
    args = ("preflight", "--config", "targets=[tft/A30/trt/fp16]")
    refused = slurm_snakemake(tmp_path, *args, timeout_s=120, dry_run=True)
    out = refused.stdout + refused.stderr
    assert refused.returncode == 1, out[-4000:]
    assert "QOS short: MaxWall 00:30:00 (30 min)" in out
    assert f"sinfo -p {config['gpus']['A30']['slurm']['partition']} gave no MaxTime" in out
    assert "tft/A30/trt/fp16: QOS 'short' allows 30 min a job (its MaxWall, read with " in out
    assert "gpus.A30.slurm.qos or slurm.qos" in out
    assert "preflight_check" not in out
    write_config(tmp_path, a30_config(qos="long", max_runtime=240))
    fits = slurm_snakemake(tmp_path, *args, timeout_s=120, dry_run=True)
    out = fits.stdout + fits.stderr
    assert fits.returncode == 0, out[-4000:]
    assert "QOS long: MaxWall 04:00:00 (240 min)" in out


def test_nothing_of_the_accounting_daemons_is_left():
    """The fixture's teardown stops munged, MariaDB and slurmdbd (its own children) and removes
    their directory."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    before = set(psutil.Process().children())  # the module's slurmdbd, if it is up
    with slurm_accounting() as acct:
        scratch = acct.scratch
        daemons = [p for p in set(psutil.Process().children()) - before if p.name() in DAEMONS]
        assert sorted(p.name() for p in daemons) == sorted(DAEMONS)
    assert not scratch.exists()
    assert not [p for p in daemons if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
