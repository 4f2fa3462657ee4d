"""How perf_analyzer reaches Triton in a scenario: its protocol and where the tensors travel.

DLE's runners chose per model, and per scenario (``models.<m>.perf.<scenario>.transport`` in
docs/config-reference.md cites each runner): nnU-Net HTTP with CUDA shared memory, ResNet-50 and
FastPitch plain HTTP, TFT HTTP with system shared memory offline, BERT gRPC with system shared
memory offline; online, no runner used shared memory but nnU-Net's. perf_analyzer takes them as
``-i http|grpc`` and ``--shared-memory system|cuda`` (none: the flag left out, its default).

CUDA shared memory is device memory perf_analyzer allocates with ``cudaMalloc`` and hands to
the server by a ``cudaIpc`` handle: a run on a CPU device (the embedded default) has none, and
measures with system shared memory instead, the nearest transport (tensors pass through shared
memory, not the socket); the plan records both, so each CSV row and its provenance say which
one was used. A leaf module: planning imports it in the driver venv.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

PROTOCOLS = ("http", "grpc")
SHARED_MEMORY = ("none", "system", "cuda")


@dataclass(frozen=True)
class Transport:
    protocol: str  # PROTOCOLS: perf_analyzer's -i
    shared_memory: str  # SHARED_MEMORY: perf_analyzer's --shared-memory (none: left out)

    def __post_init__(self) -> None:
        for what, value, valid in (
            ("protocol", self.protocol, PROTOCOLS),
            ("shared memory", self.shared_memory, SHARED_MEMORY),
        ):
            if value not in valid:
                raise ConfigError(f"unknown {what} {value!r}; valid choices: {', '.join(valid)}")

    @property
    def uses_system_shared_memory(self) -> bool:
        """Whether perf_analyzer maps regions in /dev/shm (named after the tensors)."""
        return self.shared_memory == "system"


def planned(configured: Mapping[str, Any], device: str, where: str) -> dict[str, Any]:
    """The transport a run on ``device`` (cpu | gpu) measures with, as its perf spec holds it:
    ``protocol`` and ``shared_memory`` used, the ``configured`` ones, and the ``fallback`` (why
    they differ; None when they do not). ``where`` names the run for that sentence."""
    wanted = Transport(str(configured["protocol"]), str(configured["shared_memory"]))
    used, fallback = wanted, None
    if wanted.shared_memory == "cuda" and device != "gpu":
        used = Transport(wanted.protocol, "system")
        fallback = (
            f"{where}: CUDA shared memory needs a GPU and this is a {device} device; "
            "measured with system shared memory instead"
        )
    return {
        "protocol": used.protocol,
        "shared_memory": used.shared_memory,
        "configured": {"protocol": wanted.protocol, "shared_memory": wanted.shared_memory},
        "fallback": fallback,
    }


def of_spec(spec: Mapping[str, Any]) -> Transport:
    """The transport a perf spec's ``transport`` says to measure with."""
    return Transport(str(spec["protocol"]), str(spec["shared_memory"]))
