"""TEST STAND-IN for an image that `apptainer build` makes from envs/*.def: not the driver's venv.

The stand-in `apptainer` (tests/bin/apptainer) calls :func:`build` for ``build``: instead of an
NGC base with the lock installed, it makes a Python environment that holds what the image would
hold, and nothing of the environment that runs Snakemake:

- another Python: Debian 12's ``/usr/bin/python3`` (3.11.2, apt's, as the NGC bases' Python is
  Ubuntu's apt one), not the driver's (pyenv's 3.11.7 venv). Not 3.12 as in the images: the only
  torch for 3.12 this machine can reach is PyPI's CUDA wheel with ~3 GB of CUDA libraries, while
  a CPU wheel exists for 3.11;
- the lock's entries that install on it (``--require-hashes``, cut as the image rehearsal cuts
  them: tests/image_rehearsal.py ``lock_subset``), and in place of what is too big for a test or
  needs a GPU, a CPU stand-in of the same package: torch (the lock's or the base's, ``SHIPS``)
  → the CPU wheel ``torch==2.13.0``; ``onnxruntime-gpu`` → ``onnxruntime``; ``numpy`` of the
  base → the dev venv's version. Everything else the base ships is absent. A stand-in of a
  package the base ships with a version (``ships: {torch: 2.6.0a0+ecf3bae40a}``) reports that
  version, in its metadata and its ``__version__``, whatever wheel stands in for its code (the
  CPU torch standing in for the lock's CUDA torch reports the lock's version): the
  version gates of other libraries (transformers' ``is_torch_available``) see what they see in
  the image;
- for the Triton image (a definition with an ``SDK`` stage): ``/opt/tritonserver`` laid out as
  in NGC's image (``bin/tritonserver``, ``lib/``, ``backends/python`` with the stub for this
  Python) from the nvidia-pytriton wheel's server, and ``perf_analyzer`` on ``PATH`` with the
  CUDA runtime it links beside it (tools.perf_analyzer_environment).

Environments are cached by what they are made from; a ``.sif`` is a JSON file naming its
environment, which the stand-in's ``exec`` mounts as the image.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from deploybench.locks import canonical

REPO = Path(__file__).resolve().parent.parent
IMAGE_PYTHON = os.environ.get("APPTAINER_STANDIN_PYTHON", "/usr/bin/python3")
# An image whose release is on Python 3.10 (the V100's NGC 24.09 images) gets this machine's
# pyenv build of it: another interpreter again, of the images' own minor version. No CPU torch
# wheel exists for it here, so its stand-in holds no torch (standin.json says so).
OTHER_PYTHONS = {"3.10": str(Path.home() / ".pyenv" / "versions" / "3.10.13" / "bin" / "python3")}
# Bump when the recipe below changes.
RECIPE = "1"
TORCH = "torch==2.13.0"
MARK = "deploybench apptainer stand-in image"


class StandinError(RuntimeError):
    """The stand-in image cannot be made (Apptainer would fail the build too)."""


def cache_dir() -> Path:
    explicit = os.environ.get("DEPLOYBENCH_CACHE")
    base = Path(explicit) if explicit else Path.home() / ".cache" / "deploybench"
    return base / "standin-images"


def _python_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def image_python_version() -> str:
    """The stand-in images' Python version (not the driver's)."""
    return _python_version(IMAGE_PYTHON)


def _ships(text: str) -> dict[str, str]:
    """``SHIPS`` ("name==version name ...") → canonical name → version ('' when unpinned)."""
    ships = {}
    for spec in text.split():
        name, _, version = spec.partition("==")
        ships[str(canonical(name))] = version
    return ships


def image_python(release_python: str | None) -> str:
    """The stand-in interpreter for an image whose release runs ``release_python``."""
    return OTHER_PYTHONS.get(release_python or "", IMAGE_PYTHON)


def _stand_ins(skipped: list[str], ships: dict[str, str], python: str) -> list[str]:
    """CPU stand-ins for the lock's left-out entries and the base's packages that jobs use."""
    names = {str(canonical(s.split("==")[0])): s.split("==")[1] for s in skipped}
    wanted = []
    if ("torch" in names or "torch" in ships) and python.startswith("3.11."):
        wanted.append(TORCH)  # the CPU wheel on this disk is for 3.11 only
    if "onnxruntime-gpu" in names:
        wanted.append(f"onnxruntime=={names['onnxruntime-gpu']}")
    if "numpy" in ships:
        wanted.append(f"numpy=={importlib.metadata.version('numpy')}")
    return wanted


def _site_packages(env: Path) -> Path:
    return next((env / "lib").glob("python3.*/site-packages"))


def reported_versions(lock_text: str, ships: dict[str, str]) -> dict[str, str]:
    """What the stand-ins of the image's torch report: the base's build where it ships one
    (``ships``), else the lock's (a CUDA wheel, which the CPU wheel stands in for)."""
    from deploybench.locks import parse_lock

    locked = {n: v for n, (v, _) in parse_lock(lock_text).items() if n == "torch"}
    return {**locked, **{n: v for n, v in ships.items() if v}}


