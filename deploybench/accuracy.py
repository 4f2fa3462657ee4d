"""Accuracy: the framework model vs the model Triton serves, on the same deterministic inputs.

Per-output tolerances as in Model Navigator's correctness check: an element passes when
``|served - framework| <= atol + rtol * |framework|``. A miss is an error, never a silent row.
The served outputs come from :mod:`deploybench.triton_client`; this module only compares.
Beside the verdict, :func:`measure` gives each output's errors and what they mean for the model
(its family's ``accuracy_quantities``: arg-max flips, moved durations); the accuracy step and
``benchmarks/fp16_accuracy.py`` report the same figures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import AccuracyError, ConfigError, DataError

if TYPE_CHECKING:
    from .models import Family
    from .models.base import Quantities

COLUMNS = [
    "output",
    "batch",
    "elements",
    "mismatched",
    "max_abs_err",
    "max_rel_err",
    "atol",
    "rtol",
    "mismatch_fraction",
    "passed",
    # the model's own quantities for this output (Family.accuracy_quantities): "name=value; ..."
    "quantities",
]
ERROR_KEYS = ("max_abs_err", "max_rel_err")


TASK_COLUMNS = [
    "metric",
    "value",
    "threshold",
    "higher_is_better",
    "passed",
    "batches",
    "dataset",
    "note",
]


def max_errors(expected: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """The largest absolute error and the largest error relative to ``|expected|`` (floored at
    1e-12). NaN propagates: a NaN output shows as a NaN error, not as a small one."""
    exp = np.asarray(expected, dtype=np.float64)
    diff = np.abs(np.asarray(got, dtype=np.float64) - exp)
    if not diff.size:
        return {"max_abs_err": 0.0, "max_rel_err": 0.0}
    return {
        "max_abs_err": float(diff.max()),
        "max_rel_err": float((diff / np.maximum(np.abs(exp), 1e-12)).max()),
    }


def measure(
    reference: dict[str, np.ndarray], actual: dict[str, np.ndarray], family: Family | None = None
) -> Quantities:
    """Per output of ``reference``: its ``max_errors`` against ``actual`` and the family's own
    quantities (``Family.accuracy_quantities``). Outputs of different shapes (a FastPitch mel
    whose frame count moved) are compared over their common part and say ``shape_differs``."""
    measured: Quantities = {}
    for name, expected in reference.items():
        if name not in actual:
            raise AccuracyError(f"output {name!r} missing from the served model's response")
        exp, got = np.asarray(expected), np.asarray(actual[name])
        figures: dict[str, float] = {}
        if exp.shape != got.shape:
            if exp.ndim != got.ndim:
                raise AccuracyError(f"output {name!r}: shape {got.shape} != expected {exp.shape}")
            common = tuple(slice(0, min(a, b)) for a, b in zip(exp.shape, got.shape, strict=True))
            exp, got = exp[common], got[common]
            figures["shape_differs"] = 1.0
        measured[name] = {**max_errors(exp, got), **figures}
    derived = family.accuracy_quantities(reference, actual) if family is not None else {}
    for name, figures in derived.items():
        measured.setdefault(name, {}).update(figures)
    return measured


def format_quantities(figures: dict[str, float]) -> str:
    """A model's own quantities of one output as ``name=value; ...`` (errors left out)."""
    return "; ".join(f"{k}={v:.4g}" for k, v in figures.items() if k not in ERROR_KEYS)


