"""How a run's TensorRT engines are laid out over its batch sizes (trt, onnx-trt).

``models.<m>.convert.tensorrt.engines``:

- ``shared``: one engine whose optimisation profile spans the batches Triton sends
  (min_batch..max_batch, opt opt_batch), served as the run's one model: every scenario measures
  it.
- ``per_batch``: as DLE deployed BERT-large (PyTorch/LanguageModeling/BERT/triton/large/runner:
  config_NVIDIA-*.yaml lists each batch size as its own experiment, max_batch_size = that batch,
  and pipeline_impl.py builds its engine with min = opt = max shapes ${MAX_BATCH_SIZE}): one
  engine per offline batch size, each served as its own model of the run's repository
  (:func:`model_name`: ``bert_b8``) with max_batch_size that batch, and the offline point of
  batch b measured on the model of b. The shared engine stays beside them as the run's own
  model: the online scenario (dynamic batching, any batch 1..max_batch_size) and the accuracy
  and task checks use it; DLE measured no online scenario for BERT. The accuracy step checks
  each per-batch engine at its batch too.

A ``trt`` run converts each engine with trtexec (a convert job per batch,
``convert/batch<b>/model.plan``); an ``onnx-trt`` run's engines are built by ONNX Runtime while
the models load (the accelerator's ``trt_profile_*_shapes`` at that batch, a cache per model).

Everything here is a pure function of the run's settings, decided while the DAG is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

SHARED = "shared"
PER_BATCH = "per_batch"
LAYOUTS = (SHARED, PER_BATCH)
# `models.<m>.convert.tensorrt` keys that are not trtexec's settings (kept out of the convert
# spec, so that choosing them reruns no conversion that does not change)
LAYOUT_KEY = "engines"
ACCELERATOR_WORKSPACE = "accelerator_workspace_mb"
NOT_CONVERTER_SETTINGS = (LAYOUT_KEY, ACCELERATOR_WORKSPACE)


@dataclass(frozen=True)
class EngineLayout:
    """A run's TensorRT engines: ``layout`` (LAYOUTS), the batches with an engine of their own
    (per_batch: the offline batch sizes; shared: none), and whether the engines are converted
    artifacts (trt: a convert job each) or built while the models load (onnx-trt)."""

    layout: str
    batches: tuple[int, ...]
    converted: bool

    @property
    def per_batch(self) -> bool:
        return self.layout == PER_BATCH

    def info(self) -> dict[str, Any]:
        """What the run's results and provenance record (RunInfo's ``engines``...)."""
        found: dict[str, Any] = {"engines": self.layout}
        if self.per_batch:
            found["engine_batches"] = list(self.batches)
        return found

    def check_batch(self, batch: int, where: str) -> None:
        if batch not in self.batches:
            raise ConfigError(
                f"{where}: no engine of its own for batch {batch}; valid choices: "
                f"{', '.join(map(str, self.batches)) or 'none (engines: shared)'}"
            )


def layout_of(section: Mapping[str, Any], where: str) -> str:
    """The configured layout (`<where>.engines`; default shared), checked."""
    layout = str(section.get(LAYOUT_KEY, SHARED))
    if layout not in LAYOUTS:
        raise ConfigError(
            f"{where}.{LAYOUT_KEY}: unknown engine layout {layout!r}; valid choices: "
            f"{', '.join(LAYOUTS)}"
        )
    return layout


def plan_layout(
    section: Mapping[str, Any],
    where: str,
    *,
    offline_batches: Sequence[int],
    max_batch_size: int,
    converted: bool,
) -> EngineLayout:
    """The layout of a run with TensorRT engines (``section``: its `convert.tensorrt`);
    per_batch: one engine per offline batch size, each within triton.max_batch_size."""
    layout = layout_of(section, where)
    if layout == SHARED:
        return EngineLayout(SHARED, (), converted)
    batches = tuple(sorted({int(b) for b in offline_batches}))
    over = [b for b in batches if b > max_batch_size]
    if over:
        raise ConfigError(
            f"{where}.{LAYOUT_KEY}: per_batch builds an engine per offline batch size, and "
            f"{over} exceed triton.max_batch_size {max_batch_size}"
        )
    return EngineLayout(PER_BATCH, batches, converted)


def model_name(model: str, batch: int) -> str:
    """The Triton model serving the engine of ``batch`` (``bert_b8``)."""
    return f"{model}_b{batch}"


def convert_job(batch: int) -> str:
    """The name of the conversion of ``batch``'s engine in a run's job table (``convert.b8``)."""
    return f"convert.b{batch}"


def converter_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """trtexec's settings: the section without the layout's own keys."""
    return {k: v for k, v in settings.items() if k not in NOT_CONVERTER_SETTINGS}


def batch_settings(settings: Mapping[str, Any], batch: int) -> dict[str, Any]:
    """The converter settings of the engine of ``batch``: its profile min = opt = max =
    ``batch`` (DLE's --min-shapes/--opt-shapes/--max-shapes at ${MAX_BATCH_SIZE}); the other
    dimensions' shapes and the workspace as the shared engine's."""
    return {**settings, "min_batch": batch, "opt_batch": batch, "max_batch": batch}


def batch_triton(triton: Mapping[str, Any], batch: int) -> dict[str, Any]:
    """The Triton settings of the model of ``batch``: max_batch_size ``batch`` (DLE's
    --max-batch-size ${MAX_BATCH_SIZE}); preferred batch sizes within it (else ``batch``)."""
    preferred = [int(b) for b in triton["preferred_batch_sizes"] if int(b) <= batch]
    return {**triton, "max_batch_size": batch, "preferred_batch_sizes": preferred or [batch]}


def batch_serving(serving: Mapping[str, Any], batch: int) -> dict[str, Any]:
    """How the model of ``batch`` is served: as the run, and where ONNX Runtime builds the
    engine while the model loads, with the profile min = opt = max = ``batch``."""
    how = dict(serving)
    build = serving.get("engine_build")
    if build is not None:
        how["engine_build"] = {**build, "min_batch": batch, "opt_batch": batch}
    return how


def describe(config: Mapping[str, Any]) -> str | None:
    """The report's line for a run's engines (from its provenance's config), None without."""
    layout = config.get(LAYOUT_KEY)
    if layout is None:
        return None
    top = config.get("max_batch_size")
    if layout == PER_BATCH:
        batches = ", ".join(str(b) for b in config.get("engine_batches") or [])
        return (
            f"per_batch: one per offline batch size ({batches}; min = opt = max = the batch, "
            f"max_batch_size = the batch); online, accuracy: one over 1..{top}"
        )
    return f"shared: one over batches 1..{top}"