def report_shipped_versions(env: Path, ships: dict[str, str]) -> dict[str, str]:
    """Make each stand-in of a package the base ships with a version report that version: its
    distribution's ``Version:`` (what ``importlib.metadata`` reads) and its ``__version__``
    (``<package>/version.py`` or ``__init__.py``). Returns name → the version it replaced."""
    site = _site_packages(env)
    replaced = {}
    for name, shipped in ships.items():
        if not shipped:
            continue
        for metadata in site.glob("*.dist-info/METADATA"):
            text = metadata.read_text()
            found = re.search(r"^Name: (.+)$", text, re.MULTILINE)
            if found is None or canonical(found.group(1).strip()) != name:
                continue
            old = re.search(r"^Version: (.+)$", text, re.MULTILINE)
            assert old is not None, metadata
            replaced[name] = old.group(1).strip()
            metadata.write_text(text.replace(old.group(0), f"Version: {shipped}", 1))
            for source in (site / name / "version.py", site / name / "__init__.py"):
                if source.is_file():
                    code = source.read_text()
                    assignment = re.compile(r"^__version__(: str)? = .+$", re.MULTILINE)
                    if assignment.search(code):
                        source.write_text(assignment.sub(f"__version__ = {shipped!r}", code, 1))
                        break
    return replaced


def _triton_layout(env: Path) -> None:
    """/opt/tritonserver as NGC's image has it, from the nvidia-pytriton wheel's server."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise StandinError("the stand-in lays out tritonserver from nvidia-pytriton: not found")
    wheel = Path(spec.origin).parent / "tritonserver"
    libs = wheel.parent.parent / "nvidia_pytriton.libs"
    opt = env / "opt" / "tritonserver"
    shutil.copytree(wheel / "bin", opt / "bin")
    shutil.copytree(wheel / "backends", opt / "backends", ignore=shutil.ignore_patterns("*stub"))
    shutil.copytree(wheel / "caches", opt / "caches")
    shutil.copytree(libs, opt / "lib")  # bin/tritonserver's RPATH: ${ORIGIN}/../lib
    version = ".".join(_python_version(str(env / "bin" / "python")).split(".")[:2])
    stub = wheel / "python_backend_stubs" / version / "triton_python_backend_stub"
    shutil.copy2(stub, opt / "backends" / "python" / "triton_python_backend_stub")
    # perf_analyzer (the SDK stage's) on PATH, the CUDA runtime it links beside it
    from deploybench import tools

    shutil.copy2(tools.perf_analyzer_binary(), env / "bin" / "perf_analyzer")
    import nvidia.cuda_runtime

    cudart = Path(next(iter(nvidia.cuda_runtime.__path__))) / "lib" / "libcudart.so.12"
    shutil.copy2(cudart, env / "lib" / "libcudart.so.12")


def _make(
    env: Path, lock: Path, ships: dict[str, str], source: set[str], triton: bool, python: str
) -> dict:
    from tests.image_rehearsal import lock_subset

    subprocess.run([python, "-m", "venv", "--without-pip", str(env)], check=True)
    version = _python_version(python)
    subset, skipped = lock_subset(lock.read_text(), source, version)
    (env / "requirements.lock").write_text(subset)
    pip = [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q"]
    subprocess.run([*pip, "--no-deps", "--require-hashes", "-r", str(env / "requirements.lock")],
                   check=True, stdout=sys.stderr)  # fmt: skip
    stand_ins = _stand_ins([s.entry for s in skipped], ships, version)
    if stand_ins:
        subprocess.run([*pip, "--no-deps", *stand_ins], check=True, stdout=sys.stderr)
    reported = reported_versions(lock.read_text(), ships)
    replaced = report_shipped_versions(env, reported)
    if triton:
        _triton_layout(env)
    return {
        "python": version,
        "skipped": [f"{s.entry}: {s.reason}" for s in skipped],
        "stand_ins": stand_ins,
        # name -> [the stand-in's own version, the shipped one it reports]
        "reports_shipped": {n: [v, reported[n]] for n, v in replaced.items()},
        "absent_from_base": sorted(set(ships) - {"torch", "numpy"}),
    }


def build(definition: Path, args: dict[str, str], sif: Path) -> None:
    """Make (or reuse) the environment of the image ``definition`` builds with ``args``, and
    write ``sif`` naming it."""
    lock = Path(args["LOCK"])
    if not lock.is_absolute():
        lock = (
            (Path.cwd() / lock)
            if (Path.cwd() / lock).is_file()
            else definition.parent.parent / lock
        )
    env = environment(lock, args, image_python(args.get("PYTHON")))
    record = {"mark": MARK, "env": str(env), "definition": str(definition), "args": args}
    sif.write_text(json.dumps(record, indent=1) + "\n")


def environment(lock: Path, args: dict[str, str], python: str) -> Path:
    """The stand-in environment (made once, then reused) of an image built with ``args``
    (images.build_args) from ``lock``, on ``python``."""
    ships = _ships(args.get("SHIPS", ""))
    source = {str(canonical(s)) for s in args.get("SOURCE", "").split(",") if s}
    triton = "SDK" in args
    made_from = [RECIPE, python, lock.read_text(), sorted(ships.items()), sorted(source), triton]
    reported = reported_versions(lock.read_text(), ships)
    if reported:  # (an image with no stand-in that reports a version keeps its cached one)
        made_from.append(["reports", sorted(reported.items())])
    key = hashlib.sha256(json.dumps(made_from).encode()).hexdigest()[:16]
    env = cache_dir() / key
    if not (env / "standin.json").is_file():
        env.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f"{key}.", suffix=".partial", dir=env.parent))
        try:
            made = _make(partial / "env", lock, ships, source, triton, python)
            (partial / "env" / "standin.json").write_text(json.dumps(made, indent=1))
            try:
                (partial / "env").rename(env)
            except OSError:
                if not (env / "standin.json").is_file():  # else made by another build meanwhile
                    raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return env


def read(sif: Path) -> dict | None:
    """The stand-in image ``sif`` names (None: not one, e.g. a pulled image's stand-in)."""
    try:
        record = json.loads(sif.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) and record.get("mark") == MARK else None
