"""Build the GPU kit: what a lent GPU machine needs to run the workflow's chain in one call.

A lent machine (the device tool's KINDS.md) has Python 3.12 with PyTorch (CUDA 13), onnx,
onnxruntime, numpy, pandas and pyyaml, no Triton server, no perf_analyzer, no Snakemake and no
package registry. It receives the working tree and the carried paths, 64 MiB in all. This
script makes one archive, ``<out>/kit.tar.xz``, holding:

* ``pytriton/tritonserver/`` and ``nvidia_pytriton.libs/``: Triton 2.51 with its python backend,
  from the ``nvidia-pytriton==0.7.0`` wheel (the same server as the CPU default's), with the
  python-backend stub of the target Python only. Not the pytriton package, which the machine
  cannot import; ``DEPLOYBENCH_TRITON_ROOT`` points ``deploybench.tools`` at the folder;
* ``perf-analyzer/bin/perf_analyzer`` from ``tritonclient==2.41.0``'s manylinux wheel (the last
  one that ships it), and ``perf-analyzer/lib/`` with the two libraries it links that the machine
  lacks, ``libcudart.so.12`` and ``libb64.so.0d``, as links to the copies pytriton bundles;
* ``site/``: the Python packages of ``requirements.txt`` (and ``requirements-in-process.txt``
  unless ``--no-in-process``) at this venv's versions, built for the target Python and platform;
* ``kit.json``: what went in (versions, wheels' sha256, sizes), beside the archive too.

Then it checks that the archive and the tree that travels fit in one call and prints the device
command (benchmarks/gpu/README.md, "The kit")::

    python benchmarks/gpu/kit/bundle.py [--python 3.12] [--out .gpukit] [--no-in-process]

Downloads go through pip (its cache), into ``--build`` (default ``.gpukit-build/``).
The archive is xz's preset 6, what makes the kit fit one call, and most of the build's time
(minutes of CPU for some 270 MB). ``--not-carried`` builds a kit that stays on this machine (the
tests' kit for this Python, run by the device command here): preset 0, seconds, the same files
in a larger archive, which is not refused for exceeding one call.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent

PYTRITON = "nvidia-pytriton==0.7.0"
PERF_ANALYZER_WHEEL = "tritonclient==2.41.0"  # the last tritonclient wheel with perf_analyzer
# manylinux tags pip matches one by one; the device is x86-64 with glibc 2.35 or newer
PLATFORMS = [
    "manylinux_2_35_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
]
# one device call: the working tree and the carried paths (the device tool's README, Limits)
CALL_LIMIT_BYTES = 64 * 1024 * 1024
# what the command writes into the tree before the archive is unpacked, and rounding
MARGIN_BYTES = 1024 * 1024
ARCHIVE = "kit.tar.xz"
MANIFEST = "kit.json"
# xz's preset for the archive: 6 (xz's default) makes the device's kit fit one call; 0 (in
# seconds, not minutes) for a kit that is not carried
XZ_PRESET = 6
XZ_PRESET_NOT_CARRIED = 0


class KitError(RuntimeError):
    """The kit cannot be built as asked; the message says why and what to do."""


def requirement_names(path: Path) -> list[str]:
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def pinned(names: list[str]) -> list[str]:
    """Each distribution at the version this venv runs (the CPU default's)."""
    specs, missing = [], []
    for name in names:
        try:
            specs.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        raise KitError(
            f"not installed in this venv ({sys.prefix}): {', '.join(missing)}; the kit bundles "
            "the versions the CPU default runs, so build it from the workflow's venv (make setup)"
        )
    return specs


def pip_for(verb: str, python: str, platforms: list[str], *args: str) -> None:
    """``pip <verb>`` of binary wheels only, for the target Python and platforms (not this
    machine's), no dependencies: every distribution is named."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        verb,
        "-q",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        *(arg for platform in platforms for arg in ("--platform", platform)),
        *args,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode:
        raise KitError(f"pip {verb} {' '.join(args)} failed:\n{result.stderr[-3000:]}")


def pip_download(specs: list[str], dest: Path, python: str, platforms: list[str]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    pip_for("download", python, platforms, "-d", str(dest), *specs)


def one_wheel(folder: Path, name: str) -> Path:
    found = sorted(folder.glob(f"{name.replace('-', '_')}-*.whl"))
    if len(found) != 1:
        raise KitError(f"expected one {name} wheel in {folder}, found {[p.name for p in found]}")
    return found[0]


def stage_server(wheel: Path, stage: Path, python: str) -> None:
    """Triton's server tree as pytriton lays it out (its binaries' RPATH reaches
    ``nvidia_pytriton.libs`` by relative paths), with one Python's stub."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            name = member.filename
            if not name.startswith(("pytriton/tritonserver/", "nvidia_pytriton.libs/")):
                continue
            stubs = "pytriton/tritonserver/python_backend_stubs/"
            if name.startswith(stubs) and not name.startswith(f"{stubs}{python}/"):
                continue
            # libpython of the 3.13 stub: the kept stub links the machine's own libpython
            if name.startswith("nvidia_pytriton.libs/libpython3"):
                continue
            archive.extract(member, stage)
            mode = member.external_attr >> 16
            if mode:
                (stage / name).chmod(mode & 0o777)
    stub = stage / "pytriton/tritonserver/python_backend_stubs" / python
    if not (stub / "triton_python_backend_stub").exists():
        raise KitError(f"{wheel.name} has no python-backend stub for Python {python}")


