"""The Triton checks: one tritonserver over a tiny repository of identity models (the python
backend's on KIND_CPU and KIND_GPU, and one per native backend that can be written here) serves
each of them (``tritonserver``, ``tritonserver_gpu``), its backends' libraries are present
(``backends``), and perf_analyzer measures the CPU model (``perf_analyzer``)."""

from __future__ import annotations

import contextlib
import json
import re
import textwrap
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ServerError, ToolNotFound
from ..probe import run_command, tail
from .spec import FAIL, PASS, SKIP, Check, PreflightSpec, gpu_fix

if TYPE_CHECKING:
    from ..server import TritonServer

# Where NGC tritonserver images keep their backends (tritonserver's default backend directory).
NGC_BACKEND_DIR = Path("/opt/tritonserver/backends")
PERF_ANALYZER_TIMEOUT_S = 120


IDENTITY_MODEL_PY = textwrap.dedent(
    """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]
                )
                for r in requests
            ]
    """
)
CPU_MODEL = "preflight_cpu"
LOAD_FAILED_PREFIX = r"^load failed for model '[^']*': version \d+ is at UNAVAILABLE state: "


@dataclass(frozen=True)
class TinyModel:
    name: str
    backend: str
    kind: str  # KIND_CPU | KIND_GPU
    input: str
    output: str


def _write_onnx_identity(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    # An old IR and opset: every onnxruntime an NGC image ships reads them.
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path
    )


