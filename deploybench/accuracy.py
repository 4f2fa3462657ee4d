"""Accuracy: the framework model vs the model Triton serves, on the same deterministic inputs.

Per-output tolerances as in Model Navigator's correctness check: an element passes when
``|served - framework| <= atol + rtol * |framework|``. A miss is an error, never a silent row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import AccuracyError

if TYPE_CHECKING:
    from .models import Family

NUMPY_TO_TRITON = {
    "float32": "FP32",
    "float16": "FP16",
    "int64": "INT64",
    "int32": "INT32",
    "int8": "INT8",
    "uint8": "UINT8",
    "bool": "BOOL",
}
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
            raise ValueError(
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


def infer_triton(
    url: str,
    model_name: str,
    feeds: dict[str, np.ndarray],
    output_names: list[str],
    timeout_s: float = 120.0,
) -> dict[str, np.ndarray]:
    """One inference over HTTP, sending the inputs the served model takes (see served_feeds)."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(
        url, connection_timeout=timeout_s, network_timeout=timeout_s
    )
    try:
        metadata = client.get_model_metadata(model_name)
        inputs = []
        for name, array in served_feeds(feeds, metadata["inputs"]).items():
            tensor = httpclient.InferInput(
                name, list(array.shape), NUMPY_TO_TRITON[str(array.dtype)]
            )
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in output_names]
        result = client.infer(model_name, inputs, outputs=outputs)
        return {n: result.as_numpy(n) for n in output_names}
    finally:
        client.close()


TRITON_TO_NUMPY = {v: k for k, v in NUMPY_TO_TRITON.items()}


def served_inputs(url: str, model_name: str, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """The served model's inputs (name, datatype, shape) from its metadata."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(
        url, connection_timeout=timeout_s, network_timeout=timeout_s
    )
    try:
        return list(client.get_model_metadata(model_name)["inputs"])
    finally:
        client.close()


def served_feeds(
    feeds: dict[str, np.ndarray], served_inputs: list[dict[str, Any]]
) -> dict[str, np.ndarray]:
    """``feeds`` reduced to the inputs the served model declares (model metadata ``inputs``),
    each in the declared data type. A native backend serves the artifact's own inputs (an ONNX
    export drops unused ones) and types (a TensorRT plan takes int32 for int64); on the python
    backend these are exactly the model's inputs and types."""
    missing = [i["name"] for i in served_inputs if i["name"] not in feeds]
    if missing:
        raise ValueError(f"the served model takes inputs {missing} the model does not have")
    return {
        i["name"]: feeds[i["name"]].astype(TRITON_TO_NUMPY[i["datatype"]], copy=False)
        for i in served_inputs
    }


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
        raise ValueError(f"data set {path!r} yielded no batches")
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
