"""Time limits that fit (deploybench/planning/schedule.py): a GPU's `slurm.max_runtime` splits a run's
group job and its measurements so that no submission asks for more; a job that cannot fit fails
the DAG with the numbers. Site settings (`gres`, account, QOS, reservation, extra options)
reach the SLURM executor plugin's resources. The real cluster sees both in tests/test_slurm.py.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import yaml

from deploybench.errors import ConfigError
from deploybench.io import sha256_of
from deploybench.planning import parts, schedule
from deploybench.planning import resources as dbresources
from deploybench.planning import run_plan as dbplan
from deploybench.planning.config_search_plan import plan_search
from tests.conftest import (
    ONCE_A_POINT,
    base_config,
    planned_jobs,
    run_snakemake,
    validated,
    write_config,
)
from tests.test_slurm import group_members, job_resources, slurm_snakemake

RUN = ("tft", "A30", "trt", "fp16")


def config_with(**slurm: object) -> dict:
    """The shipped config, A30's `slurm` settings updated with ``slurm``."""
    config = base_config()
    config["gpus"]["A30"]["slurm"].update(slurm)
    return validated(config)


def submissions(plan: dbplan.RunPlan) -> list[int]:
    """The --time of each submission: the run's group job's (the sum), then each job alone."""
    grouped = [m for job, m in plan.jobs() if plan.groups[job] is not None]
    alone = [m for job, m in plan.jobs() if plan.groups[job] is None]
    return ([sum(grouped)] if grouped else []) + alone


