"""One TensorRT: an engine loads only in the TensorRT version that built it.

A ``trt`` plan is built by ``trtexec`` in a run's framework image and loaded by Triton's TensorRT
backend in its triton image; a ``tf-trt`` SavedModel's engines are built by TF-TRT in the
framework image and loaded by the TensorFlow backend's TF-TRT in the triton image. Both images
must ship the same TensorRT. Each image records the one its NGC release ships
(``images.<image>.release.tensorrt``), and the match is checked at every stage:

- while the DAG is built (:func:`check_run`): a run whose two images record different versions,
  or where either records none, is refused, naming both images and both versions;
- in the preflight (``deploybench.preflight``: checks ``trtexec`` and ``tensorrt_version``):
  the real versions in each image, read by :func:`trtexec`'s banner, :func:`backend_tensorrt`
  (the ``libnvinfer`` Triton's backend loads) and :data:`TF_TRT_PROBE` (TF-TRT's loaded
  TensorRT), against the recorded one;
- at the repository step (:func:`check_engine`): the version that built the artifact (its
  conversion provenance, and for a plan its own header) against the serving image's.

``onnx-trt`` needs no match: ONNX Runtime's TensorRT execution provider builds its engines
inside Triton when the model loads.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError, EngineVersionMismatch
from .probe import python_probe

# Converters whose artifact holds TensorRT engines built in the framework image.
ENGINE_CONVERTERS = ("tensorrt", "tf-trt")
# The Triton backend that loads each one's engines.
ENGINE_BACKENDS = {"tensorrt": "tensorrt", "tf-trt": "tensorflow"}
PROBE_TIMEOUT_S = 120

_VERSION = re.compile(r"^\d+(\.\d+)*$")
_LIBRARY = re.compile(r"libnvinfer\.so\.(\d+(?:\.\d+)*)$")
_LDD_LINE = re.compile(r"^\s*(libnvinfer\.so[.\d]*)\s*=>\s*(\S+)", re.MULTILINE)
# A serialized engine's header (TensorRT's samples/common/sampleEngines.cpp, printPlanVersion):
# uint32 tag "ftrt", uint32 serialization version 0, and at bytes 24-27 the version that built
# it (major, minor, patch, build).
PLAN_TAG = 0x74727466
PLAN_HEADER_BYTES = 28


# ---------------------------------------------------------------------------- versions


def parts(version: str) -> tuple[int, ...]:
    """``"10.8.0.43"`` as numbers."""
    text = str(version).strip()
    if not _VERSION.match(text):
        raise ConfigError(f"TensorRT version {version!r} is not numbers and dots (10.8.0.43)")
    return tuple(int(p) for p in text.split("."))


def same_release(a: str, b: str) -> bool:
    """Whether two TensorRT versions are one release, compared as far as both are known (a
    library file names major.minor.patch, a banner or header adds the build): 10.8.0 is
    10.8.0.43; 10.8.0.43 is not 10.8.0.40, nor 10.8.1."""
    x, y = parts(a), parts(b)
    n = min(len(x), len(y))
    return n >= 3 and x[:n] == y[:n]


def recorded(config: Mapping[str, Any], image: str) -> str | None:
    """``images.<image>.release.tensorrt`` (None: not recorded, or no such image)."""
    release = ((config.get("images") or {}).get(image) or {}).get("release") or {}
    value = release.get("tensorrt")
    return None if value is None else str(value)


# ---------------------------------------------------------------------------- DAG time


def check_run(
    config: Mapping[str, Any],
    path: str,
    converter: str | None,
    containers: Mapping[str, str],
) -> dict[str, str] | None:
    """The serving image and the TensorRT it must load the run's engines with (``image``,
    ``version``, ``built_in``), or None for a run whose artifact holds no engine built in its
    framework image. Raises a :class:`ConfigError` when the run's framework (convert) and triton
    (serve) images do not record the same TensorRT, naming both images and both versions."""
    if converter not in ENGINE_CONVERTERS:
        return None
    built_in, served_in = containers.get("framework"), containers.get("triton")
    model = path.split("/", 1)[0]
    if not built_in or not served_in:
        raise ConfigError(
            f"{path}: converter {converter!r} builds TensorRT engines in the framework image and "
            f"Triton loads them in the triton image: set both (models.{model}.containers)"
        )
    versions = {image: recorded(config, image) for image in (built_in, served_in)}
    missing = [image for image, version in versions.items() if version is None]
    if missing:
        raise ConfigError(
            f"{path}: its TensorRT engines ({converter}) are built in image {built_in!r} and "
            f"loaded in image {served_in!r}, which must ship the same TensorRT, but "
            + " and ".join(f"images.{image}.release.tensorrt" for image in missing)
            + " is not recorded: record the TensorRT version the image's NGC release notes "
            'list (e.g. tensorrt: "10.8.0.43")'
        )
    built, served = str(versions[built_in]), str(versions[served_in])
    if not same_release(built, served):
        raise ConfigError(
            f"{path}: a TensorRT engine loads only in the TensorRT that built it, but its "
            f"engines ({converter}) are built in image {built_in!r} with TensorRT {built} and "
            f"loaded in image {served_in!r} with TensorRT {served} (images.{built_in}.release"
            f".tensorrt, images.{served_in}.release.tensorrt): convert and serve with images "
            f"that ship one TensorRT, as one NGC release's do (models.{model}.containers)"
        )
    return {"image": served_in, "version": served, "built_in": built_in}


# ---------------------------------------------------------------------------- trtexec


def parse_banner(text: str) -> str | None:
    """The full TensorRT version in trtexec's banner, ``[TensorRT v100800] [b43]`` ->
    ``10.8.0.43`` (TensorRT's samples/common/logging.h; ``v`` is NV_TENSORRT_VERSION:
    major*10000 + minor*100 + patch from TensorRT 9 on, major*1000 + minor*100 + patch before)."""
    match = re.search(r"TensorRT v(\d{4,6})\b(?:\]\s*\[b(\d+)\])?", text)
    if not match:
        return None
    number = int(match.group(1))
    if number >= 10000:
        major, minor, patch = number // 10000, number // 100 % 100, number % 100
    else:
        major, minor, patch = number // 1000, number // 100 % 10, number % 100
    build = f".{int(match.group(2))}" if match.group(2) else ""
    return f"{major}.{minor}.{patch}{build}"


def parse_trt_version(text: str) -> tuple[int, int] | None:
    """TensorRT's version from trtexec's banner, e.g. ``[TensorRT v8501]`` -> (8, 5)."""
    release = parse_banner(text)
    return None if release is None else major_minor(release)


def major_minor(release: str) -> tuple[int, int]:
    major, minor = release.split(".")[:2]
    return int(major), int(minor)


def tf_trt_loaded_version() -> str | None:
    """The TensorRT this process's TF-TRT loaded (major.minor.patch), None if it cannot say:
    the version that built the engines a TF-TRT conversion has just serialized."""
    try:
        from tensorflow.compiler.tf2tensorrt import _pywrap_py_utils  # type: ignore[import-not-found]

        loaded = ".".join(str(p) for p in _pywrap_py_utils.get_loaded_tensorrt_version())
    except Exception:  # noqa: BLE001 - no TensorFlow, or one without TensorRT: unknown
        return None
    return loaded if loaded.strip("0.") else None  # 0.0.0: no TensorRT


# ---------------------------------------------------------------------------- a plan's header


def plan_version(path: str | Path) -> str | None:
    """The TensorRT version a serialized engine's header names (what ``trtexec
    --getPlanVersionOnly`` prints), read without TensorRT; None for a file that is not a plan
    of a header layout known here."""
    try:
        with open(path, "rb") as f:
            head = f.read(PLAN_HEADER_BYTES)
    except OSError:
        return None
    if len(head) < PLAN_HEADER_BYTES:
        return None
    tag, serialization = struct.unpack_from("<II", head)
    if tag != PLAN_TAG or serialization != 0:
        return None
    return ".".join(str(b) for b in head[24:28])


# ---------------------------------------------------------------------------- the repository step


def check_engine(artifact: str, provenance: str, expected: Mapping[str, str]) -> str:
    """Refuse (:class:`EngineVersionMismatch`) to serve an artifact whose engines another
    TensorRT built than the serving image's (``expected``: ``image``, ``version``, from
    :func:`check_run`), or one whose builder's version is unknown: that engine would fail to
    load (or, TF-TRT, be rebuilt in Triton) only when the server starts. The builder's version
    is the conversion's record (``conversion.tensorrt`` in ``provenance``) and, for a plan, its
    header; where both are known they must agree. Returns the version."""
    image, wanted = expected["image"], str(expected["version"])
    try:
        conversion = json.loads(Path(provenance).read_text()).get("conversion") or {}
    except (OSError, ValueError):
        conversion = {}
    from_record = conversion.get("tensorrt")
    from_header = plan_version(artifact) if Path(artifact).is_file() else None
    where_built = f"image {expected['built_in']!r}" if expected.get("built_in") else "its image"
    rebuild = (
        f"rebuild it in the framework image ({where_built}) with "
        f"`snakemake --forcerun {artifact} <target>`"
    )
    if from_record and from_header and not same_release(from_record, from_header):
        raise EngineVersionMismatch(
            f"{artifact}: its provenance ({provenance}) records TensorRT {from_record} but its "
            f"header names TensorRT {from_header}: which built it is unknown; {rebuild}"
        )
    built = from_record or from_header
    if built is None:
        raise EngineVersionMismatch(
            f"{artifact}: no record of the TensorRT that built it ({provenance} has no "
            "conversion.tensorrt: the converter reported no version, or the artifact predates "
            f"the record), so it cannot be checked against image {image!r}'s TensorRT {wanted} "
            f"that would load it; {rebuild}"
        )
    if not same_release(built, wanted):
        where = "its header" if from_record is None else provenance
        raise EngineVersionMismatch(
            f"{artifact} was built by TensorRT {built} ({where}), but image {image!r} serves "
            f"it with TensorRT {wanted} (images.{image}.release.tensorrt): an engine loads "
            f"only in the TensorRT that built it; {rebuild}"
        )
    return built


# ---------------------------------------------------------------------------- Triton's libnvinfer


@dataclass(frozen=True)
class Library:
    """The ``libnvinfer`` a backend loads, and its version (None: not read, see ``error``)."""

    path: Path | None
    version: str | None
    how: str  # how it was found and read
    error: str = ""


# Loads a libnvinfer in a child process (a missing dependency must not take the job down) and
# asks its version: getInferLib{Major,Minor,Patch,Build}Version (TensorRT 10's NvInferRuntime.h),
# else getInferLibVersion (NV_TENSORRT_VERSION); and which file the loader mapped.
LIBRARY_PROBE = textwrap.dedent(
    """
    import ctypes, json, sys
    info = {}
    try:
        lib = ctypes.CDLL(sys.argv[1])
        try:
            info["version"] = ".".join(str(getattr(lib, f"getInferLib{p}Version")())
                                       for p in ("Major", "Minor", "Patch", "Build"))
        except AttributeError:
            info["number"] = int(lib.getInferLibVersion())
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libnvinfer.so" in line and "/" in line:
                    info["path"] = line.split(None, 5)[-1].strip()
                    break
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
    print("PREFLIGHT " + json.dumps(info))
    """
)

# TF-TRT's own record of the TensorRT it was built against and the one it loads (0.0.0: a
# TensorFlow without TensorRT, as PyPI's).
TF_TRT_PROBE = textwrap.dedent(
    """
    import json
    info = {}
    try:
        from tensorflow.compiler.tf2tensorrt import _pywrap_py_utils as utils
        info["linked"] = ".".join(map(str, utils.get_linked_tensorrt_version()))
        loaded = ".".join(map(str, utils.get_loaded_tensorrt_version()))
        if loaded.strip("0."):
            info["loaded"] = loaded
        else:
            info["error"] = f"this TensorFlow loads no TensorRT (TF-TRT reports {loaded})"
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
    print("PREFLIGHT " + json.dumps(info))
    """
)


def run_probe(script: str, args: Sequence[str] = (), timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    """``script`` run by this Python, as the preflight runs its probes (a process group of its
    own, killed at ``timeout_s``): its last ``PREFLIGHT <json>`` line, {"error": ...} when there
    is none."""
    info, why = python_probe(script, args, timeout_s)
    return info or {"error": why}


def ldd_nvinfer(library: Path) -> Path | None:
    """The libnvinfer the dynamic loader resolves for ``library`` (``ldd``), if it links one."""
    try:
        out = subprocess.run(
            ["ldd", str(library)], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _LDD_LINE.search(out.stdout)
    return Path(match.group(2)) if match and match.group(2).startswith("/") else None


def search_path(directory: Path) -> list[Path]:
    """Where a library ``directory``'s code dlopens by name is looked for, in the loader's
    order as far as it matters here: the directory itself (Triton's backends have RPATH
    $ORIGIN), then LD_LIBRARY_PATH."""
    extra = [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    return [directory, *extra]


def named_nvinfer(directories: Sequence[Path], major: int | None) -> Path | None:
    """The first ``libnvinfer.so.<major>*`` in ``directories`` (any major when None)."""
    soname = f"libnvinfer.so.{major}"

    def fits(name: str) -> bool:
        return major is None or name == soname or name.startswith(soname + ".")

    for directory in directories:
        found = sorted(p for p in directory.glob("libnvinfer.so.*") if fits(p.name))
        if found:
            return found[0]
    return None


def library_version(path: Path) -> tuple[str | None, str]:
    """The version of the libnvinfer at ``path``: asked of the library itself, else read from
    the name of the file it is (libnvinfer.so.10 -> libnvinfer.so.10.8.0); and how."""
    info = run_probe(LIBRARY_PROBE, [str(path)])
    if info.get("version"):
        return str(info["version"]), "asked of the library"
    if info.get("number"):
        version = parse_banner(f"TensorRT v{info['number']}")
        if version:
            return version, "asked of the library (getInferLibVersion)"
    real = Path(os.path.realpath(path))
    match = _LIBRARY.search(real.name)
    if match and len(match.group(1).split(".")) >= 3:
        return match.group(1), f"the file's name, {real}"
    why = info.get("error") or "no version"
    return None, f"{real} names no major.minor.patch and loading it failed ({why})"


def backend_tensorrt(directory: Path, backend: str, major: int | None) -> Library:
    """The TensorRT Triton's ``backend`` (in backend folder ``directory``) loads: the
    ``tensorrt`` backend links libnvinfer (what ``ldd`` resolves for it); the ``tensorflow``
    backend's TF-TRT dlopens ``libnvinfer.so.<major>`` (the backend's folder, LD_LIBRARY_PATH,
    then the loader's own search, as the library probe does)."""
    own = directory / backend
    library = own / f"libtriton_{backend}.so"
    if not library.is_file():
        return Library(None, None, "", f"{library} is not there")
    found, how = None, ""
    if backend == "tensorrt":
        found, how = ldd_nvinfer(library), f"ldd {library}"
    if found is None:
        found, how = named_nvinfer(search_path(own), major), f"in {own} or LD_LIBRARY_PATH"
    if found is None:
        name = "libnvinfer.so" + (f".{major}" if major is not None else "")
        info = run_probe(LIBRARY_PROBE, [name])
        if info.get("path"):
            found, how = Path(info["path"]), f"the loader's {name}"
    if found is None:
        return Library(
            None, None, "", f"{library}: no libnvinfer found (ldd, {own}, LD_LIBRARY_PATH)"
        )
    version, read = library_version(found)
    return Library(found, version, f"{how} -> {found}; {read}", "" if version else read)
