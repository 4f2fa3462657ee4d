"""The serving-configuration search on real CPU runs (real tritonserver, perf_analyzer and
Snakemake): the smoke run's 2x2 grid over TFT (model instances x max queue delay), a quick walk
in a copy of it (reusing what the grid measured), and what reruns when the search changes."""

import itertools
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from deploybench import config_search
from deploybench.models import load_family
from deploybench.server import TritonServer
from deploybench.triton_client import infer_triton
from deploybench.triton_config import read_config
from tests.conftest import planned_jobs, run_snakemake, smoke_config

pytestmark = pytest.mark.e2e

RUN = Path("results/tft/cpu/onnx/fp32")
BASELINE = "i1-b8-p4.8-q1-t1"  # the smoke sizing's TFT: 1 instance, max batch 8, 1 us, 1 thread
GRID = {BASELINE, "i1-b8-p4.8-q2000-t1", "i2-b8-p4.8-q1-t1", "i2-b8-p4.8-q2000-t1"}
MEASUREMENTS = {"search_repository", "search_online"}


def smoke_search() -> dict:
    return smoke_config()["sizings"]["cpu"]["tft"]["search"]


def overlay(workdir: Path, name: str, search_settings: dict) -> str:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"sizings": {"cpu": {"tft": {"search": search_settings}}}}))
    return str(path)


def copy_run(smoke_run: Path, into: Path) -> Path:
    copy = into / "workdir"
    shutil.copytree(smoke_run, copy, symlinks=True)
    return copy


def scored(workdir: Path, names, budget_ms):
    """Each candidate scored again from its own online.csv, as the choice scores it."""
    return {
        name: config_search.score(
            config_search.parse_variant(name, "cpu"),
            config_search.read_points(workdir / RUN / "search" / name / "online.csv"),
            budget_ms,
            None,
        )
        for name in names
    }


def check_choice(workdir: Path, budget_ms: float) -> pd.DataFrame:
    """search.csv, the chart and best/ agree: the chosen candidate meets the budget and no
    other candidate that meets it is significantly faster; best/ is its repository."""
    table = pd.read_csv(workdir / RUN / "search.csv")
    assert table["baseline"].sum() == 1 and table["chosen"].sum() == 1
    assert table.loc[table["baseline"], "variant"].item() == BASELINE
    chosen = table.loc[table["chosen"], "variant"].item()
    candidates = scored(workdir, table["variant"], budget_ms)
    assert candidates[chosen].feasible and candidates[chosen].p99.mean <= budget_ms
    for name, candidate in candidates.items():
        assert not config_search.beats(candidate, candidates[chosen]), (name, chosen)
    row = table.set_index("variant").loc[chosen]
    assert row["verdict"] == config_search.CHOSEN
    assert row["throughput"] == pytest.approx(candidates[chosen].throughput.mean)

    choice = json.loads((workdir / RUN / "best" / "choice.json").read_text())
    assert choice["variant"] == chosen and choice["baseline"] == BASELINE
    assert choice["latency_budget_ms"] == budget_ms
    assert choice["gain"]["ratio"] == pytest.approx(row["gain"])
    best = workdir / RUN / "best"
    served = read_config(best / "config.pbtxt")
    assert served == read_config(workdir / RUN / "search" / chosen / "repository/tft/config.pbtxt")
    assert (
        served.instance_group[0].count == config_search.parse_variant(chosen, "cpu").model_instances
    )
    assert (best / "repository" / "tft" / "config.pbtxt").read_text() == (
        best / "config.pbtxt"
    ).read_text()

    points = pd.read_csv(workdir / RUN / "search" / "points.csv")
    assert set(points["variant"]) == set(table["variant"])
    frontier = config_search.pareto_frontier(
        list(zip(points["throughput"], points["p99_latency_ms"]))
    )
    assert list(points["frontier"]) == frontier
    for ext in ("svg", "png", "html"):
        assert (workdir / RUN / "search" / f"pareto.{ext}").stat().st_size > 1000
    return table


