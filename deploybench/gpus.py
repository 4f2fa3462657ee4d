"""Which GPUs an image can drive: the GPU's CUDA compute capability against its image's release.

``gpus.<gpu>.compute_capability`` is the GPU's (NVIDIA's CUDA GPUs list);
``images.<image>.release.compute_capability.minimum`` the oldest its NGC release supports (the
release notes' "GPU Requirements"); ``compute_capabilities.<cc>.last_release`` the last NGC
release that still supports a compute capability the configured images do not. A run or
preflight whose GPU its image cannot drive fails while the DAG is built, naming all three.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import ConfigError


def capability(value: str) -> tuple[int, int]:
    """``"major.minor"`` as numbers, so that 7.5 < 10.0 (as strings "10.0" < "7.5")."""
    major, _, minor = str(value).partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ConfigError(f"compute capability {value!r} is not major.minor (e.g. 8.9)")
    return int(major), int(minor)


def check_gpu_runs_image(config: Mapping[str, Any], gpu: str, image: str) -> None:
    """Raise a :class:`ConfigError` when ``image``'s release does not support ``gpu``'s compute
    capability. A CPU device, an image used as is (no ``release``) or one whose release records
    no compute capability is not checked."""
    settings = config["gpus"][gpu]
    image_settings = config["images"].get(image) or {}
    supported = (image_settings.get("release") or {}).get("compute_capability") or {}
    if settings["device"] != "gpu" or "minimum" not in supported:
        return
    have, minimum = str(settings["compute_capability"]), str(supported["minimum"])
    maximum = supported.get("maximum")
    if maximum is not None and capability(have) > capability(str(maximum)):
        raise ConfigError(
            f"gpu {gpu!r} (compute capability {have}) cannot run image {image!r}: it drives "
            f"compute capability up to {maximum} only ({supported['maximum_why']}; "
            f"images.{image}.release.compute_capability.maximum). Pin a torch built for it in "
            f"the image's lock, or run {gpu!r} with another image"
        )
    if capability(have) >= capability(minimum):
        return
    dropped = (config.get("compute_capabilities") or {}).get(have) or {}
    architecture = f" ({dropped['architecture']})" if dropped.get("architecture") else ""
    last = (
        f"the last NGC release that supports {have}{architecture} is {dropped['last_release']}"
        if dropped.get("last_release")
        else f"compute_capabilities names no last NGC release that supports {have}"
    )
    raise ConfigError(
        f"gpu {gpu!r} (compute capability {have}) cannot run image {image!r}: its release "
        f"supports compute capability {minimum} and later "
        f"(images.{image}.release.compute_capability); {last}"
    )
