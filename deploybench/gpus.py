"""Which GPUs an image can drive: the GPU's CUDA compute capability against its image's release.

``gpus.<gpu>.compute_capability`` is the GPU's (NVIDIA's CUDA GPUs list);
``images.<image>.release.compute_capability.minimum`` the oldest its NGC release supports (the
release notes' "GPU Requirements"); ``compute_capabilities.<cc>.last_release`` the last NGC
release that still supports a compute capability the configured images do not, and
``last_tensorrt`` the last TensorRT that builds engines for it. An image names in
``older_gpus`` the image that runs its jobs on a GPU it cannot drive (the V100's 24.09 images
for the 25.xx ones): a run gets the newest set along those chains, one release's images
together, that drives its GPU (:func:`images_for_gpu`). A run or preflight whose GPU no set
can drive fails while the DAG is built, naming why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import ConfigError
from .trt_version import major_minor

# torch's device for a run's (gpus.<g>.device): where its framework reference is computed and
# its fp16 TorchScript made (and where the canary runs its model).
FRAMEWORK_DEVICE = {"cpu": "cpu", "gpu": "cuda"}


def capability(value: str) -> tuple[int, int]:
    """``"major.minor"`` as numbers, so that 7.5 < 10.0 (as strings "10.0" < "7.5")."""
    major, _, minor = str(value).partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ConfigError(f"compute capability {value!r} is not major.minor (e.g. 8.9)")
    return int(major), int(minor)


def check_tensorrt_drives(config: Mapping[str, Any], gpu: str, image: str) -> None:
    """Raise a :class:`ConfigError` when ``image``'s TensorRT (``release.tensorrt``) is newer
    than the last one that builds engines for ``gpu`` (``compute_capabilities.<cc>.
    last_tensorrt``): its trt, onnx-trt and tf-trt engines could not be built there."""
    settings = config["gpus"][gpu]
    release = (config["images"].get(image) or {}).get("release") or {}
    if settings["device"] != "gpu" or not release.get("tensorrt"):
        return
    have = str(settings["compute_capability"])
    last = ((config.get("compute_capabilities") or {}).get(have) or {}).get("last_tensorrt")
    if last is None:
        return
    tensorrt = str(release["tensorrt"])
    if major_minor(tensorrt) > major_minor(str(last)):
        raise ConfigError(
            f"gpu {gpu!r} (compute capability {have}) cannot run image {image!r}: its TensorRT "
            f"{tensorrt} builds no engines for it; the last TensorRT that does is {last} "
            f"(compute_capabilities.{have}.last_tensorrt)"
        )


def check_image_drives(config: Mapping[str, Any], gpu: str, image: str) -> None:
    """Raise a :class:`ConfigError` unless ``image`` drives ``gpu``: its release supports the
    GPU's compute capability and its TensorRT builds engines for it."""
    check_gpu_runs_image(config, gpu, image)
    check_tensorrt_drives(config, gpu, image)


def image_chain(config: Mapping[str, Any], image: str) -> list[str]:
    """``image`` and the images along its ``older_gpus`` chain, newest first."""
    chain = [image]
    while True:
        older = (config["images"].get(chain[-1]) or {}).get("older_gpus")
        if older is None or older in chain:
            return chain
        chain.append(older)


def images_for_gpu(
    config: Mapping[str, Any], gpu: str, containers: Mapping[str, str]
) -> dict[str, str]:
    """Role → the image that runs it on ``gpu``: the model's (``containers``) where they drive
    the GPU, else the first set along their ``older_gpus`` chains (one step of each role's at a
    time: one release's images together, as their TensorRT must match) that all do. Raises the
    newest images' :class:`ConfigError` when no set does."""
    chains = {role: image_chain(config, image) for role, image in containers.items()}
    for step in range(min(len(chain) for chain in chains.values())):
        candidate = {role: chain[step] for role, chain in chains.items()}
        try:
            for image in candidate.values():
                check_image_drives(config, gpu, image)
        except ConfigError:
            continue
        return candidate
    for image in containers.values():  # the newest images' own reason
        check_image_drives(config, gpu, image)
    tried = "; ".join(f"{role}: {' → '.join(chain)}" for role, chain in chains.items())
    raise ConfigError(f"gpu {gpu!r}: no images of one release drive it ({tried}; older_gpus)")


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