def test_the_grid_search_chooses_within_the_budget_and_best_serves(smoke_run, tmp_path):
    table = check_choice(smoke_run, smoke_search()["latency_budget_ms"])
    assert set(table["variant"]) == GRID
    # each candidate was served as its name says
    for name in GRID:
        variant = config_search.parse_variant(name, "cpu")
        config = read_config(smoke_run / RUN / "search" / name / "repository/tft/config.pbtxt")
        assert config.instance_group[0].count == variant.model_instances
        assert config.dynamic_batching.max_queue_delay_microseconds == variant.max_queue_delay_us
        assert config.parameters["intra_op_threads"].string_value == "1"
        provenance = json.loads(
            (smoke_run / RUN / "search" / name / "online.provenance.json").read_text()
        )
        assert provenance["config"]["variant"] == name
    # best/ is a repository ready to serve
    best = tmp_path / "best"
    shutil.copytree(smoke_run / RUN / "best" / "repository", best)
    tft = smoke_config()["models"]["tft"]
    family = load_family(tft["module"], tft["hparams"])
    with TritonServer(best, tmp_path / "server.log") as server:
        feeds = family.example_inputs(2, seed=0)
        outputs = infer_triton(server.http_url, "tft", feeds, [s.name for s in family.outputs])
    assert all(v.shape[0] == 2 for v in outputs.values())


def test_a_quick_search_walks_from_the_baseline_reusing_the_grid(smoke_run, tmp_path):
    """strategy quick with a third axis (threads 1, 2): the walk's steps start at the baseline,
    reuse the grid's measurements and measure only candidates the grid lacks."""
    work = copy_run(smoke_run, tmp_path)
    quick = overlay(work, "quick", {"strategy": "quick", "axes": {"intra_op_threads": [1, 2]}})
    result = run_snakemake(work, "search", "--configfile", quick)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    steps = sorted(
        (work / RUN / "search" / "quick").glob("step*.json"), key=lambda p: int(p.stem[4:])
    )
    states = [json.loads(p.read_text()) for p in steps]
    assert states[0]["pending"] == [BASELINE] and not states[0]["done"]
    assert states[-1]["done"] and not any(s["done"] for s in states[:-1])
    measured = states[-1]["measured"]
    assert measured[0] == BASELINE and len(set(measured)) == len(measured)
    # one step at a time: each step's measured are the last one's plus what it asked for
    for before, after in itertools.pairwise(states):
        assert after["measured"] == before["measured"] + before["pending"]
    log = result.stdout + result.stderr
    new = set(measured) - GRID
    assert log.count("rule search_online:") == len(new)
    # the grid lacks the threads axis' value 2: the walk stepped along that axis from where it
    # stood, the baseline or a grid candidate that beat it (which one, the measurements say)
    walked = [config_search.parse_variant(name, "cpu") for name in measured if name not in GRID]
    assert walked and all(variant.intra_op_threads == 2 for variant in walked)
    stepped_from = walked[0].with_value("intra_op_threads", 1).name
    assert stepped_from in measured[: measured.index(walked[0].name)]
    table = check_choice(work, smoke_search()["latency_budget_ms"])
    assert set(table["variant"]) == set(measured)
    choice = json.loads((work / RUN / "best" / "choice.json").read_text())
    assert choice["strategy"] == "quick" and choice["walk"] == states[-1]


def test_a_new_axis_value_runs_only_new_candidates_and_a_budget_only_the_choice(
    smoke_run, tmp_path
):
    work = copy_run(smoke_run, tmp_path)
    wider = overlay(work, "wider", {"axes": {"model_instances": [1, 2, 3]}})
    planned = planned_jobs(run_snakemake(work, "-n", "search", "--configfile", wider))
    # the two candidates with 3 instances (delay 1 and 2000 us), then the choice again
    assert {k: v for k, v in planned.items() if k in MEASUREMENTS} == {
        "search_repository": 2,
        "search_online": 2,
    }, planned
    assert set(planned) == MEASUREMENTS | {
        "search_settings",
        "search_choice",
        "search_plots",
        "search",
    }, planned

    before = {n: (work / RUN / "search" / n / "online.csv").stat().st_mtime_ns for n in GRID}
    tighter = overlay(work, "tighter", {"latency_budget_ms": 60})
    result = run_snakemake(work, "search", "--configfile", tighter)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    ran = {line.split()[-1].rstrip(":") for line in result.stderr.splitlines() if "rule " in line}
    assert not ran & MEASUREMENTS, ran
    assert {"search_settings", "search_choice", "search_plots"} <= ran, ran
    after = {n: (work / RUN / "search" / n / "online.csv").stat().st_mtime_ns for n in GRID}
    assert after == before
    check_choice(work, 60)
