"""The serving-configuration search's logic (deploybench.config_search, plan.plan_search) on constructed
online CSVs and results tables: the choice rule (budget, floor, noise, ties), variant names,
settings, the grid, a candidate's plan, the quick walk, the Pareto frontiers and the energy
objective. No Snakemake, no server: seconds."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from deploybench import config_search
from deploybench.columns import CSV_COLUMNS
from deploybench.config_search import Candidate, SearchSettings, Variant
from deploybench.errors import ConfigError, DeploybenchError, SearchError
from deploybench.planning.config_search_plan import plan_search
from deploybench.planning.run_plan import plan_run
from deploybench.planning.workflow_config import deep_merge
from deploybench.stats import change
from tests.conftest import base_config, smoke_config, validated

CPU = "cpu"
GPU = "A30"
BUDGET = 50.0


def point(
    throughput: float,
    p99: float,
    ci: float | None = 1.0,
    concurrency: int = 1,
    trials: int = 5,
) -> dict[str, Any]:
    """An online CSV row's measured part; ``ci`` None: one trial, no interval."""
    return {
        "batch": 1,
        "concurrency": concurrency,
        "throughput": throughput,
        "throughput_ci95": "" if ci is None else ci,
        "p99_latency_ms": p99,
        "p99_latency_ms_ci95": "" if ci is None else 0.5,
        "stable": ci is not None,
        "trials": 1 if ci is None else trials,
    }


