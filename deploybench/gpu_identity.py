"""Which GPUs a run's Triton server computes on, named by UUID, for the energy meter.

A run serves on :data:`SERVER_GPUS`: CUDA ordinal 0 of the GPUs its job sees, one GPU, as the
plan asks SLURM for one (``resources.gpu_request_of``: ``gpu=1``). The repository pins every
``KIND_GPU`` instance group there (``instance_group { gpus: [0] }``); without ``gpus`` Triton
places instances on every GPU it sees (model_configuration.md, "Instance Groups": "By default, a
single execution instance of the model is created for each GPU available in the system"), and a
meter reading one of them would miss the others.

CUDA ordinals are relative to what the server sees: its ``CUDA_VISIBLE_DEVICES`` (indices or
``GPU-``/``MIG-`` UUIDs) selects and orders the devices its cgroup lets it open, and a SLURM job
under ``ConstrainDevices=yes`` sees its GPUs from 0 whatever their place on the node, while NVML
numbers every GPU of the node in PCI bus order. So the ordinals are named by UUID through CUDA's
own driver API in the server's environment (:func:`cuda_uuids`: ``cuDeviceGet`` and
``cuDeviceGetUuid_v2``, cuda.h), and NVML opens each GPU by that UUID
(``nvmlDeviceGetHandleByUUID``: deploybench.meters).
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DeploybenchError

# The CUDA ordinals (as the server sees them) a run's Triton instances are placed on: one GPU.
SERVER_GPUS: tuple[int, ...] = (0,)

CUDA_PROBE_TIMEOUT_S = 60


class CudaUnavailable(DeploybenchError, RuntimeError):
    """CUDA's driver API cannot name the devices (no libcuda, cuInit failed, ...)."""


@dataclass(frozen=True)
class ServerGpus:
    """The GPUs a server computes on, as it sees them: CUDA ``ordinals`` in its ``environ``
    (None: every GPU it sees, an instance group without ``gpus``), and where that was read."""

    ordinals: tuple[int, ...] | None
    environ: Mapping[str, str] = field(default_factory=dict)
    source: str = ""
    cuda_library: str = "libcuda.so.1"


def instance_group_gpus(configs: Sequence[object]) -> tuple[int, ...] | None:
    """The CUDA ordinals the ``KIND_GPU`` instance groups of ``configs`` (Triton
    ``ModelConfig`` messages) are placed on, in order: () where none is on a GPU, None where one
    lists no ``gpus`` (every GPU the server sees) or its kind leaves the place to Triton
    (``KIND_AUTO``, ``KIND_MODEL``)."""
    from tritonclient.grpc import model_config_pb2

    group = model_config_pb2.ModelInstanceGroup
    ordinals: list[int] = []
    for config in configs:
        for instances in getattr(config, "instance_group", ()):
            if instances.kind == group.KIND_CPU:
                continue
            if instances.kind != group.KIND_GPU or not instances.gpus:
                return None
            ordinals += [int(g) for g in instances.gpus if int(g) not in ordinals]
    return tuple(ordinals)


def server_gpus(repository: Path, models: Sequence[str], environ: Mapping[str, str]) -> ServerGpus:
    """The GPUs a server of ``repository`` computes on for ``models`` (their ``config.pbtxt``
    instance groups), in the server's ``environ``."""
    from .triton_config import read_config

    configs = [read_config(Path(repository) / m / "config.pbtxt") for m in dict.fromkeys(models)]
    ordinals = instance_group_gpus(configs)
    names = ", ".join(dict.fromkeys(models))
    return ServerGpus(ordinals, dict(environ), f"the instance groups of {names} in {repository}")


# cuda.h (CUDA 12, Device Management): CUresult cuDeviceGetCount(int *count),
# cuDeviceGet(CUdevice *device, int ordinal), cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
# ("If the device is in MIG mode, returns its MIG UUID"; CUDA before 11.4 has cuDeviceGetUuid
# only); CUuuid is `struct { char bytes[16]; }`, CUdevice an int. Run in a child process with the
# server's environment, so that CUDA reads the server's CUDA_VISIBLE_DEVICES, and a driver that
# hangs cannot take the job along.
CUDA_UUID_PROBE = textwrap.dedent(
    """
    import ctypes, json, sys
    info = {}
    try:
        lib = ctypes.CDLL(sys.argv[1])
    except OSError as exc:
        info["error"] = f"{sys.argv[1]} does not load: {exc}"
    else:
        def name_of(status):
            name = ctypes.c_char_p()
            getter = getattr(lib, "cuGetErrorName", None)
            if getter is not None and getter(status, ctypes.byref(name)) == 0 and name.value:
                return name.value.decode()
            return f"CUresult {status}"
        status = lib.cuInit(0)
        count = ctypes.c_int(0)
        if status == 0:
            status = lib.cuDeviceGetCount(ctypes.byref(count))
        if status != 0:
            info["error"] = f"cuInit/cuDeviceGetCount failed: {name_of(status)}"
        else:
            get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
            uuids = []
            for ordinal in range(count.value):
                device = ctypes.c_int(0)
                buffer = (ctypes.c_char * 16)()
                status = lib.cuDeviceGet(ctypes.byref(device), ordinal)
                if status == 0:
                    status = get_uuid(buffer, device)
                if status != 0:
                    info["error"] = f"CUDA device {ordinal}: {name_of(status)}"
                    break
                uuids.append(bytes(buffer).hex())
            else:
                info["uuids"] = uuids
    print("CUDA_UUIDS " + json.dumps(info))
    """
)


def format_uuid(hex32: str) -> str:
    """16 bytes in hex as a UUID's 8-4-4-4-12 groups (no ``GPU-``/``MIG-`` prefix)."""
    h = hex32.lower()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def cuda_uuids(
    environ: Mapping[str, str],
    library: str = "libcuda.so.1",
    timeout_s: float = CUDA_PROBE_TIMEOUT_S,
) -> list[str]:
    """Every device CUDA shows a process of ``environ``, in ordinal order, as its UUID's
    8-4-4-4-12 groups (a GPU's or, in MIG mode, the MIG device's: NVML tells which). Raises
    :class:`CudaUnavailable` naming why not."""
    from .probe import run_command

    out = run_command([sys.executable, "-c", CUDA_UUID_PROBE, library], timeout_s, env=environ)
    for line in reversed(out.text.splitlines()):
        if line.startswith("CUDA_UUIDS "):
            info = json.loads(line.removeprefix("CUDA_UUIDS "))
            if "error" in info:
                raise CudaUnavailable(str(info["error"]))
            return [format_uuid(u) for u in info["uuids"]]
    why = out.error or f"exit {out.code}"
    raise CudaUnavailable(f"the CUDA device probe failed: {why}: {out.text.strip()[-300:]}")
