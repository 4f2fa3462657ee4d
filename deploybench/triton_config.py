"""Triton's model configuration as Triton's own protobuf message, written and read as text.

The message is ``inference.ModelConfig`` (model_config.proto, generated into tritonclient); the
text is protobuf's text format, as Triton and its tools (Model Navigator, Model Analyzer) write
``config.pbtxt``. What is served comes from the caller: this module only builds and writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from .errors import ConfigError
from .tensors import NUMPY_TO_TRITON_CONFIG, TensorSpec

INSTANCE_KINDS = ("KIND_CPU", "KIND_GPU")


def build_model_config(
    *,
    name: str,
    max_batch_size: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    instance_count: int,
    instance_kind: str,
    preferred_batch_sizes: Sequence[int],
    max_queue_delay_us: int,
    backend: str = "",
    platform: str = "",
    parameters: Mapping[str, str] | None = None,
    cuda_graphs: bool = False,
    gpu_accelerators: Sequence[Mapping[str, Any]] = (),
    warmup: Sequence[model_config_pb2.ModelWarmup] = (),
    gpus: Sequence[int] = (),
) -> model_config_pb2.ModelConfig:
    """The ``ModelConfig`` message: a native backend is named by ``platform``, any other (the
    python backend) by ``backend``. ``gpu_accelerators``: ``{"name", "parameters"}`` entries of
    ``optimization.execution_accelerators``, in priority order. ``warmup``: ``model_warmup``
    samples (:func:`warmup_sample`), run while the model loads. ``gpus``: the CUDA ordinals (as
    the server sees them) a ``KIND_GPU`` group's instances are placed on; empty: every GPU the
    server sees (model_config.proto ``ModelInstanceGroup.gpus``)."""
    if bool(backend) == bool(platform):
        raise ValueError(
            f"model {name!r}: name exactly one of backend ({backend!r}) and platform ({platform!r})"
        )
    if instance_kind not in INSTANCE_KINDS:
        raise ValueError(
            f"model {name!r}: instance kind {instance_kind!r}; valid choices: "
            f"{', '.join(INSTANCE_KINDS)}"
        )
    config = model_config_pb2.ModelConfig(
        name=name, backend=backend, platform=platform, max_batch_size=int(max_batch_size)
    )
    for spec in inputs:
        config.input.add(name=spec.name, data_type=_data_type(spec), dims=spec.shape)
    for spec in outputs:
        config.output.add(name=spec.name, data_type=_data_type(spec), dims=spec.shape)
    if gpus and instance_kind != "KIND_GPU":
        raise ValueError(f"model {name!r}: gpus {list(gpus)} for a {instance_kind} group")
    config.instance_group.add(
        count=int(instance_count),
        kind=model_config_pb2.ModelInstanceGroup.Kind.Value(instance_kind),
        gpus=[int(g) for g in gpus],
    )
    # present even when every field is at its default: it switches the dynamic batcher on
    config.dynamic_batching.SetInParent()
    config.dynamic_batching.preferred_batch_size.extend(int(b) for b in preferred_batch_sizes)
    config.dynamic_batching.max_queue_delay_microseconds = int(max_queue_delay_us)
    if cuda_graphs:
        config.optimization.cuda.graphs = True
    for accelerator in gpu_accelerators:
        config.optimization.execution_accelerators.gpu_execution_accelerator.add(
            name=str(accelerator["name"]),
            parameters={str(k): str(v) for k, v in accelerator.get("parameters", {}).items()},
        )
    for key, value in (parameters or {}).items():
        config.parameters[key].string_value = str(value)
    config.model_warmup.extend(warmup)
    return config


def warmup_sample(
    name: str, batch_size: int, inputs: Sequence[TensorSpec], count: int = 1
) -> model_config_pb2.ModelWarmup:
    """A ``model_warmup`` sample: ``count`` requests of ``batch_size`` all-zero inputs.

    Triton runs every sample while it loads the model, before the model (and with
    ``--strict-readiness`` the server) is ready, and a sample that fails fails the load
    (model_config.proto ``ModelWarmup``; docs/user_guide/model_configuration.md "Model
    Warmup"). Zeros, not ``random_data``: random integers would be out-of-vocabulary token ids
    for an embedding lookup; an engine's build depends on the shapes only. ``dims`` exclude the
    batch and must be concrete (no -1)."""
    sample = model_config_pb2.ModelWarmup(name=name, batch_size=int(batch_size), count=int(count))
    for spec in inputs:
        if any(d < 1 for d in spec.shape):
            raise ValueError(
                f"warm-up {name!r}: input {spec.name!r} has dynamic dimensions "
                f"{list(spec.shape)}; a warm-up sample needs concrete ones"
            )
        sample.inputs[spec.name].CopyFrom(
            model_config_pb2.ModelWarmup.Input(
                data_type=_data_type(spec), dims=spec.shape, zero_data=True
            )
        )
    return sample


def _data_type(spec: TensorSpec) -> int:
    # a dtype can come from the config (formats.<f>.tensor_types)
    if spec.dtype not in NUMPY_TO_TRITON_CONFIG:
        raise ConfigError(
            f"tensor {spec.name!r}: dtype {spec.dtype!r} has no Triton type here; valid choices: "
            f"{', '.join(NUMPY_TO_TRITON_CONFIG)}"
        )
    return int(model_config_pb2.DataType.Value(NUMPY_TO_TRITON_CONFIG[spec.dtype]))


def to_pbtxt(config: model_config_pb2.ModelConfig) -> str:
    """``config.pbtxt``'s text: fields in model_config.proto's order (name and platform or
    backend first), repeated numbers on one line (``dims: [192, 3]``)."""
    return str(
        text_format.MessageToString(
            config, use_index_order=True, use_short_repeated_primitives=True
        )
    )


def parse_pbtxt(text: str) -> model_config_pb2.ModelConfig:
    """The ``ModelConfig`` a ``config.pbtxt`` text describes (an unknown field is an error)."""
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def read_config(path: Path) -> model_config_pb2.ModelConfig:
    return parse_pbtxt(Path(path).read_text())