def write_online(root: Path, name: str, rows: Sequence[Mapping[str, Any]]) -> Path:
    """``rows`` as ``root/search/<name>/online.csv``, headed as perf writes it (others empty)."""
    path = root / "search" / name / "online.csv"
    path.parent.mkdir(parents=True)
    lines = [",".join(CSV_COLUMNS)]
    lines += [",".join(str(r.get(c, "")) for c in CSV_COLUMNS) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def scored(
    root: Path,
    csvs: Mapping[str, Sequence[Mapping[str, Any]]],
    budget: float | None = BUDGET,
    floor: float | None = None,
    device: str = CPU,
) -> list[Candidate]:
    """Each CSV written, read back and scored, as the choice job does."""
    out = []
    for name, rows in csvs.items():
        path = write_online(root, name, rows)
        variant = config_search.variant_of_csv(path, device)
        out.append(config_search.score(variant, config_search.read_points(path), budget, floor))
    return out


def pick(
    candidates: Sequence[Candidate], budget: float | None = BUDGET, floor: float | None = None
) -> tuple[str, dict[str, str]]:
    chosen = config_search.choose(candidates, budget, floor)
    return chosen.name, config_search.verdicts(candidates, chosen)


# CPU variants, simplest first along each tie-break: instances, threads, max batch, delay.
SIMPLE = "i1-b16-p8.16-q1-t1"
MORE_THREADS = "i1-b16-p8.16-q1-t2"
BIGGER_BATCH = "i1-b64-p32.64-q1-t1"
LONGER_DELAY = "i1-b16-p8.16-q2000-t1"
TWO_INSTANCES = "i2-b16-p8.16-q1-t1"


# ------------------------------------------------------------------------ the choice: budget


def test_points_over_the_budget_are_ignored_and_the_best_within_it_taken(tmp_path):
    candidates = scored(
        tmp_path,
        {
            # its fastest point is over the budget: scored on the one within it
            SIMPLE: [point(100, 20, concurrency=1), point(400, 80, concurrency=16)],
            # best within the budget: the faster of its two points under 50 ms
            TWO_INSTANCES: [
                point(150, 30, concurrency=1),
                point(180, 49.9, concurrency=4),
                point(900, 50.1, concurrency=16),
            ],
            # no point within the budget at all
            BIGGER_BATCH: [point(1000, 60), point(2000, 120, concurrency=4)],
        },
    )
    by_name = {c.name: c for c in candidates}
    assert by_name[SIMPLE].throughput.mean == 100
    assert by_name[SIMPLE].point is not None and by_name[SIMPLE].point["concurrency"] == 1
    assert by_name[TWO_INSTANCES].throughput.mean == 180
    assert by_name[TWO_INSTANCES].p99.mean == 49.9
    over = by_name[BIGGER_BATCH]
    assert not over.feasible and over.point is None and over.lowest_p99_ms == 60
    chosen, verdict = pick(candidates)
    # the over-budget candidate is 5x faster, and counts for nothing
    assert chosen == TWO_INSTANCES
    assert verdict == {
        TWO_INSTANCES: config_search.CHOSEN,
        SIMPLE: config_search.SLOWER,
        BIGGER_BATCH: config_search.OVER_BUDGET,
    }


def test_a_point_exactly_at_the_budget_meets_it(tmp_path):
    (candidate,) = scored(tmp_path, {SIMPLE: [point(100, BUDGET)]})
    assert candidate.feasible and candidate.throughput.mean == 100


def test_without_a_budget_every_point_counts(tmp_path):
    (candidate,) = scored(tmp_path, {SIMPLE: [point(100, 20), point(400, 800)]}, budget=None)
    assert candidate.feasible and candidate.throughput.mean == 400


def test_no_candidate_within_the_budget_names_the_lowest_p99(tmp_path):
    candidates = scored(
        tmp_path,
        {
            SIMPLE: [point(100, 80), point(50, 61.25)],
            TWO_INSTANCES: [point(300, 75)],
        },
    )
    with pytest.raises(SearchError, match=r"of 2 has .* budget of 50 ms") as raised:
        config_search.choose(candidates, BUDGET, None)
    assert f"lowest p99 measured is 61.25 ms ({SIMPLE})" in str(raised.value)
    assert isinstance(raised.value, DeploybenchError)


def test_an_empty_online_csv_fails_naming_the_candidate():
    with pytest.raises(SearchError, match=f"candidate {SIMPLE}: its online CSV has no points"):
        config_search.score(config_search.parse_variant(SIMPLE, CPU), [], BUDGET, None)


# ------------------------------------------------------------------------ the choice: floor


def test_a_candidate_under_the_floor_is_below_floor(tmp_path):
    csvs = {
        SIMPLE: [point(100, 20), point(500, 90)],  # 500 infer/s only over the budget
        TWO_INSTANCES: [point(150, 30)],
        BIGGER_BATCH: [point(1000, 70)],
    }
    candidates = scored(tmp_path, csvs, floor=120)
    chosen, verdict = pick(candidates, floor=120)
    assert chosen == TWO_INSTANCES
    assert verdict[SIMPLE] == config_search.BELOW_FLOOR
    assert verdict[BIGGER_BATCH] == config_search.OVER_BUDGET


def test_no_candidate_reaching_the_floor_fails_naming_the_most(tmp_path):
    csvs = {SIMPLE: [point(100, 20)], TWO_INSTANCES: [point(150, 30)], BIGGER_BATCH: [point(9, 70)]}
    candidates = scored(tmp_path, csvs, floor=1000)
    with pytest.raises(SearchError, match="min_throughput 1000 infer/s") as raised:
        config_search.choose(candidates, BUDGET, 1000)
    assert f"the most is 150 ({TWO_INSTANCES})" in str(raised.value)


# ------------------------------------------------------------------------ the choice: noise


def test_faster_within_the_intervals_is_a_tie_and_the_simpler_wins(tmp_path):
    # 105 - 100 = 5 < hypot(5, 5) = 7.07: not significant
    csvs = {
        TWO_INSTANCES: [point(105, 20, ci=5)],
        SIMPLE: [point(100, 20, ci=5)],
    }
    chosen, verdict = pick(scored(tmp_path, csvs))
    assert chosen == SIMPLE
    assert verdict == {SIMPLE: config_search.CHOSEN, TWO_INSTANCES: config_search.TIE}


def test_faster_beyond_the_intervals_wins_even_if_more_complex(tmp_path):
    # 108 - 100 = 8 > 7.07
    csvs = {
        SIMPLE: [point(100, 20, ci=5)],
        TWO_INSTANCES: [point(108, 20, ci=5)],
    }
    chosen, verdict = pick(scored(tmp_path, csvs))
    assert chosen == TWO_INSTANCES
    assert verdict == {TWO_INSTANCES: config_search.CHOSEN, SIMPLE: config_search.SLOWER}


@pytest.mark.parametrize(
    ("simpler", "other"),
    [
        # fewer instances beats fewer threads, fewer threads a smaller batch, and so on
        (SIMPLE, TWO_INSTANCES),
        ("i1-b64-p32.64-q2000-t2", "i2-b16-p8.16-q1-t1"),
        ("i1-b64-p32.64-q2000-t1", "i1-b16-p8.16-q1-t2"),
        ("i1-b16-p8.16-q2000-t1", "i1-b64-p32.64-q1-t1"),
        (SIMPLE, LONGER_DELAY),
        (SIMPLE, MORE_THREADS),
        (SIMPLE, BIGGER_BATCH),
    ],
)
def test_ties_go_to_fewer_instances_then_threads_then_max_batch_then_delay(
    tmp_path, simpler, other
):
    # the more complex one is a little faster, within the intervals
    csvs = {other: [point(103, 20, ci=4)], simpler: [point(100, 20, ci=4)]}
    chosen, verdict = pick(scored(tmp_path, csvs))
    assert chosen == simpler
    assert verdict[other] == config_search.TIE


def test_one_trial_rows_never_beat_anything_so_the_simplest_wins(tmp_path):
    csvs = {
        TWO_INSTANCES: [point(1000, 20, ci=None)],
        BIGGER_BATCH: [point(400, 20, ci=None)],
        SIMPLE: [point(100, 20, ci=None)],
    }
    candidates = scored(tmp_path, csvs)
    by_name = {c.name: c for c in candidates}
    assert math.isnan(by_name[TWO_INSTANCES].throughput.half_width)
    assert not config_search.beats(by_name[TWO_INSTANCES], by_name[SIMPLE])
    chosen, verdict = pick(candidates)
    assert chosen == SIMPLE
    assert verdict == {
        SIMPLE: config_search.CHOSEN,
        TWO_INSTANCES: config_search.TIE,
        BIGGER_BATCH: config_search.TIE,
    }


def test_one_trial_against_an_interval_is_not_significant_either(tmp_path):
    csvs = {TWO_INSTANCES: [point(1000, 20, ci=None)], SIMPLE: [point(100, 20, ci=1)]}
    assert pick(scored(tmp_path, csvs))[0] == SIMPLE


def test_meeting_the_constraints_beats_missing_them_whatever_the_noise(tmp_path):
    csvs = {SIMPLE: [point(10, 20, ci=None)], TWO_INSTANCES: [point(1000, 90)]}
    simple, over = scored(tmp_path, csvs)
    assert config_search.beats(simple, over) and not config_search.beats(over, simple)
    assert not config_search.beats(over, over)  # two infeasible ones: neither beats


# ------------------------------------------------------------------------ the invariant


def _random_variant(rng: random.Random) -> Variant:
    top = rng.choice([8, 16, 64])
    return Variant(
        model_instances=rng.choice([1, 2, 4]),
        max_batch_size=top,
        preferred_batch_sizes=(top // 2, top),
        max_queue_delay_us=rng.choice([1, 100, 2000]),
        intra_op_threads=rng.choice([1, 2]),
    )


def _random_rows(rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for concurrency in (1, 4, 16)[: rng.randint(1, 3)]:
        trials = rng.choice([1, 3, 5])
        ci = None if trials == 1 else rng.uniform(0, 30)
        row = point(rng.uniform(50, 200), rng.uniform(10, 90), ci, concurrency, trials)
        rows.append(row)
    return rows


def test_the_chosen_meets_the_budget_and_no_feasible_candidate_beats_it():
    rng = random.Random(16)
    chose = failed = 0
    for _ in range(400):
        variants = {v.name: v for v in (_random_variant(rng) for _ in range(rng.randint(1, 8)))}
        floor = rng.choice([None, None, 60.0])
        candidates = [
            config_search.score(v, _random_rows(rng), BUDGET, floor) for v in variants.values()
        ]
        try:
            chosen = config_search.choose(candidates, BUDGET, floor)
        except SearchError:
            failed += 1
            assert not any(c.feasible for c in candidates)
            continue
        chose += 1
        assert chosen.feasible and chosen.point is not None
        assert float(chosen.point["p99_latency_ms"]) <= BUDGET
        assert floor is None or chosen.throughput.mean >= floor
        assert not any(config_search.beats(c, chosen) for c in candidates)
        # the simplest of those no one beats
        top = [
            c
            for c in candidates
            if c.feasible and not any(config_search.beats(o, c) for o in candidates)
        ]
        assert chosen.variant.simplicity() == min(c.variant.simplicity() for c in top)
        # with the baseline: it stays unless beaten; else an unbeaten candidate that beats it
        base = rng.choice(candidates)
        kept = config_search.choose(candidates, BUDGET, floor, base.name)
        assert not any(config_search.beats(c, kept) for c in candidates)
        unbeaten_beaters = [c for c in top if config_search.beats(c, base)]
        if unbeaten_beaters:
            assert kept in unbeaten_beaters
            assert kept.variant.simplicity() == min(
                c.variant.simplicity() for c in unbeaten_beaters
            )
        else:
            assert kept is base and not any(config_search.beats(c, base) for c in candidates)
        verdict = config_search.verdicts(candidates, chosen)
        for c in candidates:
            if verdict[c.name] == config_search.SLOWER:
                assert any(config_search.beats(o, c) for o in candidates)
            elif verdict[c.name] == config_search.TIE:
                assert c.feasible and not any(config_search.beats(o, c) for o in candidates)
    assert chose > 100 and failed > 10  # both outcomes exercised


# ------------------------------------------------------------------------ variant names


@pytest.mark.parametrize(
    ("variant", "device", "name"),
    [
        (Variant(2, 1024, (512, 1024), 1, None), GPU, "i2-b1024-p512.1024-q1"),
        (Variant(1, 64, (32, 64), 2000, 2), CPU, "i1-b64-p32.64-q2000-t2"),
        (Variant(1, 1, (1,), 0, 0), CPU, "i1-b1-p1-q0-t0"),
        (Variant(3, 8, (2, 4, 8), 100, None), GPU, "i3-b8-p2.4.8-q100"),
    ],
)
def test_variant_names_round_trip(variant, device, name):
    assert variant.name == name
    assert config_search.parse_variant(name, device) == variant
    assert config_search.parse_variant(variant.name, device).name == name


@pytest.mark.parametrize(
    ("name", "device", "message"),
    [
        ("i2-b1024", GPU, "'i2-b1024' is not a variant name; expected i<instances>"),
        ("i2-b1024-p512,1024-q1", GPU, "'i2-b1024-p512,1024-q1' is not a variant name"),
        ("i2-b1024-p512.1024-q1 ", GPU, "is not a variant name"),
        ("../i1-b8-p8-q1", GPU, "is not a variant name"),
        (
            "i1-b8-p4.8-q1-t1",
            GPU,
            "'i1-b8-p4.8-q1-t1': -t<threads> .* a A30 run's variant must not",
        ),
        ("i1-b8-p4.8-q1", CPU, "'i1-b8-p4.8-q1': -t<threads> .* a cpu run's variant must have"),
        ("i1-b8-p4.16-q1", GPU, "preferred batch size 16 exceeds max batch size 8"),
        ("i1-b8-p8.4-q1", GPU, r"preferred batch sizes \[8, 4\] must be ascending"),
        ("i1-b8-p4.4-q1", GPU, r"preferred batch sizes \[4, 4\] must be ascending, unique"),
        ("i1-b8-p0.8-q1", GPU, r"\[0, 8\] must be ascending, unique and >= 1"),
        ("i0-b8-p4.8-q1", GPU, "'i0-b8-p4.8-q1': a variant needs at least one instance"),
    ],
)
def test_bad_variant_names_fail_naming_the_value(name, device, message):
    with pytest.raises(ConfigError, match=message):
        config_search.parse_variant(name, device)


def test_variant_of_csv_reads_the_folder_name(tmp_path):
    path = tmp_path / "search" / SIMPLE / "online.csv"
    assert config_search.variant_of_csv(path, CPU).name == SIMPLE
    with pytest.raises(ConfigError, match="'online' is not a variant name"):
        config_search.variant_of_csv(tmp_path / "online" / "online.csv", CPU)


# ------------------------------------------------------------------------ settings


GPU_BASELINE = Variant(2, 1024, (512, 1024), 1, None)
CPU_BASELINE = Variant(1, 64, (32, 64), 1, 1)


def settings(axes: Mapping[str, Any], baseline: Variant = GPU_BASELINE, **more: Any):
    device = GPU if baseline.intra_op_threads is None else CPU
    given = {"strategy": "quick", "latency_budget_ms": BUDGET, "max_candidates": 50, **more}
    return config_search.search_settings(
        {**given, "axes": axes}, baseline, device, "models.tft.search"
    )


def test_the_baselines_value_is_always_on_each_axis():
    resolved = settings(
        {"max_queue_delay_us": [1000, 100], "model_instances": [4, 1], "max_batch_size": [256]}
    )
    assert list(resolved.axes) == ["model_instances", "max_batch_size", "max_queue_delay_us"]
    assert resolved.axes["model_instances"] == (1, 2, 4)
    assert resolved.axes["max_queue_delay_us"] == (1, 100, 1000)
    # an int max batch m means preferred m/2, m (the baseline's own pairing kept)
    assert resolved.axes["max_batch_size"] == ((256, (128, 256)), (1024, (512, 1024)))
    # an axis not given is not searched: held at the baseline's value
    assert "intra_op_threads" not in resolved.axes
    # the baseline's value given again is no second value
    assert settings({"model_instances": [2, 2]}).axes["model_instances"] == (2,)


def test_a_max_batch_value_may_spell_its_preferred_sizes_and_one_means_one():
    given = [1, {"max_batch_size": 32, "preferred_batch_sizes": [8, 16, 32]}]
    resolved = settings({"max_batch_size": given})
    assert resolved.axes["max_batch_size"] == (
        (1, (1,)),
        (32, (8, 16, 32)),
        (1024, (512, 1024)),
    )
    bad = [{"max_batch_size": 8, "preferred_batch_sizes": [16]}]
    with pytest.raises(ConfigError, match="max_batch_size: preferred batch size 16 exceeds"):
        settings({"max_batch_size": bad})


def test_runtime_threads_are_a_cpu_axis_only():
    on_cpu = settings({"intra_op_threads": [2]}, CPU_BASELINE)
    assert on_cpu.axes["intra_op_threads"] == (1, 2)
    with pytest.raises(ConfigError, match=r"search.axes.intra_op_threads: .* a A30 run's native"):
        settings({"intra_op_threads": [2]})


def test_unknown_strategy_and_axis_fail_naming_the_choices():
    with pytest.raises(ConfigError, match="unknown strategy 'random'; valid choices: grid, quick"):
        settings({}, strategy="random")
    with pytest.raises(ConfigError, match="unknown axis 'threads'; valid choices: model_instances"):
        settings({"threads": [1]})


def test_settings_survive_a_jobs_json_spec():
    resolved = settings(
        {"model_instances": [1], "max_batch_size": [256], "intra_op_threads": [2]},
        CPU_BASELINE,
        min_throughput=10,
    )
    spec = json.loads(json.dumps(config_search.settings_spec(resolved)))
    assert config_search.settings_from_spec(spec) == resolved


# ------------------------------------------------------------------------ the grid


def test_the_grid_is_every_combination_baseline_first():
    resolved = settings(
        {"model_instances": [1, 4], "max_batch_size": [256], "max_queue_delay_us": [100]}
    )
    grid = resolved.grid(GPU_BASELINE)
    assert grid[0] == GPU_BASELINE
    assert len(grid) == len(set(grid)) == 3 * 2 * 2
    names = {v.name for v in grid}
    for instances, (top, preferred), delay in itertools.product(*resolved.axes.values()):
        assert Variant(instances, top, preferred, delay, None).name in names
    # no axis searched: the baseline alone
    assert settings({}).grid(GPU_BASELINE) == [GPU_BASELINE]


def _search_config(overrides: Mapping[str, Any], smoke: bool = False) -> dict[str, Any]:
    return validated(deep_merge(smoke_config() if smoke else base_config(), dict(overrides)))


def test_plan_search_on_the_shipped_configs():
    smoke = plan_search(validated(smoke_config()), "tft", "cpu", "onnx", "fp32")
    assert smoke.settings.strategy == "grid"
    assert smoke.spec()["candidates"] == [v.name for v in smoke.grid()]
    assert smoke.spec()["candidates"][0] == smoke.baseline.name
    assert len(smoke.grid()) == 4
    gpu = plan_search(validated(base_config()), "tft", GPU, "trt", "fp16")
    assert gpu.baseline.name == "i2-b1024-p512.1024-q1"
    assert gpu.max_engine_batch == 1024
    # the cpu sizing's quick search spans 2*2*2*3 = 24 combinations, more than its cap of 10
    cpu = plan_search(validated(base_config()), "tft", "cpu", "onnx", "fp32")
    assert cpu.settings.strategy == "quick" and cpu.spec()["candidates"] == []
    with pytest.raises(
        ConfigError, match=r"grid has 24 candidates, more than .*max_candidates \(6\)"
    ):
        cpu.grid()


def test_a_grid_over_the_cap_fails_when_planned():
    config = _search_config(
        {"sizings": {"cpu": {"tft": {"search": {"strategy": "grid", "max_candidates": 8}}}}}
    )
    with pytest.raises(ConfigError, match=r"tft/cpu/onnx/fp32: the search grid has 24 .* \(8\)"):
        plan_search(config, "tft", "cpu", "onnx", "fp32")


def test_a_max_batch_above_the_engines_fails():
    config = _search_config(
        {"models": {"tft": {"search": {"axes": {"max_batch_size": [512, 2048]}}}}}
    )
    with pytest.raises(ConfigError, match=r"'i2-b2048-p2048-q1' batches up to 2048, .*\(1024, "):
        plan_search(config, "tft", GPU, "trt", "fp16")
    plan = plan_search(validated(base_config()), "tft", GPU, "trt", "fp16")
    with pytest.raises(ConfigError, match="convert.tensorrt.max_batch"):
        plan.variant("i1-b2048-p1024.2048-q1")
    assert plan.variant("i1-b512-p256.512-q100").max_batch_size == 512


# ------------------------------------------------------------------------ a candidate's plan


def test_a_variants_plan_serves_its_settings_over_the_search_sweep():
    config = validated(base_config())
    before = plan_run(config, "tft", GPU, "trt", "fp16")
    plan = plan_search(config, "tft", GPU, "trt", "fp16")
    name = "i4-b512-p256.512-q100"
    variant = plan.variant_plan(name)
    repository = variant.spec("repository")
    assert repository["triton"] == {
        **before.spec("repository")["triton"],
        "model_instances": 4,
        "max_batch_size": 512,
        "preferred_batch_sizes": [256, 512],
        "max_queue_delay_us": 100,
    }
    online = variant.spec("online")
    sweep = [{"batch": 16, "concurrency": c} for c in (8, 16, 32, 64, 128)]
    assert online["points"] == sweep != before.spec("online")["points"]
    assert online["run"]["variant"] == name
    assert online["run"]["model_instances"] == 4 and online["run"]["max_batch_size"] == 512
    assert variant.points["offline"] == ()
    # the run's own plan and specs are untouched, and carry no variant
    assert plan.run == before
    for step in ("repository", "online", "offline"):
        assert plan.run.spec(step) == before.spec(step)
    assert "variant" not in before.spec("online")["run"]


def test_a_cpu_variants_plan_carries_its_threads():
    plan = plan_search(validated(smoke_config()), "tft", "cpu", "onnx", "fp32")
    variant = plan.variant_plan("i2-b8-p4.8-q2000-t2")
    assert variant.spec("repository")["triton"]["intra_op_threads"] == 2
    assert variant.spec("online")["points"] == [{"batch": 1, "concurrency": 2}]
    with pytest.raises(ConfigError, match="a cpu run's variant must have it"):
        plan.variant_plan("i2-b8-p4.8-q2000")


def test_the_search_adds_nothing_to_the_runs_params():
    config = validated(base_config())
    without = deep_merge(base_config(), {})
    del without["models"]["tft"]["search"]
    del without["sizings"]["cpu"]["tft"]["search"]
    validated(without)
    for path in ("tft/cpu/onnx/fp32", f"tft/{GPU}/trt/fp16"):
        ours, theirs = plan_run(config, *path.split("/")), plan_run(without, *path.split("/"))
        for step in ("repository", "online", "offline", "accuracy"):
            assert ours.spec(step) == theirs.spec(step), (path, step)


# ------------------------------------------------------------------------ the quick walk


WALK_BASELINE = Variant(2, 1024, (512, 1024), 1, None)


def walk_settings(max_candidates: int = 20) -> SearchSettings:
    return settings(
        {"model_instances": [1, 4, 8], "max_queue_delay_us": [100, 1000]},
        max_candidates=max_candidates,
    )


def measure(variant: Variant, throughput: Callable[[Variant], float]) -> Candidate:
    return config_search.score(variant, [point(throughput(variant), 20, ci=2)], BUDGET, None)


def walk(
    resolved: SearchSettings, throughput: Callable[[Variant], float]
) -> tuple[list[list[str]], config_search.WalkState]:
    """Run the walk to its end as the workflow's steps do: measure what it asks, replay."""
    results: dict[str, Candidate] = {}
    asked: list[list[str]] = []
    for _ in range(50):
        state = config_search.quick_walk(resolved, WALK_BASELINE, results)
        if state.done:
            return asked, state
        asked.append(list(state.pending))
        for name in state.pending:
            results[name] = measure(config_search.parse_variant(name, GPU), throughput)
    raise AssertionError("the walk did not end")


def test_the_walk_starts_with_the_baseline_then_its_neighbours():
    resolved = walk_settings()
    first = config_search.quick_walk(resolved, WALK_BASELINE, {})
    assert first.pending == (WALK_BASELINE.name,) and not first.done
    assert first.position == WALK_BASELINE.name
    results = {WALK_BASELINE.name: measure(WALK_BASELINE, lambda v: 100)}
    second = config_search.quick_walk(resolved, WALK_BASELINE, results)
    assert second.pending == ("i1-b1024-p512.1024-q1", "i4-b1024-p512.1024-q1")
    assert second.reason == "neighbours along model_instances"
    assert second.measured == (WALK_BASELINE.name,)


def test_the_walk_follows_an_axis_while_it_improves_then_the_next():
    # more instances help up to 4; a queue delay of 100 us helps at 4 instances
    def throughput(v: Variant) -> float:
        gain = {1: 80, 2: 100, 4: 150, 8: 140}[v.model_instances]
        return gain + (30 if v.max_queue_delay_us == 100 else 0)

    asked, state = walk(walk_settings(), throughput)
    assert asked == [
        ["i2-b1024-p512.1024-q1"],
        ["i1-b1024-p512.1024-q1", "i4-b1024-p512.1024-q1"],
        ["i8-b1024-p512.1024-q1"],  # moved to 4 instances: on along the same axis
        ["i4-b1024-p512.1024-q100"],  # 8 is no better: the next axis from 4
        ["i4-b1024-p512.1024-q1000"],  # moved to 100 us: on along it
        # a second pass: 100 us's neighbours along the instances
        ["i2-b1024-p512.1024-q100", "i8-b1024-p512.1024-q100"],
    ]
    assert state.done and state.pending == ()
    assert state.position == "i4-b1024-p512.1024-q100"
    assert state.reason == "no neighbour of the position beats it"


def test_the_walk_does_not_move_within_the_noise():
    # every neighbour is within the intervals (hypot(2, 2) = 2.8) of the baseline
    asked, state = walk(walk_settings(), lambda v: 100 + v.model_instances % 3)
    assert state.position == WALK_BASELINE.name and state.done
    assert asked[-1] == ["i2-b1024-p512.1024-q100"]


def test_the_walk_moves_to_the_better_of_two_improving_neighbours():
    # both neighbours beat the baseline; 4 instances serve more
    asked, state = walk(
        walk_settings(), lambda v: {1: 120, 2: 100, 4: 200, 8: 90}[v.model_instances]
    )
    assert asked[1] == ["i1-b1024-p512.1024-q1", "i4-b1024-p512.1024-q1"]
    assert state.position == "i4-b1024-p512.1024-q1"


def test_the_walk_stops_at_max_candidates():
    def throughput(v: Variant) -> float:
        return 100.0 * v.model_instances

    # the baseline and one of its two neighbours: the second one is cut
    asked, state = walk(walk_settings(max_candidates=2), throughput)
    assert asked == [["i2-b1024-p512.1024-q1"], ["i1-b1024-p512.1024-q1"]]
    assert state.done and state.pending == ()
    assert state.reason == "max_candidates (2) reached"
    # the cap counts every candidate measured
    asked, state = walk(walk_settings(max_candidates=4), throughput)
    assert sum(len(a) for a in asked) == 4 and state.done
    assert asked[-1] == ["i8-b1024-p512.1024-q1"]
    # it moved there, and its next neighbour (along the delay) would be a fifth
    assert state.position == "i8-b1024-p512.1024-q1"
    assert state.reason == "max_candidates (4) reached"


def test_at_the_cap_the_walk_still_moves_to_a_measured_neighbour_that_beats_it():
    # the baseline and 1 instance fill the cap; 1 instance is significantly faster
    asked, state = walk(walk_settings(max_candidates=2), lambda v: 300.0 / v.model_instances)
    assert asked == [["i2-b1024-p512.1024-q1"], ["i1-b1024-p512.1024-q1"]]
    assert state.done and state.reason == "max_candidates (2) reached"
    assert state.position == "i1-b1024-p512.1024-q1"


def test_the_walk_replays_the_same_from_the_same_results():
    resolved = walk_settings()

    def throughput(v: Variant) -> float:
        return {1: 80, 2: 100, 4: 150, 8: 140}[v.model_instances] + v.max_queue_delay_us / 100

    _, end = walk(resolved, throughput)
    results = {
        name: measure(config_search.parse_variant(name, GPU), throughput) for name in end.measured
    }
    again = config_search.quick_walk(resolved, WALK_BASELINE, results)
    assert again == end
    shuffled = dict(sorted(results.items(), reverse=True))
    replayed = config_search.quick_walk(resolved, WALK_BASELINE, shuffled)
    assert (replayed.pending, replayed.position, replayed.done, replayed.reason) == (
        end.pending,
        end.position,
        end.done,
        end.reason,
    )
    assert json.loads(json.dumps(end.as_dict()))["position"] == end.position


def test_an_over_budget_baseline_walks_to_a_neighbour_meeting_the_budget():
    resolved = walk_settings()
    results = {
        WALK_BASELINE.name: config_search.score(WALK_BASELINE, [point(500, 90)], BUDGET, None),
        "i1-b1024-p512.1024-q1": config_search.score(
            config_search.parse_variant("i1-b1024-p512.1024-q1", GPU), [point(50, 20)], BUDGET, None
        ),
        "i4-b1024-p512.1024-q1": config_search.score(
            config_search.parse_variant("i4-b1024-p512.1024-q1", GPU),
            [point(900, 95)],
            BUDGET,
            None,
        ),
    }
    state = config_search.quick_walk(resolved, WALK_BASELINE, results)
    assert state.position == "i1-b1024-p512.1024-q1"
    assert state.pending == ("i1-b1024-p512.1024-q100",)


# ------------------------------------------------------------------------ the frontier


def test_pareto_frontier():
    points = [
        (100.0, 10.0),  # on it
        (200.0, 20.0),  # on it
        (150.0, 30.0),  # (200, 20) serves more sooner
        (200.0, 25.0),  # as much as (200, 20), later
        (50.0, 5.0),  # the quickest
        (100.0, 10.0),  # a duplicate dominates nothing: both stay
        (90.0, 10.0),  # as quick as (100, 10), less
    ]
    assert config_search.pareto_frontier(points) == [True, True, False, False, True, True, False]
    assert config_search.pareto_frontier([]) == []


# ------------------------------------------------------------------------ the tables


def test_search_csv_rows_give_each_candidates_verdict_and_gain_over_the_baseline(tmp_path):
    csvs = {
        SIMPLE: [point(100, 20, ci=2), point(300, 80, ci=2, concurrency=16)],
        TWO_INSTANCES: [point(150, 30, ci=3, concurrency=4)],
        BIGGER_BATCH: [point(1000, 60)],
    }
    candidates = scored(tmp_path, csvs)
    baseline, chosen, over = candidates
    run = {"model": "tft", "gpu": CPU, "format": "onnx", "precision": "fp32", "path": "p"}
    rows = {
        r["variant"]: r for r in config_search.candidate_rows(candidates, chosen, baseline, run)
    }
    assert all(set(r) == set(config_search.SEARCH_COLUMNS) for r in rows.values())
    best = rows[TWO_INSTANCES]
    assert (best["chosen"], best["baseline"], best["verdict"]) == (
        True,
        False,
        config_search.CHOSEN,
    )
    assert (best["concurrency"], best["throughput"], best["p99_latency_ms"]) == (4, 150, 30)
    assert best["model_instances"] == 2 and best["preferred_batch_sizes"] == "8 16"
    assert best["gain"] == pytest.approx(1.5) and best["gain_ci95"] > 0
    assert rows[SIMPLE]["baseline"] and rows[SIMPLE]["gain"] == pytest.approx(1.0)
    # over the budget: no point, its cells empty
    assert rows[BIGGER_BATCH]["verdict"] == config_search.OVER_BUDGET
    assert rows[BIGGER_BATCH]["throughput"] is None and rows[BIGGER_BATCH]["gain"] is None
    record = config_search.choice_record(settings({}, CPU_BASELINE), chosen, baseline, run, 3)
    assert record["variant"] == TWO_INSTANCES and record["gain"]["significant"] is True
    assert not over.feasible


def test_point_rows_mark_the_budget_and_the_frontier():
    measured = {
        SIMPLE: [point(100, 20), point(300, 80, concurrency=16)],
        TWO_INSTANCES: [point(90, 25)],
    }
    rows = config_search.point_rows(measured, TWO_INSTANCES, SIMPLE, BUDGET)
    assert all(set(r) == set(config_search.POINT_COLUMNS) for r in rows)
    assert [r["in_budget"] for r in rows] == [True, False, True]
    assert [r["frontier"] for r in rows] == [True, True, False]
    assert [(r["baseline"], r["chosen"]) for r in rows] == [(True, False)] * 2 + [(False, True)]


def test_the_baseline_stays_unless_a_candidate_beats_it(tmp_path):
    """As measured on this machine (TFT, cpu sizing): i2-b16 ties the fastest but cannot be
    shown faster than the baseline; i2-b64 can: it is chosen, with a significant gain."""
    base, fast, tied = "i1-b64-p32.64-q1-t0", "i2-b64-p32.64-q1-t0", "i2-b16-p8.16-q1-t0"
    candidates = scored(
        tmp_path,
        {
            base: [point(237.3, 28.1, 29.5, 4, 5)],
            fast: [point(289.4, 25.7, 13.6, 4, 5)],
            tied: [point(262.6, 29.3, 32.5, 4, 5)],
        },
    )
    assert config_search.choose(candidates, BUDGET, None).name == tied  # simplest unbeaten
    chosen = config_search.choose(candidates, BUDGET, None, base)
    assert chosen.name == fast
    baseline = next(c for c in candidates if c.name == base)
    assert change(baseline.throughput, chosen.throughput).significant
    # nothing beats the baseline: it stays, although a simpler candidate ties it
    simpler = "i1-b16-p8.16-q1-t0"
    level = scored(
        tmp_path / "level",
        {base: [point(237.3, 28.1, 29.5, 4, 5)], simpler: [point(240.0, 28.0, 30.0, 4, 5)]},
    )
    assert config_search.choose(level, BUDGET, None, base).name == base


# ------------------------------------------------------------------------ the energy objective

NVML_MISSING = "not measured: NVML: libnvidia-ml.so.1 not found"


def joules(
    throughput: float,
    p99: float,
    energy: float | None,
    energy_ci: float | None = 0.01,
    concurrency: int = 1,
    status: str | None = None,
) -> dict[str, Any]:
    """An online CSV row with its energy per inference (None: not measured, ``status`` why)."""
    measured_energy = energy is not None
    return point(throughput, p99, concurrency=concurrency) | {
        "energy_per_inference_j": "" if energy is None else energy,
        "energy_per_inference_j_ci95": "" if energy is None or energy_ci is None else energy_ci,
        "energy_status": status or ("nvml" if measured_energy else NVML_MISSING),
    }


def by_energy(
    root: Path,
    csvs: Mapping[str, Sequence[Mapping[str, Any]]],
    budget: float | None = BUDGET,
    floor: float | None = None,
) -> list[Candidate]:
    """Each CSV written, read back and scored for the least energy, as the choice job does."""
    out = []
    for name, rows in csvs.items():
        path = write_online(root, name, rows)
        variant = config_search.variant_of_csv(path, CPU)
        out.append(
            config_search.score(
                variant, config_search.read_points(path), budget, floor, config_search.ENERGY
            )
        )
    return out


def test_the_energy_objective_picks_the_least_energy_within_the_budget(tmp_path):
    candidates = by_energy(
        tmp_path,
        {
            # its thriftiest point is over the budget: scored on the least within it
            SIMPLE: [joules(100, 20, 0.50), joules(400, 80, 0.10, concurrency=16)],
            # the least energy within the budget, though not its fastest point
            TWO_INSTANCES: [
                joules(150, 30, 0.20, concurrency=1),
                joules(180, 45, 0.25, concurrency=4),
            ],
            # the fastest within the budget, but costlier per inference
            BIGGER_BATCH: [joules(300, 40, 0.40)],
            # over the budget: its energy counts for nothing
            LONGER_DELAY: [joules(900, 70, 0.01)],
        },
    )
    by_name = {c.name: c for c in candidates}
    assert by_name[SIMPLE].energy.mean == 0.50 and by_name[SIMPLE].throughput.mean == 100
    best = by_name[TWO_INSTANCES]
    assert best.energy.mean == 0.20 and best.point is not None and best.point["concurrency"] == 1
    assert best.value == best.energy and best.objective == config_search.ENERGY
    chosen, verdict = pick(candidates)
    assert chosen == TWO_INSTANCES
    assert verdict == {
        TWO_INSTANCES: config_search.CHOSEN,
        SIMPLE: config_search.MORE_ENERGY,
        BIGGER_BATCH: config_search.MORE_ENERGY,
        LONGER_DELAY: config_search.OVER_BUDGET,
    }
    # against the baseline, the choice stands only if it beats it
    assert config_search.choose(candidates, BUDGET, None, SIMPLE).name == TWO_INSTANCES


def test_less_energy_within_the_intervals_is_a_tie_and_the_simpler_wins(tmp_path):
    # 0.50 - 0.45 = 0.05 < hypot(0.04, 0.04) = 0.057: not significant
    csvs = {
        TWO_INSTANCES: [joules(200, 20, 0.45, 0.04)],
        SIMPLE: [joules(100, 20, 0.50, 0.04)],
    }
    chosen, verdict = pick(by_energy(tmp_path, csvs))
    assert chosen == SIMPLE
    assert verdict == {SIMPLE: config_search.CHOSEN, TWO_INSTANCES: config_search.TIE}
    # beyond them (0.06 > 0.057) the more complex one wins, however much slower
    csvs = {SIMPLE: [joules(300, 20, 0.50, 0.04)], TWO_INSTANCES: [joules(100, 20, 0.44, 0.04)]}
    chosen, verdict = pick(by_energy(tmp_path / "apart", csvs))
    assert chosen == TWO_INSTANCES
    assert verdict == {TWO_INSTANCES: config_search.CHOSEN, SIMPLE: config_search.MORE_ENERGY}


def test_one_trial_energy_never_beats_anything(tmp_path):
    csvs = {
        TWO_INSTANCES: [joules(100, 20, 0.1, None) | {"trials": 1, "throughput_ci95": ""}],
        SIMPLE: [joules(100, 20, 0.9, None) | {"trials": 1, "throughput_ci95": ""}],
    }
    assert pick(by_energy(tmp_path, csvs))[0] == SIMPLE


def test_the_energy_objective_keeps_the_floor_and_the_budget(tmp_path):
    csvs = {
        # its thriftiest point within the budget is under the floor: the next one counts
        SIMPLE: [joules(50, 10, 0.1), joules(150, 20, 0.3, concurrency=4)],
        # within the budget but never at the floor
        TWO_INSTANCES: [joules(90, 20, 0.05)],
    }
    candidates = {c.name: c for c in by_energy(tmp_path, csvs, floor=100)}
    assert candidates[SIMPLE].feasible and candidates[SIMPLE].energy.mean == 0.3
    below = candidates[TWO_INSTANCES]
    assert not below.feasible and below.verdict_if_infeasible == config_search.BELOW_FLOOR
    assert config_search.beats(candidates[SIMPLE], below)
    assert config_search.choose(list(candidates.values()), BUDGET, 100).name == SIMPLE


def test_no_energy_measured_fails_naming_the_candidate_and_why(tmp_path):
    csvs = {SIMPLE: [joules(100, 20, 0.5)], TWO_INSTANCES: [joules(150, 30, None)]}
    with pytest.raises(SearchError) as raised:
        by_energy(tmp_path, csvs)
    message = str(raised.value)
    assert f"candidate {TWO_INSTANCES} cannot be scored" in message
    assert "concurrency 1" in message and "no energy_per_inference_j" in message
    assert f"energy_status: {NVML_MISSING}" in message
    assert "search.objective: throughput" in message
    # a perf CSV from before energy was measured: no such columns at all
    old = [point(100, 20)]
    with pytest.raises(SearchError, match="no energy_status: a perf CSV from before energy"):
        config_search.score(
            config_search.parse_variant(SIMPLE, CPU), old, BUDGET, None, config_search.ENERGY
        )
    # a point over the budget needs none: it is not compared
    (over,) = by_energy(tmp_path / "over", {SIMPLE: [joules(100, 20, 0.5), joules(9, 90, None)]})
    assert over.feasible and over.energy.mean == 0.5
    # the throughput objective reads the same CSV without energy
    (fast,) = scored(tmp_path / "throughput", {SIMPLE: [joules(150, 30, None)]})
    assert fast.feasible and math.isnan(fast.energy.mean)


def test_candidates_scored_by_different_objectives_do_not_compare(tmp_path):
    (energy,) = by_energy(tmp_path / "e", {SIMPLE: [joules(100, 20, 0.5)]})
    (throughput,) = scored(tmp_path / "t", {SIMPLE: [joules(100, 20, 0.5)]})
    with pytest.raises(ValueError, match="different objectives"):
        config_search.beats(energy, throughput)
    with pytest.raises(ValueError, match="objective 'watts'; valid choices: throughput, energy"):
        config_search.score(energy.variant, [joules(100, 20, 0.5)], BUDGET, None, "watts")


def test_the_walk_follows_less_energy_under_the_energy_objective():
    # energy falls with instances up to 4; throughput rises all the way (unused)
    def measure_energy(variant: Variant) -> Candidate:
        energy = {1: 0.9, 2: 0.6, 4: 0.3, 8: 0.31}[variant.model_instances]
        row = joules(100 * variant.model_instances, 20, energy, 0.01)
        return config_search.score(variant, [row], BUDGET, None, config_search.ENERGY)

    resolved = walk_settings()
    results: dict[str, Candidate] = {}
    for _ in range(50):
        state = config_search.quick_walk(resolved, WALK_BASELINE, results)
        if state.done:
            break
        results |= {n: measure_energy(config_search.parse_variant(n, GPU)) for n in state.pending}
    assert state.done and state.position == "i4-b1024-p512.1024-q1"


def test_the_objective_setting_is_checked_and_survives_a_jobs_json_spec():
    assert settings({}).objective == config_search.THROUGHPUT
    resolved = settings({"model_instances": [1]}, objective="energy")
    assert resolved.objective == config_search.ENERGY
    spec = json.loads(json.dumps(config_search.settings_spec(resolved)))
    assert config_search.settings_from_spec(spec) == resolved
    # a settings.json written before the objective was a setting
    del spec["objective"]
    assert config_search.settings_from_spec(spec).objective == config_search.THROUGHPUT
    with pytest.raises(ConfigError, match="search.objective: unknown objective 'power'; valid"):
        settings({}, objective="power")


def _energy_search_config(meter: str) -> dict[str, Any]:
    """The shipped config (validated) searching TFT on CPU for the least energy, its CPU meter
    ``meter``. (The objective is set after validation: the schema is checked on its own.)"""
    config = validated(base_config())
    config["models"]["tft"]["search"]["objective"] = "energy"
    config["sizings"]["cpu"]["tft"]["search"]["objective"] = "energy"
    config["energy"]["meter"]["cpu"] = meter
    return config


def test_an_energy_search_of_a_run_without_a_meter_fails_when_planned():
    planned = plan_search(_energy_search_config("rapl"), "tft", "cpu", "onnx", "fp32")
    assert planned.settings.objective == config_search.ENERGY
    assert planned.spec()["settings"]["objective"] == config_search.ENERGY
    with pytest.raises(ConfigError, match=r"tft/cpu/onnx/fp32: search.objective energy needs"):
        plan_search(_energy_search_config("none"), "tft", "cpu", "onnx", "fp32")


def test_the_energy_front_marks_more_throughput_for_less_energy():
    nan = math.nan
    points = [
        (100.0, 0.5),  # on it
        (200.0, 0.4),  # on it: more for less
        (150.0, 0.45),  # (200, 0.4) dominates
        (300.0, 0.6),  # on it: the most throughput
        (300.0, nan),  # not measured: on none, and hides nothing
        (nan, 0.1),
    ]
    assert config_search.pareto_frontier(points) == [False, True, False, True, False, False]


def test_point_rows_mark_the_energy_front_and_leave_it_empty_without_energy(tmp_path):
    measured = {
        SIMPLE: [joules(100, 20, 0.30), joules(300, 80, 0.50, concurrency=16)],
        TWO_INSTANCES: [joules(90, 25, 0.35), joules(120, 30, None, concurrency=4)],
        BIGGER_BATCH: [joules(200, 40, 0.20, concurrency=4)],
    }
    # as the choice job reads them back from the online CSVs
    measured = {
        name: config_search.read_points(write_online(tmp_path, name, rows))
        for name, rows in measured.items()
    }
    rows = config_search.point_rows(measured, BIGGER_BATCH, SIMPLE, BUDGET)
    assert all(set(r) == set(config_search.POINT_COLUMNS) for r in rows)
    assert [r["energy_frontier"] for r in rows] == [False, True, False, None, True]
    assert [r["frontier"] for r in rows] == [True, True, False, True, True]
    assert [r["energy_per_inference_j"] for r in rows] == [0.30, 0.50, 0.35, None, 0.20]
    assert rows[3]["energy_status"] == NVML_MISSING and rows[0]["energy_status"] == "nvml"
    assert rows[3]["energy_per_inference_j_ci95"] is None


def test_the_choice_records_the_objective_and_the_energy_gain(tmp_path):
    csvs = {
        SIMPLE: [joules(100, 20, 0.50, 0.02)],
        TWO_INSTANCES: [joules(150, 30, 0.25, 0.01, concurrency=4)],
        BIGGER_BATCH: [joules(1000, 60, 0.01)],
    }
    candidates = by_energy(tmp_path, csvs)
    baseline = candidates[0]
    chosen = config_search.choose(candidates, BUDGET, None, baseline.name)
    run = {"model": "tft", "gpu": CPU, "format": "onnx", "precision": "fp32", "path": "p"}
    rows = {
        r["variant"]: r for r in config_search.candidate_rows(candidates, chosen, baseline, run)
    }
    assert all(set(r) == set(config_search.SEARCH_COLUMNS) for r in rows.values())
    best = rows[TWO_INSTANCES]
    assert best["verdict"] == config_search.CHOSEN and best["energy_per_inference_j"] == 0.25
    assert best["energy_per_inference_j_ci95"] == 0.01 and best["energy_status"] == "nvml"
    # the gain is the objective's: twice the inferences per joule of the baseline
    assert best["gain"] == pytest.approx(2.0) and best["gain_ci95"] > 0
    assert rows[BIGGER_BATCH]["energy_per_inference_j"] is None  # over the budget
    resolved = settings({}, CPU_BASELINE, objective="energy")
    record = config_search.choice_record(resolved, chosen, baseline, run, 3)
    assert record["objective"] == config_search.ENERGY
    assert record["energy_per_inference_j"] == {"mean": 0.25, "ci95": 0.01}
    assert record["gain"]["of"] == "inferences per joule"
    assert record["gain"]["ratio"] == pytest.approx(2.0) and record["gain"]["significant"]
    # the throughput objective's record says so, its energy empty where not measured
    (fast,) = scored(tmp_path / "t", {SIMPLE: [point(100, 20)]})
    record = config_search.choice_record(settings({}, CPU_BASELINE), fast, fast, run, 1)
    assert record["objective"] == config_search.THROUGHPUT and record["gain"]["of"] == "throughput"
    assert record["energy_per_inference_j"] == {"mean": None, "ci95": None}