def compare_outputs(
    reference: dict[str, np.ndarray],
    actual: dict[str, np.ndarray],
    tolerance: dict[str, dict[str, float]],
    batch: int,
    family: Family | None = None,
) -> list[dict[str, Any]]:
    """One row per output with the error statistics and the verdict; with ``family``, its
    own quantities too (``quantities``, see :func:`measure`).

    With ``family``, an output whose data-dependent axes (-1 in its signature: FastPitch's
    frames, when an utterance's length moved) differ in size is compared over the part both
    have, and the elements only one side has count as mismatched; any other difference of
    shape is an error."""
    for name, expected in reference.items():
        if name not in tolerance:
            raise ConfigError(
                f"no tolerance configured for output {name!r}; configured: {sorted(tolerance)}"
            )
        if name not in actual:
            raise AccuracyError(f"output {name!r} missing from the served model's response")
        shape, want = np.shape(actual[name]), np.shape(expected)
        if shape != want and not _differ_only_in(shape, want, _dynamic_axes(family, name)):
            raise AccuracyError(
                f"output {name!r}: shape {shape} != expected {np.shape(expected)}"
                + _quantities_note(reference, actual, family)
            )
    measured = measure(reference, actual, family)
    rows = []
    for name, expected in reference.items():
        got = np.asarray(actual[name], dtype=np.float64)
        exp = np.asarray(expected, dtype=np.float64)
        atol, rtol = float(tolerance[name]["atol"]), float(tolerance[name]["rtol"])
        # Arg-max outputs (nnU-Net labels) flip on near-ties between runtimes: a share of
        # elements may then be outside atol/rtol.
        allowed = float(tolerance[name].get("mismatch_fraction", 0.0))
        elements = int(np.prod(np.maximum(got.shape, exp.shape)))  # what either side has
        if got.shape != exp.shape:  # along data-dependent axes only (checked above)
            common = tuple(slice(0, min(a, b)) for a, b in zip(got.shape, exp.shape, strict=True))
            got, exp = got[common], exp[common]
        bad = ~(np.abs(got - exp) <= atol + rtol * np.abs(exp))  # NaN counts as a mismatch
        mismatched = int(bad.sum()) + elements - int(exp.size)  # one side's alone: mismatched
        rows.append(
            {
                "output": name,
                "batch": batch,
                "elements": elements,
                "mismatched": mismatched,
                "max_abs_err": measured[name]["max_abs_err"],
                "max_rel_err": measured[name]["max_rel_err"],
                "atol": atol,
                "rtol": rtol,
                "mismatch_fraction": allowed,
                "passed": bool(mismatched <= allowed * elements),
                "quantities": format_quantities(measured[name]),
            }
        )
    return rows


def _dynamic_axes(family: Family | None, name: str) -> set[int]:
    """The axes (batch first) of output ``name`` whose size depends on the data."""
    specs = [s for s in family.outputs if s.name == name] if family is not None else []
    return (
        {axis for axis, size in enumerate(specs[0].shape, start=1) if size == -1}
        if specs
        else set()
    )


def _differ_only_in(a: tuple[int, ...], b: tuple[int, ...], axes: set[int]) -> bool:
    return len(a) == len(b) and all(
        x == y or i in axes for i, (x, y) in enumerate(zip(a, b, strict=True))
    )


def _quantities_note(
    reference: dict[str, np.ndarray], actual: dict[str, np.ndarray], family: Family | None
) -> str:
    """The family's quantities for a failure message (why an output changed shape)."""
    if family is None:
        return ""
    text = "; ".join(
        f"{name}: {line}"
        for name, figures in measure(reference, actual, family).items()
        if (line := format_quantities(figures))
    )
    return f" ({text})" if text else ""


def format_failure(rows: list[dict[str, Any]]) -> str:
    bad = [r for r in rows if not r["passed"]]
    return "; ".join(
        f"{r['output']}: {r['mismatched']}/{r['elements']} elements outside atol={r['atol']:g} "
        f"rtol={r['rtol']:g} (max abs err {r['max_abs_err']:.3g}, max rel err "
        f"{r['max_rel_err']:.3g}{'; ' + r['quantities'] if r.get('quantities') else ''})"
        for r in bad
    )


def task_rows(
    family: Family,
    task: dict[str, Any],
    infer: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
) -> list[dict[str, Any]]:
    """The seed page's task metric over the configured data set, as served by ``infer``.

    Without a data set there is no metric to report: one row says so instead of a number.
    """
    path = task.get("path")
    if not path:
        return [
            {
                "metric": family.metric_name,
                "value": "",
                "threshold": "",
                "higher_is_better": family.higher_is_better,
                "passed": "",
                "batches": 0,
                "dataset": "",
                "note": "not measured: no data set configured (accuracy.task.path)",
            }
        ]
    outputs, labels = [], []
    for feeds, label in family.dataset_batches(
        path, int(task.get("batch_size", 8)), task.get("limit")
    ):
        outputs.append(infer(feeds))
        labels.append(label)
    if not outputs:
        raise DataError(f"data set {path!r} yielded no batches")
    values = family.task_metric(outputs, labels)
    threshold = task.get("threshold")
    rows = []
    for name, value in values.items():
        passed: bool | str = ""
        if name == family.metric_name and threshold is not None:
            passed = value >= threshold if family.higher_is_better else value <= threshold
        rows.append(
            {
                "metric": name,
                "value": float(value),
                "threshold": threshold if name == family.metric_name else "",
                "higher_is_better": family.higher_is_better,
                "passed": passed,
                "batches": len(outputs),
                "dataset": path,
                "note": "",
            }
        )
    return rows