@pytest.mark.parametrize("limit", [60, 90, 120, 240, 480, 720, 10_000])
def test_every_submission_fits_and_every_point_is_measured_once(limit):
    for path in (RUN, ("bert", "A30", "trt", "fp16"), ("resnet50", "A30", "tf-trt", "fp16")):
        plan = dbplan.plan_run(config_with(max_runtime=limit), *path)
        assert max(submissions(plan)) <= limit, (path, plan.jobs(), dict(plan.groups))
        for scenario in dbplan.SCENARIOS:
            measured = [
                point
                for k in range(plan.parts[scenario])
                for point in plan.part_points(scenario, k)
            ]
            assert measured == list(plan.points[scenario]), (path, scenario)
            # as few parts as fit: one part less would not
            per_part = max(len(plan.part_points(scenario, k)) for k in range(plan.parts[scenario]))
            assert plan.runtime[scenario] <= limit
            if plan.parts[scenario] > 1:
                fewer = -(-len(plan.points[scenario]) // (plan.parts[scenario] - 1))
                trials = int(plan.measure["trials"])
                assert fewer > per_part
                spec = dbresources.runtime_minutes(config_with(), {}, scenario, fewer * trials)
                assert spec > limit


def test_a_4h_limit_splits_tft_a30_trt_fp16():
    """Without a limit the run is one group job of 636 min (10.6 h); under 4 h: its preparation
    in the group job, offline alone, online in two parts of 16 points."""
    whole = dbplan.plan_run(config_with(), *RUN)
    assert submissions(whole) == [636] and set(whole.groups.values()) == {"run"}
    plan = dbplan.plan_run(config_with(max_runtime=240), *RUN)
    assert dict(plan.parts) == {"offline": 1, "online": 2}
    assert [len(plan.part_points("online", k)) for k in (0, 1)] == [16, 16]
    assert dict(plan.groups) == {
        "convert": "run",
        "repository": "run",
        "accuracy": "run",
        "offline.0": None,
        "online.0": None,
        "online.1": None,
    }
    assert submissions(plan) == [100, 142, 202, 202]
    assert plan.submissions() == [
        "tft/A30/trt/fp16 (max_runtime 240 min): its jobs' --time, as submitted",
        "  group job run: convert 60 + repository 10 + accuracy 30 = 100 min",
        "  offline.0: 142 min",
        "  online.0: 202 min",
        "  online.1: 202 min",
    ]
    spec = plan.perf_spec("online", 1)
    assert spec["points"] == list(plan.points["online"][16:])


def test_a_job_that_cannot_fit_fails_naming_the_numbers():
    # one offline point: (5 + 3 trials x 2) x margin 2 = 22 min
    with pytest.raises(ConfigError, match=r"one offline point alone asks for 22 min .* of 20 min"):
        dbplan.plan_run(config_with(max_runtime=20), *RUN)
    # every point fits 30; the convert job (60 min) does not
    with pytest.raises(ConfigError, match=r"job 'convert' asks for 60 min .* max_runtime of 30"):
        dbplan.plan_run(config_with(max_runtime=30), *RUN)


def test_a_search_candidate_over_the_limit_fails():
    """A candidate's online sweep is one job (5 points: 70 min): over the limit it fails."""
    assert plan_search(config_with(max_runtime=70), *RUN).candidate_runtime["online"] == 70
    with pytest.raises(ConfigError, match=r"'search_online' asks for 70 min .* of 60 min"):
        plan_search(config_with(max_runtime=60), *RUN)


def test_pack_groups_keeps_order_and_first_fit():
    jobs = [("a", 50), ("b", 100), ("c", 60), ("d", 40)]
    assert schedule.pack_groups(jobs, 150, "x") == {"a": "run", "b": "run", "c": None, "d": None}
    assert schedule.pack_groups(jobs, 200, "x") == {"a": "run", "b": "run", "c": None, "d": "run"}
    assert set(schedule.pack_groups(jobs, None, "x").values()) == {"run"}
    with pytest.raises(ConfigError, match=r"job 'b' asks for 100 min .* 99 min"):
        schedule.pack_groups(jobs, 99, "x")


def test_dry_run_under_a_4h_limit_submits_what_fits(tmp_path):
    """`snakemake -n --profile profiles/slurm results/tft/A30/trt/fp16/{offline,online}.csv`
    with A30's max_runtime 240: convert and repository in the group job, offline and the two
    online parts alone, each within 240 min; the parts are merged where Snakemake runs."""
    config = base_config()
    config["gpus"]["A30"]["slurm"]["max_runtime"] = 240
    write_config(tmp_path, config)
    run = "results/tft/A30/trt/fp16"
    result = slurm_snakemake(
        tmp_path, f"{run}/offline.csv", f"{run}/online.csv", timeout_s=120, dry_run=True
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert group_members(out) == [["convert", "repository"]]
    jobs = job_resources(out)
    assert [r["runtime"] for r in jobs["offline_part"]] == ["142"]
    assert [r["runtime"] for r in jobs["online_part"]] == ["202", "202"]
    assert all(r["gpu"] == "1" and r["gpu_model"] == "a30" for r in jobs["online_part"])
    assert len(jobs["merge_parts"]) == 2
    for k in (0, 1):
        assert f"{run}/parts/online.{k}.csv" in out


def test_dry_run_with_a_limit_too_small_fails_naming_it(tmp_path):
    config = base_config()
    config["gpus"]["A30"]["slurm"]["max_runtime"] = 30
    write_config(tmp_path, config)
    result = slurm_snakemake(
        tmp_path, "results/tft/A30/trt/fp16/online.csv", timeout_s=120, dry_run=True
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-4000:]
    assert "'convert' asks for 60 min (--time), more than the partition's max_runtime of 30" in out


def test_site_settings_become_the_plugins_resources():
    config = config_with(
        gres="gpu:a30:1", account="proj", qos="high", reservation="maint", slurm_extra="--nice=5"
    )
    request = dbplan.plan_run(config, *RUN).gpu_request
    # GRES instead of --gpus: the plugin takes one or the other
    assert (request.gpu, request.gpu_model, request.gres) == (0, None, "gpu:a30:1")
    assert (request.slurm_account, request.qos) == ("proj", "high")
    assert request.slurm_extra == "--reservation=maint --nice=5"
    cpu = dbplan.plan_run(validated(base_config()), "tft", "cpu", "onnx", "fp32").gpu_request
    assert (cpu.gpu, cpu.gres, cpu.slurm_extra) == (0, None, None)


def test_the_sites_settings_apply_where_a_gpu_sets_none():
    """`slurm:` is every job's (CPU devices' too); a GPU's own replace it, key by key."""
    config = base_config()
    config["slurm"] = {"account": "site", "qos": "normal", "reservation": "maint"}
    config["gpus"]["A30"]["slurm"].update(account="gpu_project")
    config = validated(config)
    a30 = dbplan.plan_run(config, *RUN).gpu_request
    assert (a30.slurm_account, a30.qos, a30.slurm_extra) == (
        "gpu_project", "normal", "--reservation=maint"
    )  # fmt: skip
    cpu = dbplan.plan_run(config, "tft", "cpu", "onnx", "fp32").gpu_request
    assert (cpu.slurm_account, cpu.qos) == ("site", "normal")
    assert dbresources.site_request(config["slurm"]) == {
        "slurm_account": "site", "qos": "normal", "slurm_extra": "--reservation=maint"
    }  # fmt: skip


def test_extra_options_the_plugin_sets_itself_are_refused():
    from snakemake_executor_plugin_slurm.validation import get_forbidden_slurm_options

    forbidden = get_forbidden_slurm_options()
    config = config_with(slurm_extra="--exclusive --nice=5")
    dbresources.check_slurm_extra(config, forbidden)
    for extra, option in (("--time=5", "runtime/time limit"), ("--gpus=2", "GPU allocation")):
        config = config_with(slurm_extra=extra)
        with pytest.raises(ConfigError, match=rf"gpus.A30.slurm.slurm_extra '{extra}' sets the "):
            dbresources.check_slurm_extra(config, forbidden)
        assert option in forbidden.values()


def test_dry_run_shows_the_site_settings_on_every_gpu_job(tmp_path):
    """What the dry run lists is what the plugin turns into sbatch options (the real cluster's
    sbatch calls: tests/test_slurm.py); CPU-only jobs carry the site's, not the GPU's."""
    config = base_config()
    config["slurm"] = {"account": "site"}
    config["gpus"]["A30"]["slurm"].update(
        gres="gpu:a30:1", account="proj", qos="high", reservation="maint", slurm_extra="--nice=5"
    )
    write_config(tmp_path, config)
    result = slurm_snakemake(
        tmp_path, "results/tft/A30/trt/fp16/online.csv", timeout_s=120, dry_run=True
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    jobs = job_resources(out)
    site = {
        "gpu": "0",
        "gres": "gpu:a30:1",
        "slurm_account": "proj",
        "qos": "high",
        "slurm_extra": "--reservation=maint --nice=5",
        "slurm_partition": "gpu",
    }
    for rule in ("convert", "online"):
        [resources] = jobs[rule]
        assert site.items() <= resources.items(), (rule, resources)
        assert "gpu_model" not in resources
    # CPU-only jobs: the site's account, none of the GPU's settings
    for rule in ("prepare_checkpoint", "export"):
        [resources] = jobs[rule]
        assert resources["slurm_account"] == "site", (rule, resources)
        assert not {"gres", "qos", "slurm_extra"} & resources.keys(), rule


@pytest.mark.parametrize(
    ("slurm", "bad"),
    [
        ({"gres": "gpu:a30:2"}, "gpu:a30:2"),  # one whole GPU a job
        ({"account": "a b"}, "a b"),
        ({"slurm_extra": "--nice=5; rm -rf /"}, "rm -rf"),
        ({"max_runtime": 0}, "max_runtime"),
    ],
)
def test_bad_site_settings_are_refused(slurm, bad):
    from snakemake.exceptions import WorkflowError

    config = base_config()
    config["gpus"]["A30"]["slurm"].update(slurm)
    with pytest.raises(WorkflowError, match=re.escape(bad)):
        validated(config)


def test_parts_merge_into_the_scenarios_files(tmp_path):
    def part(k: int, rows: list[dict[str, str]], points: list[dict[str, int]]) -> list[Path]:
        files = [tmp_path / f"online.{k}.{s}" for s in ("csv", "trials.csv", "provenance.json")]
        for f in files[:2]:
            with f.open("w", newline="") as out:
                writer = csv.DictWriter(out, fieldnames=["batch", "concurrency", "throughput"])
                writer.writeheader()
                writer.writerows(rows)
        files[2].write_text(json.dumps({"host": f"node{k}", "config": {"points": points}}))
        return files

    first = part(0, [{"batch": "1", "concurrency": "1", "throughput": "10"}], [{"c": 1}])
    second = part(1, [{"batch": "1", "concurrency": "8", "throughput": "70"}], [{"c": 8}])
    out = {name: str(tmp_path / f"online.{name}") for name in ("csv", "trials", "provenance")}
    parts.merge(
        part_csvs=[str(first[0]), str(second[0])],
        part_trials=[str(first[1]), str(second[1])],
        part_provenances=[str(first[2]), str(second[2])],
        **out,
    )
    rows = list(csv.DictReader(Path(out["csv"]).read_text().splitlines()))
    assert [r["concurrency"] for r in rows] == ["1", "8"]
    record = json.loads(Path(out["provenance"]).read_text())
    assert record["config"]["points"] == [{"c": 1}, {"c": 8}]
    assert [p["host"] for p in record["parts"]] == ["node0", "node1"]
    assert record["result"] == out["csv"] and len(record["sha256"]) == 64

    other = tmp_path / "other.csv"
    other.write_text("batch,latency\n1,2\n")
    with pytest.raises(ConfigError, match="differ from the first part's"):
        parts.concatenate([first[0], other], tmp_path / "merged.csv")
    assert not (tmp_path / "merged.csv").exists()


@pytest.mark.e2e
def test_a_scenario_measured_in_parts_is_merged_into_its_usual_files(copy_of):
    """For real, on the CPU default (a copy of the smoke run): TFT online over two points, with
    a `max_runtime` that fits one, is measured as two part jobs, each with its own server, and
    merge_parts writes online.csv, its trials and provenance as one job would: the same
    columns, every point in order, and each part's record kept."""
    wd = copy_of
    run = "results/tft/cpu/onnx/fp32"
    config = yaml.safe_load((wd / "config" / "config.yaml").read_text())
    perf = config["sizings"]["cpu"]["tft"]["perf"]
    perf.update(ONCE_A_POINT, warmup_factor=0)
    perf["online"] = {"concurrency": [1, 4], "batch": 1}
    # a minute a step and a point, no margin: one point fits 2 minutes, two do not
    config["runtime"] = {
        "margin": 1,
        "per_point": 1,
        "steps": dict.fromkeys(config["runtime"]["steps"], 1),
    }
    config["gpus"]["cpu"]["slurm"] = {"partition": None, "constraint": None, "max_runtime": 2}
    write_config(wd, config)
    before_columns = (wd / run / "online.csv").read_text().splitlines()[0]
    result = run_snakemake(wd, f"{run}/online.csv", timeout=600)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    jobs = planned_jobs(result)
    assert jobs.get("online_part") == 2 and jobs.get("merge_parts") == 1, jobs
    assert "online" not in jobs  # the whole-scenario rule does not run on this GPU now
    rows = list(csv.DictReader((wd / run / "online.csv").open()))
    assert (wd / run / "online.csv").read_text().splitlines()[0] == before_columns
    assert [(r["batch"], r["concurrency"]) for r in rows] == [("1", "1"), ("1", "4")]
    part_points = [
        len(list(csv.DictReader((wd / run / "parts" / f"online.{k}.csv").open()))) for k in (0, 1)
    ]
    assert part_points == [1, 1]
    trials = list(csv.DictReader((wd / run / "online.trials.csv").open()))
    assert len(trials) == len(rows)  # one trial a point
    record = json.loads((wd / run / "online.provenance.json").read_text())
    assert len(record["parts"]) == 2 and record["sha256"] == sha256_of(wd / run / "online.csv")
    assert [p["config"]["points"] for p in record["parts"]] == [
        [{"batch": 1, "concurrency": 1}],
        [{"batch": 1, "concurrency": 4}],
    ]
    # each part had a server of its own
    for k in (0, 1):
        assert (wd / f"logs/tft/cpu/onnx/fp32/parts/online.{k}.server.log").stat().st_size > 0
