"""The ``energy`` check: what a measurement job on this node will meter, found the way the job
finds it (deploybench.gpu_identity, deploybench.meters), in the same image and allocation.

The GPUs a run's server computes on (``gpu_identity.SERVER_GPUS``, CUDA ordinals in the
server's environment) are named by UUID through CUDA and opened in NVML by that UUID; their
energy counter's update period is measured; another process computing on them is named. A
node where energy cannot be metered is a warning, not a failure: the runs measure throughput
and latency all the same, and their rows say "not measured" with the reason given here.
"""

from __future__ import annotations

from typing import Any

from .spec import PASS, SKIP, WARN, Check, PreflightSpec

NAME = "energy"


def check_energy(spec: PreflightSpec) -> Check:
    """What the runs on ``spec``'s GPU will meter, or why they will not."""
    from ..gpu_identity import SERVER_GPUS, ServerGpus
    from ..meters import open_meter
    from ..telemetry import NotMeasured
    from ..tools import server_environment

    settings: dict[str, Any] = dict(spec.get("energy") or {})
    kind = str(settings.get("meter", "none"))
    if kind == "none":
        return Check(NAME, SKIP, f"energy is not read on {spec['gpu']} (meter none)")
    where = (
        f"the GPU the runs' servers compute on (CUDA ordinal {list(SERVER_GPUS)}, "
        "gpu_identity.SERVER_GPUS)"
    )
    gpus = ServerGpus(SERVER_GPUS, server_environment(), where)
    fix = (
        f"the runs on {spec['gpu']} will measure without energy; to meter it, give the job its "
        "GPU with NVML readable (SLURM gres with ConstrainDevices lets NVML open the job's own "
        "GPU by UUID), or set its meter to none (gpus.<gpu>.meter, energy.meter.gpu)"
    )
    try:
        meter = open_meter(kind, nvml_library=str(settings.get("nvml_library")), gpus=gpus)
    except NotMeasured as why:
        return Check(NAME, WARN, f"energy would not be measured: {why.reason}", fix)
    with meter:
        facts = meter.facts()
        try:
            period_s = meter.measure_counter_period()
        except NotMeasured as why:
            return Check(NAME, WARN, f"energy would not be measured: {why.reason}", fix, facts)
        facts["counter_period_ms"] = round(period_s * 1000, 3)
        sharing = meter.read().sharing
    metered = ", ".join(facts.get("uuids") or [str(facts.get("uuid"))])
    detail = f"{meter.name} meters {metered}, its counter updating every {period_s * 1000:.1f} ms"
    if sharing:
        return Check(
            NAME,
            WARN,
            f"{detail}; but another process computes on it ({'; '.join(sharing)}): trials "
            "beside it would be measured without energy (shared GPU)",
            "run on a GPU no other job shares (SLURM: one whole GPU per job, no MPS)",
            facts,
        )
    return Check(NAME, PASS, detail, facts=facts)
