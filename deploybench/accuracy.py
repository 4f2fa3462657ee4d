"""Accuracy: the framework model vs the model Triton serves, on the same deterministic inputs.

Per-output tolerances as in Model Navigator's correctness check: an element passes when
``|served - framework| <= atol + rtol * |framework|``. A miss is an error, never a silent row.
The served outputs come from :mod:`deploybench.triton_client`; this module only compares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import AccuracyError, ConfigError, DataError

if TYPE_CHECKING:
    from .models import Family

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
]


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


def compare_outputs(
    reference: dict[str, np.ndarray],
    actual: dict[str, np.ndarray],
    tolerance: dict[str, dict[str, float]],
    batch: int,
) -> list[dict[str, Any]]:
    """One row per output with the error statistics and the verdict."""
    rows = []
    for name, expected in reference.items():
        if name not in tolerance:
            raise ConfigError(
                f"no tolerance configured for output {name!r}; configured: {sorted(tolerance)}"
            )
        if name not in actual:
            raise AccuracyError(f"output {name!r} missing from the served model's response")
        got = np.asarray(actual[name], dtype=np.float64)
        exp = np.asarray(expected, dtype=np.float64)
        if got.shape != exp.shape:
            raise AccuracyError(f"output {name!r}: shape {got.shape} != expected {exp.shape}")
        atol, rtol = float(tolerance[name]["atol"]), float(tolerance[name]["rtol"])
        # Arg-max outputs (nnU-Net labels) flip on near-ties between runtimes: a share of
        # elements may then be outside atol/rtol.
        allowed = float(tolerance[name].get("mismatch_fraction", 0.0))
        diff = np.abs(got - exp)
        bad = ~(diff <= atol + rtol * np.abs(exp))  # NaN counts as a mismatch
        rows.append(
            {
                "output": name,
                "batch": batch,
                "elements": int(exp.size),
                "mismatched": int(bad.sum()),
                # NaN propagates: a NaN output shows as a NaN error, not as a small one
                "max_abs_err": float(diff.max()) if diff.size else 0.0,
                "max_rel_err": float((diff / np.maximum(np.abs(exp), 1e-12)).max())
                if diff.size
                else 0.0,
                "atol": atol,
                "rtol": rtol,
                "mismatch_fraction": allowed,
                "passed": bool(bad.sum() <= allowed * exp.size),
            }
        )
    return rows


def format_failure(rows: list[dict[str, Any]]) -> str:
    bad = [r for r in rows if not r["passed"]]
    return "; ".join(
        f"{r['output']}: {r['mismatched']}/{r['elements']} elements outside atol={r['atol']:g} "
        f"rtol={r['rtol']:g} (max abs err {r['max_abs_err']:.3g}, max rel err "
        f"{r['max_rel_err']:.3g})"
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
