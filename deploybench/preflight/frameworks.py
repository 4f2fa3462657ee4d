"""The ``framework_cuda`` check: each framework the image's jobs use imports, sees the GPU and
runs a kernel on it (a child process per framework)."""

from __future__ import annotations

import textwrap
from typing import Any

from ..probe import python_probe
from .gpu import GpuProbe
from .spec import FAIL, PASS, SKIP, Check, PreflightSpec, gpu_fix

FRAMEWORK_TIMEOUT_S = 300  # importing TensorFlow from a shared file system is slow


FRAMEWORK_PROBE = textwrap.dedent(
    """
    import json, sys
    info = {"module": sys.argv[1]}
    try:
        if sys.argv[1] == "torch":
            import torch
            info.update(version=torch.__version__, cuda=torch.version.cuda,
                        available=torch.cuda.is_available(), devices=torch.cuda.device_count())
            if info["available"]:
                info["names"] = [torch.cuda.get_device_name(i) for i in range(info["devices"])]
                info["capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
                info["arch_list"] = torch.cuda.get_arch_list()
                try:  # seeing a GPU is not running on it (a build without its kernels)
                    x = torch.arange(4.0, device="cuda")
                    info["kernel"] = float((x * 2 + 1).sum().item())
                except Exception as exc:
                    info["kernel_error"] = f"{type(exc).__name__}: {exc}"
        else:
            import tensorflow as tf
            gpus = tf.config.list_physical_devices("GPU")
            cuda = tf.sysconfig.get_build_info().get("cuda_version")
            info.update(version=tf.__version__, cuda=cuda, available=bool(gpus),
                        devices=len(gpus), names=[g.name for g in gpus])
            if gpus:
                try:
                    with tf.device("/GPU:0"):
                        info["kernel"] = float(tf.reduce_sum(tf.range(4.0) * 2 + 1).numpy())
                except Exception as exc:
                    info["kernel_error"] = f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
    print("PREFLIGHT " + json.dumps(info))
    """
)


# What FRAMEWORK_PROBE's kernel computes: sum(2 * [0, 1, 2, 3] + 1) (a `not 16` below says it).
KERNEL_RESULT = 16.0


def check_framework_cuda(spec: PreflightSpec, probe: GpuProbe) -> Check:
    name = "framework_cuda"
    if not spec["frameworks"]:
        return Check(name, SKIP, "no framework job runs in this image")
    found, failures, fixes = [], [], []
    facts: dict[str, Any] = {}
    for module in spec["frameworks"]:
        info, why = python_probe(FRAMEWORK_PROBE, [module], FRAMEWORK_TIMEOUT_S)
        facts[module] = info or {"error": why}
        requirements = f"images.{spec['image']}.requirements and its lock"
        if not info or "error" in info:
            failures.append(f"{module} does not import: {info.get('error') or why}")
            fixes.append(f"install {module} in the image ({requirements})")
        elif info["cuda"] is None:
            failures.append(f"{module} {info['version']} is a build without CUDA")
            fixes.append(f"install {module}'s CUDA build in the image ({requirements})")
        elif not info["available"] or not info["devices"]:
            failures.append(f"{module} {info['version']} (CUDA {info['cuda']}) sees no GPU")
            fixes.append(
                gpu_fix(spec)
                if probe.error
                else f"if the driver check failed, a newer driver for CUDA {info['cuda']}; if it "
                f"passed, {module} cannot load the CUDA libraries it was built for in this image "
                "(its message in the job's log names them): use the image's own build of it"
            )
        elif "kernel_error" in info or info.get("kernel") != KERNEL_RESULT:
            built = ", ".join(info.get("arch_list") or []) or "not stated"
            why = info.get("kernel_error") or f"a kernel computed {info.get('kernel')}, not 16"
            failures.append(
                f"{module} {info['version']} sees the GPU but cannot run on it: {why} "
                f"(compute capability {info.get('capability', '?')}; built for: {built})"
            )
            fixes.append(
                f"install a {module} built for compute capability {info.get('capability', '?')} "
                f"in the image ({requirements})"
            )
        else:
            found.append(
                f"{module} {info['version']} (CUDA {info['cuda']}) sees {info['devices']} GPU(s)"
            )
    if failures:
        return Check(name, FAIL, "; ".join(failures + found), "; ".join(fixes), facts)
    return Check(name, PASS, "; ".join(found), facts=facts)
