"""The TensorRT checks: the image's trtexec has the flags the convert step passes and is the
recorded TensorRT (``trtexec``), and the TensorRT the image builds or loads engines with is the
recorded one (``tensorrt_version``)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from ..errors import ToolNotFound
from ..probe import run_command, tail
from .spec import FAIL, PASS, SKIP, Check, PreflightSpec
from .triton import NGC_BACKEND_DIR, full_image_fix

# Where NGC framework images keep trtexec when it is not on PATH.
NGC_TRTEXEC = Path("/usr/src/tensorrt/bin/trtexec")
TRTEXEC_TIMEOUT_S = 60


def check_trtexec(spec: PreflightSpec) -> Check:
    from ..trt_version import parse_banner, parse_trt_version, same_release

    name = "trtexec"
    if not spec["trtexec_flags"]:
        return Check(name, SKIP, "no run on this GPU converts with TensorRT in this image")
    exe = shutil.which("trtexec")
    if exe is None:
        if NGC_TRTEXEC.is_file():
            return Check(
                name,
                FAIL,
                f"trtexec is at {NGC_TRTEXEC} but not on PATH",
                f"put {NGC_TRTEXEC.parent} on PATH in the image (%environment of its definition, "
                f"images.{spec['image']}.definition)",
            )
        return Check(
            name,
            FAIL,
            "trtexec is not on PATH",
            "convert with TensorRT in an NGC image that ships it (nvcr.io/nvidia/pytorch or "
            f"tensorrt; images.{spec['image']}.from)",
        )
    out = run_command([exe, "--help"], TRTEXEC_TIMEOUT_S)
    version = parse_trt_version(out.text)
    missing = [
        flag
        for flag in spec["trtexec_flags"]
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out.text)
    ]
    facts = {"trtexec": exe, "tensorrt": ".".join(map(str, version)) if version else None}
    if out.error or version is None:
        return Check(
            name,
            FAIL,
            f"`trtexec --help` gave no TensorRT version ({out.error or f'exit {out.code}'}): "
            f"{tail(out.text, 3)}",
            f"check TensorRT's installation in the image (images.{spec['image']}.from)",
            facts,
        )
    if missing:
        return Check(
            name,
            FAIL,
            f"TensorRT {facts['tensorrt']}'s trtexec lacks {', '.join(missing)}",
            "the convert step needs TensorRT 8.4 or later: use a newer NGC release "
            f"(images.{spec['image']}.from)",
            facts,
        )
    # a plan loads only in the TensorRT that built it: this trtexec's must be the image's
    release = parse_banner(out.text) or str(facts["tensorrt"])
    wanted = (spec["release"] or {}).get("tensorrt")
    facts["tensorrt_release"] = release
    facts["recorded"] = wanted
    if wanted and not same_release(release, str(wanted)):
        return Check(
            name,
            FAIL,
            f"trtexec ({exe}) is TensorRT {release}, but images.{spec['image']}.release.tensorrt "
            f"is {wanted}: its plans would load only in TensorRT {release}, not in the serving "
            "image's recorded one",
            f"convert in an image that ships TensorRT {wanted} (images.{spec['image']}.from), or "
            f"record the version the image really ships as images.{spec['image']}.release"
            ".tensorrt (and serve with an image that ships it)",
            facts,
        )
    compared = (
        f"; images.{spec['image']}.release.tensorrt {wanted}"
        if wanted
        else f"; images.{spec['image']}.release.tensorrt is not recorded: not compared"
    )
    return Check(
        name,
        PASS,
        f"TensorRT {release} ({exe}) has {', '.join(spec['trtexec_flags'])}{compared}",
        facts=facts,
    )


# ---------------------------------------------------------------------------- TensorRT version


def check_tensorrt_version(spec: PreflightSpec) -> Check:
    """The TensorRT this image really builds engines with (framework role: TF-TRT's; trtexec's
    is the trtexec check's) or loads them with (triton role: the libnvinfer Triton's tensorrt
    backend links, and the one the tensorflow backend's TF-TRT loads), against
    ``images.<image>.release.tensorrt``: the version the DAG matched the run's other image to."""
    from .. import tools
    from ..trt_version import (
        ENGINE_BACKENDS,
        TF_TRT_PROBE,
        backend_tensorrt,
        parts,
        run_probe,
        same_release,
    )

    name = "tensorrt_version"
    engines = list(spec.get("tensorrt_engines") or [])
    if spec["role"] == "framework" and "tensorrt" in engines:
        engines.remove("tensorrt")
        if not engines:
            return Check(name, SKIP, "trtexec builds this image's engines: see the trtexec check")
    if not engines:
        return Check(name, SKIP, "no run on this GPU builds or loads a TensorRT engine here")
    image = spec["image"]
    where = f"images.{image}.release.tensorrt"
    wanted = (spec["release"] or {}).get("tensorrt")
    if not wanted:
        return Check(
            name,
            FAIL,
            f"{where} is not recorded: nothing to compare the image's TensorRT with",
            f"record the TensorRT version the image's NGC release notes list as {where}",
        )
    wanted = str(wanted)
    found: dict[str, dict[str, Any]] = {}  # what was read -> version, how, error
    if spec["role"] == "framework":  # TF-TRT (tf.experimental.tensorrt) builds them
        info = run_probe(TF_TRT_PROBE)
        found["TF-TRT"] = {
            "version": info.get("loaded"),
            "how": f"the TensorRT it loads; built against {info.get('linked')}",
            "error": info.get("error", ""),
        }
        unread_fix = f"TF-TRT needs NVIDIA's TensorFlow build (images.{image}.from)"
    else:
        try:
            directory = tools.backend_directory() or NGC_BACKEND_DIR
        except ToolNotFound as exc:
            return Check(name, FAIL, str(exc), full_image_fix(spec))
        for engine in engines:
            backend = ENGINE_BACKENDS[engine]
            library = backend_tensorrt(directory, backend, parts(wanted)[0])
            found[f"{backend} backend"] = {
                "version": library.version,
                "how": library.how,
                "library": None if library.path is None else str(library.path),
                "error": library.error,
            }
        unread_fix = "the backends must load the image's TensorRT: " + full_image_fix(spec)
    facts = {"recorded": wanted, "found": found}
    read = [
        f"{what}: TensorRT {f['version']} ({f['how']})" for what, f in found.items() if f["version"]
    ]
    other = [
        f"{what} is TensorRT {f['version']}, but {where} is {wanted}"
        for what, f in found.items()
        if f["version"] and not same_release(str(f["version"]), wanted)
    ]
    unread = [
        f"{what}: its TensorRT could not be read ({f['error'] or 'no version'})"
        for what, f in found.items()
        if not f["version"]
    ]
    if other or unread:
        fixes = []
        if other:
            fixes.append(
                f"an engine built with TensorRT {wanted} (what the run's other image records) "
                f"would not load here: record what the image really ships as {where} (the DAG "
                "then refuses the runs whose other image differs), or use an image that ships "
                f"{wanted} (images.{image}.from)"
            )
        if unread:
            fixes.append(unread_fix)
        return Check(name, FAIL, "; ".join(other + unread + read), "; ".join(fixes), facts)
    return Check(name, PASS, f"{'; '.join(read)}; {where} {wanted}", facts=facts)
