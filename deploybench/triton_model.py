"""Triton python-backend model: runs the artifact beside it with onnxruntime or TorchScript.

On the instance's device: the CPU (KIND_CPU, the embedded default) or, for a GPU entry served
by the python backend (`gpus.<g>.serving: python`), the instance's GPU (KIND_GPU: TorchScript
on ``cuda:<id>``, ONNX Runtime's CUDAExecutionProvider). Inputs reach this process in host
memory (the backend's FORCE_CPU_ONLY_INPUT_TENSORS default) and outputs leave it from host
memory.

Under NumPy 2, tensors cross the stub's boundary by DLPack: pytriton 0.7.0's python backend
(Triton 2.51, python_backend r24.10) is built with pybind11 2.10, which reads NumPy 1's dtype
layout (NumPy 2 support came in pybind11 2.12, taken by python_backend in r25.01, commit
09c3537). With NumPy 2, as in a CUDA 13 PyTorch image, ``Tensor(name, array)`` gives every
output 0 bytes and ``as_numpy()`` gives inputs wrong values (both seen here with NumPy 2.2,
tests/test_numpy2_stub.py); ``FromDLPack`` sizes a tensor from its own shape and dtype bits.
Under NumPy 1 the arrays cross as they always did: NumPy 1's DLPack capsule destructor rejects
the name the backend gives a used capsule ("used_dlpack") and the stub stops answering.

Copied into ``<repository>/<model>/1/model.py`` with ``runtime.py`` beside it. Requests that
Triton's dynamic batcher hands over together are concatenated into one runtime call and split
back, so batching works as it does with a native backend.
"""

import importlib.util
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


def _load_runtime_module():
    spec = importlib.util.spec_from_file_location(
        "deploybench_runtime", Path(__file__).with_name("runtime.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        version_dir = Path(args["model_repository"]) / args["model_version"]
        runtime = _load_runtime_module()
        self.served_inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]
        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1
        # the python backend names each instance's kind ("GPU" for KIND_GPU) and device id
        # (python_backend README, "initialize": model_instance_kind, model_instance_device_id)
        device = runtime.instance_device(
            args.get("model_instance_kind", "CPU"), args.get("model_instance_device_id", "0")
        )
        self.runner = runtime.load_runner(
            params["runtime"],
            version_dir / params["artifact"],
            input_names=self.served_inputs,
            output_names=self.outputs,
            threads=runtime.threads_per_instance(
                int(params.get("intra_op_threads", "0")), instances
            ),
            device=device,
            entry=params.get("entry", ""),
        )

    def execute(self, requests):
        try:
            feeds = {}
            sizes = None
            for name in self.runner.input_names:
                parts = [_host_array(pb_utils.get_input_tensor_by_name(r, name)) for r in requests]
                sizes = [p.shape[0] for p in parts]
                feeds[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
            # The runner returns the artifact's output order (an ONNX session's own); answer
            # in the order the model config declares.
            by_name = dict(zip(self.runner.output_names, self.runner(feeds)))
            outputs = [by_name[name] for name in self.outputs]
        except Exception as err:  # noqa: BLE001 - reported to every client of the batch
            error = pb_utils.TritonError(f"{type(err).__name__}: {err}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        bounds = np.cumsum([0, *sizes])
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    _output_tensor(name, out[lo:hi]) for name, out in zip(self.outputs, outputs)
                ]
            )
            for lo, hi in itertools.pairwise(bounds)
        ]


_NUMPY_2 = int(np.__version__.split(".")[0]) >= 2
# What NumPy 2's capsule destructor reports of a capsule the stub has consumed (below).
USED_CAPSULE_REPORT = "PyCapsule_GetPointer called with incorrect name"


def _without_used_capsule_reports(previous):
    """``sys.unraisablehook`` less one report. The stub renames a capsule it consumed
    "used_dlpack" (python_backend r24.10 ``pb_tensor.cc``, ``FromDLPack``), not DLPack's
    "used_dltensor", and frees the tensor itself (``~PbTensor``: ``DeleteDLPack``). NumPy 2's
    capsule destructor does not know the name, fails to read the capsule as "dltensor",
    reports that as unraisable and frees nothing. The report is a traceback per output per
    request in the server log, written while the request is served: it would slow every
    request and fill the log. Every other unraisable error still reaches ``previous``."""

    def hook(unraisable):
        if unraisable.exc_type is ValueError and str(unraisable.exc_value) == USED_CAPSULE_REPORT:
            return
        previous(unraisable)

    return hook


if _NUMPY_2:
    sys.unraisablehook = _without_used_capsule_reports(sys.unraisablehook)


def _host_array(tensor):
    return np.from_dlpack(tensor) if _NUMPY_2 else tensor.as_numpy()


def _output_tensor(name, array):
    # C order is all FromDLPack takes (and what the classic path copies to anyway)
    array = np.ascontiguousarray(array)
    return pb_utils.Tensor.from_dlpack(name, array) if _NUMPY_2 else pb_utils.Tensor(name, array)
