"""Talking to a running Triton server over HTTP: one inference, the served model's inputs
(its metadata) and the feeds reduced to them.

What the answers are compared with is :mod:`deploybench.accuracy`'s business; perf_analyzer
measures the server on its own (:mod:`deploybench.perf`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from .tensors import NUMPY_TO_TRITON, TRITON_TO_NUMPY

# A run's `server.client_timeout_s` replaces it (deploybench.planning.serving_plan.server_settings:
# onnx-trt).
DEFAULT_TIMEOUT_S = 120.0


@contextlib.contextmanager
def _connected(url: str, timeout_s: float) -> Iterator[Any]:
    # imported here: tritonclient.http (geventhttpclient) is for the jobs that talk to a server
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(
        url, connection_timeout=timeout_s, network_timeout=timeout_s
    )
    try:
        yield client
    finally:
        client.close()


def infer_triton(
    url: str,
    model_name: str,
    feeds: dict[str, np.ndarray],
    output_names: list[str],
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, np.ndarray]:
    """One inference over HTTP, sending the inputs the served model takes (see served_feeds)."""
    import tritonclient.http as httpclient

    with _connected(url, timeout_s) as client:
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


def served_inputs(
    url: str, model_name: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[dict[str, Any]]:
    """The served model's inputs (name, datatype, shape) from its metadata."""
    with _connected(url, timeout_s) as client:
        return list(client.get_model_metadata(model_name)["inputs"])


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