def _write_torchscript_identity(path: Path) -> None:
    import torch

    class Identity(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    # TorchScript is what Triton's libtorch backend loads, deprecated in torch or not
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(Identity()).save(str(path))


# Backends with no tiny model here, and why.
NOT_WRITTEN = {
    "tensorrt": "a TensorRT plan is built on the GPU itself (the convert step's job)",
    "tensorflow": "preflight writes no SavedModel",
}
# Backends whose tiny model can be written without a GPU toolchain, and the module it needs.
MODEL_WRITERS: dict[str, tuple[str, str, Callable[[Path], None]]] = {
    "onnxruntime": ("onnx", "model.onnx", _write_onnx_identity),
    "pytorch": ("torch", "model.pt", _write_torchscript_identity),
}


def write_tiny_repository(
    root: Path, gpu_backends: Sequence[str]
) -> tuple[list[TinyModel], dict[str, str]]:
    """A repository of identity models: the python backend's on KIND_CPU, and on KIND_GPU the
    python backend's plus one per backend in ``gpu_backends`` that can be written here. Returns
    the models and, per backend left out, why."""
    from ..planning.backends import PLATFORMS
    from ..tensors import TensorSpec
    from ..triton_config import build_model_config, to_pbtxt

    models = [TinyModel(CPU_MODEL, "python", "KIND_CPU", "x", "y")]
    left_out: dict[str, str] = {}
    for backend in ["python", *[b for b in gpu_backends if b != "python"]]:
        model = TinyModel(f"preflight_gpu_{backend}", backend, "KIND_GPU", "x", "y")
        if backend == "pytorch":  # libtorch names tensors by position
            model = TinyModel(model.name, backend, "KIND_GPU", "INPUT__0", "OUTPUT__0")
        if backend in NOT_WRITTEN:
            left_out[backend] = NOT_WRITTEN[backend]
            continue
        if backend in MODEL_WRITERS:
            module = MODEL_WRITERS[backend][0]
            try:
                __import__(module)
            except ImportError:
                left_out[backend] = f"{module} is not importable here to write its model"
                continue
        models.append(model)
    for model in models:
        version = root / model.name / "1"
        version.mkdir(parents=True)
        if model.backend == "python":
            (version / "model.py").write_text(IDENTITY_MODEL_PY)
        else:
            _, filename, write = MODEL_WRITERS[model.backend]
            write(version / filename)
        config = build_model_config(
            name=model.name,
            max_batch_size=8,
            inputs=[TensorSpec(model.input, "float32", (4,))],
            outputs=[TensorSpec(model.output, "float32", (4,))],
            instance_count=1,
            instance_kind=model.kind,
            preferred_batch_sizes=[],
            max_queue_delay_us=0,
            backend="python" if model.backend == "python" else "",
            platform=PLATFORMS.get(model.backend, ""),
        )
        (root / model.name / "config.pbtxt").write_text(to_pbtxt(config))
    return models, left_out


def load_model(server: TritonServer, name: str, timeout_s: float) -> str:
    """Load ``name`` (explicit model control); "" when loaded, else Triton's message."""
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/repository/models/{name}/load", data=b"", method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return ""
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        try:
            message = str(json.loads(body)["error"])
        except (ValueError, KeyError, TypeError):
            return body.strip() or str(exc)
        # Triton's own reason, without the boilerplate that names the model and its version
        return re.sub(LOAD_FAILED_PREFIX, "", message.strip()).rstrip(";")
    except (urllib.error.URLError, OSError) as exc:
        return f"tritonserver did not answer: {exc}"


def serve_once(server: TritonServer, model: TinyModel, timeout_s: float) -> str:
    """Load ``model`` and send it one request; "" when it answered right, else why not."""
    import numpy as np

    from ..triton_client import infer_triton

    error = load_model(server, model.name, timeout_s)
    if error:
        return error
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    try:
        out = infer_triton(server.http_url, model.name, {model.input: x}, [model.output])
    except Exception as exc:  # noqa: BLE001 - the client's many error types: this model failed
        return f"inference failed: {type(exc).__name__}: {exc}"
    if not np.array_equal(out[model.output], x):
        return "inference returned other values than it was sent"
    return ""


def full_image_fix(spec: PreflightSpec) -> str:
    return (
        f"use the full NGC tritonserver image (nvcr.io/nvidia/tritonserver:<release>-py3) as "
        f"images.{spec['image']}.from, not a -pyt-python-py3 or -python-py3 variant: those "
        "ship only some backends"
    )


@dataclass
class TritonRun:
    """What the Triton checks share: one server, started once."""

    server: TritonServer | None
    start_error: str
    models: list[TinyModel]
    left_out: dict[str, str]
    cpu_error: str = "not run"
    metadata: dict[str, Any] = field(default_factory=dict)


def check_tritonserver(spec: PreflightSpec, run: TritonRun) -> Check:
    name = "tritonserver"
    if run.server is None:
        return Check(
            name,
            FAIL,
            run.start_error,
            f"run the Triton jobs in an NGC tritonserver image (images.{spec['image']}.from); "
            "the server's own message is above",
        )
    [model] = [m for m in run.models if m.name == CPU_MODEL]
    run.cpu_error = serve_once(run.server, model, float(spec["server"]["startup_timeout_s"]))
    version = run.metadata.get("version")
    if run.cpu_error:
        return Check(
            name,
            FAIL,
            f"tritonserver {version} started, but {CPU_MODEL} (python backend, KIND_CPU): "
            f"{run.cpu_error}",
            "the python backend and its stub must work in the image: " + full_image_fix(spec),
            run.metadata,
        )
    return Check(
        name,
        PASS,
        f"tritonserver {version} loaded {CPU_MODEL} (python backend, KIND_CPU) and served it",
        facts=run.metadata,
    )


def check_tritonserver_gpu(spec: PreflightSpec, run: TritonRun) -> Check:
    name = "tritonserver_gpu"
    if run.server is None:
        return Check(
            name, FAIL, "not run: tritonserver did not start", "see the tritonserver check"
        )
    timeout_s = float(spec["server"]["startup_timeout_s"])
    results = {
        m.backend: serve_once(run.server, m, timeout_s) for m in run.models if m.kind == "KIND_GPU"
    }
    facts = {"served": results, "not_tried": run.left_out}
    parts = [f"{b}: {error or 'served on KIND_GPU'}" for b, error in results.items()]
    parts += [
        f"{b}: not tried ({why}; its library: see backends)" for b, why in run.left_out.items()
    ]
    failed = {b: e for b, e in results.items() if e}
    if not failed:
        return Check(name, PASS, "; ".join(parts), facts=facts)
    fixes = []
    if any("no GPUs are available" in e or "CUDA" in e for e in failed.values()):
        fixes.append(gpu_fix(spec))
    if any("unable to find backend library" in e for e in failed.values()):
        fixes.append(full_image_fix(spec))
    if not fixes:
        fixes.append("see Triton's message (the job's log has the server's log)")
    return Check(name, FAIL, "; ".join(parts), "; ".join(fixes), facts)


def check_backends(spec: PreflightSpec) -> Check:
    from .. import tools

    name = "backends"
    if not spec["backends"]:
        return Check(name, SKIP, "no run on this GPU serves with this image")
    try:
        directory = tools.backend_directory() or NGC_BACKEND_DIR
    except ToolNotFound as exc:
        return Check(name, FAIL, str(exc), full_image_fix(spec))
    missing: list[str] = []
    found: list[str] = []
    for backend in spec["backends"]:
        files = [directory / backend / f"libtriton_{backend}.so"]
        if backend == "python":
            files.append(directory / backend / "triton_python_backend_stub")
        absent = [f.name for f in files if not f.is_file()]
        (missing if absent else found).append(
            f"{backend} ({', '.join(absent)})" if absent else backend
        )
    facts = {"directory": str(directory)}
    if missing:
        return Check(
            name,
            FAIL,
            f"missing from {directory}: {', '.join(missing)}"
            + (f"; present: {', '.join(found)}" if found else ""),
            full_image_fix(spec),
            facts,
        )
    return Check(name, PASS, f"{', '.join(found)} in {directory}", facts=facts)


def check_perf_analyzer(spec: PreflightSpec, run: TritonRun, work: Path) -> Check:
    from .. import tools

    name = "perf_analyzer"
    fix = (
        f"perf_analyzer comes from the NGC tritonserver -sdk image (images.{spec['image']}.sdk, "
        "copied in by envs/triton.def)"
    )
    try:
        binary = tools.perf_analyzer_binary()
    except ToolNotFound as exc:
        return Check(name, FAIL, str(exc), fix)
    if run.server is None or run.cpu_error:
        return Check(
            name, FAIL, "not run: no model served (see tritonserver)", "see the tritonserver check"
        )
    # HTTP without shared memory: a few requests, and nothing left in /dev/shm.
    cmd = [
        str(binary),
        "-m", CPU_MODEL,
        "-u", run.server.http_url,
        "-i", "http",
        "-b", "1",
        "--concurrency-range", "1:1:1",
        "--measurement-mode", "count_windows",
        "--measurement-request-count", "20",
        "--stability-percentage", "999",
        "--max-trials", "5",
        "-f", str(work / "perf.csv"),
    ]  # fmt: skip
    out = run_command(cmd, PERF_ANALYZER_TIMEOUT_S, tools.perf_analyzer_environment())
    if out.code != 0:
        return Check(
            name,
            FAIL,
            f"perf_analyzer {out.error or f'exit {out.code}'}: {tail(out.text)}",
            f"{fix}; it links libb64.so.0d and libcudart.so.12",
            {"binary": str(binary)},
        )
    match = re.search(r"throughput:\s*([\d.]+)\s*infer/sec", out.text, re.IGNORECASE)
    rate = f"{float(match.group(1)):g} infer/s" if match else "a measurement"
    return Check(
        name, PASS, f"{binary} measured {CPU_MODEL}: {rate}", facts={"binary": str(binary)}
    )


@contextlib.contextmanager
def triton_run(spec: PreflightSpec, work: Path) -> Iterator[TritonRun]:
    """One tritonserver (explicit model control: each model's load is answered on its own) over
    the tiny repository; stopped on the way out whatever happened."""
    from ..server import TritonServer

    gpu_backends = spec["backends"] if spec["device"] == "gpu" else []
    models, left_out = write_tiny_repository(work / "repository", gpu_backends)
    settings = spec["server"]
    server = TritonServer(
        work / "repository",
        work / "tritonserver.log",
        startup_timeout_s=float(settings["startup_timeout_s"]),
        shutdown_timeout_s=float(settings["shutdown_timeout_s"]),
        extra_args=("--model-control-mode=explicit",),
    )
    run = TritonRun(server, "", models, left_out)
    try:
        server.start()
    except (ServerError, ToolNotFound) as exc:  # the checks report it
        run.server, run.start_error = None, str(exc)
    try:
        if run.server is not None:
            with contextlib.suppress(OSError, ValueError):
                meta = server.metadata()
                run.metadata = {k: meta.get(k) for k in ("name", "version", "extensions")}
        yield run
    finally:
        server.stop()