def stage_perf_analyzer(wheel: Path, stage: Path) -> None:
    target = stage / "perf-analyzer" / "bin" / "perf_analyzer"
    target.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        member = next(
            (m for m in archive.namelist() if m.endswith(".data/data/bin/perf_analyzer")), None
        )
        if member is None:
            raise KitError(f"{wheel.name} holds no perf_analyzer (a py3-none-any wheel?)")
        with archive.open(member) as source, target.open("wb") as sink:
            shutil.copyfileobj(source, sink)
    target.chmod(0o755)
    lib = stage / "perf-analyzer" / "lib"
    lib.mkdir()
    bundled = stage / "nvidia_pytriton.libs"
    for soname, pattern in (
        ("libcudart.so.12", "libcudart-*.so.12*"),
        ("libb64.so.0d", "libb64-*"),
    ):
        matches = sorted(bundled.glob(pattern))
        if len(matches) != 1:
            raise KitError(f"pytriton bundles {len(matches)} files like {pattern}, expected 1")
        (lib / soname).symlink_to(Path("../../nvidia_pytriton.libs") / matches[0].name)


def stage_site(wheels: list[Path], stage: Path, python: str) -> None:
    pip_for(
        "install",
        python,
        PLATFORMS,
        "--no-compile",
        "--target",
        str(stage / "site"),
        *map(str, wheels),
    )
    # console scripts name the building Python; the run uses `python -m` instead
    shutil.rmtree(stage / "site" / "bin", ignore_errors=True)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def travelling_files(repo: Path) -> list[Path]:
    """What a device call sends besides the carried paths: tracked files and untracked ones git
    does not ignore (the device tool's README), relative to ``repo``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    paths = (Path(os.fsdecode(name)) for name in filter(None, listed.split(b"\0")))
    return [p for p in paths if (repo / p).is_symlink() or (repo / p).is_file()]


def travelling_tree_bytes(repo: Path) -> int:
    return sum((repo / path).lstat().st_size for path in travelling_files(repo))


def archive(stage: Path, target: Path, preset: int = XZ_PRESET) -> None:
    tmp = target.with_name(target.name + ".tmp")
    subprocess.run(
        ["tar", "-C", str(stage), "-I", f"xz -{preset} -T0", "-cf", str(tmp), "."],
        check=True,
    )
    tmp.replace(target)


def device_command(gpu: str) -> str:
    return "bash benchmarks/gpu/kit/run.sh" + ("" if gpu == "auto" else f" {gpu}")


def build(args: argparse.Namespace) -> dict[str, object]:
    python = args.python
    build_dir = args.build
    wheels = build_dir / f"wheels-cp{python.replace('.', '')}"
    stage = build_dir / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)

    names = requirement_names(HERE / "requirements.txt")
    if args.in_process:
        names += requirement_names(HERE / "requirements-in-process.txt")
    specs = pinned(names)
    pip_download(specs, wheels / "site", python, PLATFORMS)
    pip_download([PYTRITON], wheels / "server", python, ["manylinux_2_35_x86_64"])
    pip_download([PERF_ANALYZER_WHEEL], wheels / "perf", python, ["manylinux1_x86_64"])

    # the folder keeps earlier builds' wheels: take this build's distributions only
    wanted = {canonicalize_name(spec.split("==")[0]) for spec in specs}
    site_wheels = [
        w
        for w in sorted((wheels / "site").glob("*.whl"))
        if parse_wheel_filename(w.name)[0] in wanted
    ]
    server_wheel = one_wheel(wheels / "server", "nvidia-pytriton")
    perf_wheel = one_wheel(wheels / "perf", "tritonclient")
    stage_server(server_wheel, stage, python)
    stage_perf_analyzer(perf_wheel, stage)
    stage_site(site_wheels, stage, python)

    manifest: dict[str, object] = {
        "python": python,
        "packages": specs,
        "server": {"wheel": server_wheel.name, "sha256": sha256(server_wheel)},
        "perf_analyzer": {"wheel": perf_wheel.name, "sha256": sha256(perf_wheel)},
        "wheels": {w.name: sha256(w) for w in site_wheels},
        "in_process": args.in_process,
    }
    (stage / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")

    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / ARCHIVE
    archive(stage, target, XZ_PRESET_NOT_CARRIED if args.not_carried else XZ_PRESET)
    shutil.copy2(stage / MANIFEST, args.out / MANIFEST)
    shutil.rmtree(stage)

    kit_bytes = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    tree_bytes = travelling_tree_bytes(REPO)
    total = kit_bytes + tree_bytes + MARGIN_BYTES
    summary: dict[str, object] = {
        "archive": str(target),
        "kit_bytes": kit_bytes,
        "tree_bytes": tree_bytes,
        "call_bytes": total,
        "call_limit_bytes": CALL_LIMIT_BYTES,
        "fits": total <= CALL_LIMIT_BYTES,
        # a carried path lies in the tree (an ignored folder); one outside travels with nothing
        "carry": [str(args.out.relative_to(REPO))] if args.out.is_relative_to(REPO) else [],
        "command": device_command(args.gpu),
    }
    if not summary["fits"] and not args.not_carried:
        raise KitError(
            f"the kit ({kit_bytes / 2**20:.1f} MiB) and the tree that travels "
            f"({tree_bytes / 2**20:.1f} MiB) exceed one device call's "
            f"{CALL_LIMIT_BYTES / 2**20:.0f} MiB (with {MARGIN_BYTES / 2**20:.0f} MiB margin): "
            "build with --no-in-process, or ignore large untracked files"
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="3.12", help="the device's Python (KINDS.md)")
    parser.add_argument("--out", type=Path, default=REPO / ".gpukit")
    parser.add_argument("--build", type=Path, default=REPO / ".gpukit-build")
    parser.add_argument(
        "--gpu",
        default="auto",
        help="the gpus entry the command runs (auto: run.sh picks H100-pip or H200-pip by the "
        "GPU nvidia-smi names)",
    )
    parser.add_argument(
        "--no-in-process",
        dest="in_process",
        action="store_false",
        help="leave out transformers and MONAI (the in-process fp16 checks of BERT, nnU-Net)",
    )
    parser.add_argument(
        "--not-carried",
        action="store_true",
        help="a kit that stays on this machine (the tests' kit for this Python): xz's fastest "
        "preset, seconds instead of minutes, and not refused when it would exceed one call",
    )
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.build = args.build.resolve()
    try:
        summary = build(args)
    except KitError as err:
        print(f"bundle: {err}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=1))
    print(
        f"\nkit {summary['kit_bytes'] / 2**20:.1f} MiB + tree {summary['tree_bytes'] / 2**20:.1f}"
        f" MiB of {CALL_LIMIT_BYTES / 2**20:.0f} MiB. Device call (run, timeout_s 600):\n"
        f"  carry: {json.dumps(summary['carry'])}\n  command: {summary['command']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
