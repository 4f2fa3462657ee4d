"""A run's serving-configuration search: its settings, baseline and sweep, and each candidate as a
run plan of its own (:mod:`deploybench.config_search` holds the search's logic)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..config_search import (
    ENERGY,
    SearchSettings,
    Variant,
    baseline_of,
    parse_variant,
    search_settings,
    settings_spec,
)
from ..errors import ConfigError
from .engines import SHARED as SHARED_ENGINES
from .job_specs import SearchSpec, frozen, plain
from .resources import runtime_minutes
from .run_plan import RunPlan, plan_run
from .schedule import check_fits
from .workflow_config import resolve


@dataclass(frozen=True)
class SearchPlan:
    """A run's serving-configuration search (`models.<m>.search`, sized): its settings, its
    baseline (the run's own `triton` settings) and the online sweep every candidate is measured
    over. A candidate is the run served another way: the same artifact, its own repository and
    online measurement (:meth:`variant_plan`)."""

    run: RunPlan
    settings: SearchSettings
    baseline: Variant
    sweep: tuple[Mapping[str, int], ...]  # the candidates' online points
    candidate_runtime: Mapping[str, int]  # repository, online -> minutes on a cluster
    max_engine_batch: int | None  # a TensorRT / TF-TRT engine's max batch (None: any)

    def variant(self, name: str) -> Variant:
        """The candidate a variant name spells, if this run can serve it."""
        variant = parse_variant(name, self.run.device)
        if self.max_engine_batch is not None and variant.max_batch_size > self.max_engine_batch:
            converter = self.run.conversion.converter if self.run.conversion else "?"
            raise ConfigError(
                f"{self.run.path}: variant {name!r} batches up to {variant.max_batch_size}, more "
                f"than the run's engine takes ({self.max_engine_batch}, models.{self.run.model}"
                f".convert.{converter}.max_batch): a search serves the run's one artifact"
            )
        return variant

    def variant_plan(self, name: str) -> RunPlan:
        """The run served as variant ``name``: its Triton settings, online over the sweep."""
        variant = self.variant(name)
        triton = {**plain(self.run.triton), **variant.triton()}
        info = {
            **plain(self.run.info),
            "variant": variant.name,
            "max_batch_size": variant.max_batch_size,
            "model_instances": variant.model_instances,
        }
        # a candidate is measured online only: on the run's shared engine, no per-batch ones
        engines = self.run.engines
        if engines is not None and engines.per_batch:
            engines = replace(engines, layout=SHARED_ENGINES, batches=())
            info = {k: v for k, v in info.items() if k != "engine_batches"} | engines.info()
        return replace(
            self.run,
            triton=frozen(triton),
            points=frozen({"offline": (), "online": plain(self.sweep)}),
            info=frozen(info),
            runtime=frozen({**self.run.runtime, **self.candidate_runtime}),
            engines=engines,
        )

    def grid(self) -> list[Variant]:
        """The grid's candidates (baseline first); more than max_candidates fails."""
        variants = self.settings.grid(self.baseline)
        if len(variants) > self.settings.max_candidates:
            raise ConfigError(
                f"{self.run.path}: the search grid has {len(variants)} candidates, more than "
                f"search.max_candidates ({self.settings.max_candidates}); drop axis values, "
                "raise the cap, or use strategy quick"
            )
        return variants

    def spec(self) -> SearchSpec:
        grid = self.settings.strategy == "grid"
        return {
            "run": plain(self.run.info),
            "baseline": self.baseline.name,
            "settings": settings_spec(self.settings),
            "candidates": [v.name for v in self.grid()] if grid else [],
        }


def check_energy_meter(settings: SearchSettings, run: RunPlan) -> None:
    """The energy objective needs the run's candidates measured with a meter: a run whose meter
    is ``none`` fails at DAG time, not after every candidate was measured. (A meter that is
    configured but cannot read on the node fails when scored (the walk's steps, the choice),
    naming its energy_status.)"""
    meter = run.energy.get("meter", "none")
    if settings.objective == ENERGY and meter == "none":
        raise ConfigError(
            f"{run.path}: search.objective energy needs energy measured, but the run's meter is "
            f"'none' (the gpus entry's `meter`, else energy.meter.{run.device}); set a meter "
            "(nvml, rapl) or search for throughput (search.objective: throughput)"
        )


def plan_search(
    config: dict[str, Any], model: str, gpu: str, fmt: str, precision: str
) -> SearchPlan:
    """The search of one run; its settings are checked here (an axis the device lacks, a
    baseline Triton could not serve, a grid over the cap, the energy objective on a run that
    measures no energy)."""
    run_plan = plan_run(config, model, gpu, fmt, precision)
    run = resolve(config, model, gpu, fmt, precision)
    search = run.settings["search"]
    baseline = baseline_of(run_plan.triton, run_plan.device)
    settings = search_settings(search, baseline, run_plan.device, f"models.{model}.search")
    check_energy_meter(settings, run_plan)
    online = search.get("online")
    sweep = (
        tuple({"batch": int(online["batch"]), "concurrency": int(c)} for c in online["concurrency"])
        if online
        else tuple(plain(run_plan.points["online"]))
    )
    conversion = run_plan.conversion
    engine_batch = (
        int(conversion.settings["max_batch"])
        if conversion is not None and "max_batch" in conversion.settings
        else None
    )
    trials = int(run.settings["perf"]["trials"])
    plan = SearchPlan(
        run=run_plan,
        settings=settings,
        baseline=baseline,
        sweep=frozen(sweep),
        candidate_runtime=frozen(
            {
                "repository": runtime_minutes(config, run.settings, "repository"),
                "online": runtime_minutes(config, run.settings, "online", len(sweep) * trials),
            }
        ),
        max_engine_batch=engine_batch,
    )
    for step, minutes in plan.candidate_runtime.items():  # a candidate's jobs are not split
        check_fits(f"search_{step}", minutes, run_plan.max_runtime, f"{run.path} search")
    for top, _ in settings.axes.get("max_batch_size", ()):  # within the engine's batch
        plan.variant(baseline.with_value("max_batch_size", (top, (top,))).name)
    if settings.strategy == "grid":
        plan.grid()
    return plan
