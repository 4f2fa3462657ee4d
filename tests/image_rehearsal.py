"""Image-build rehearsal: run a definition's ``%post`` and ``%test`` for real, as root, in a
throwaway Debian 12 root that has the traits of the NGC base that matter to them.

No Apptainer or NGC image can run here, so this is the closest a definition gets to a build:

- the base is a cached ``debootstrap --variant=minbase`` root whose Python packages came from
  apt, with ``EXTERNALLY-MANAGED``, ``python3`` but no ``python``, and no compiler; each copy's
  apt-installed ``.dist-info`` loses its pip RECORD (``APT_DIST_INFO``: Debian 12 keeps it,
  the Ubuntu 24.04 bases' packaging does not); a *flavour* gives it Debian's patched pip (as
  Ubuntu's ``python3-pip`` in the tritonserver image) or an upstream pip over the apt packages
  (as the NGC framework images);
- what the base image ships is stood in for: its packages (``release.ships``) by metadata-only
  ``.dist-info`` stubs, its binaries (``tritonserver``, the SDK stage's ``perf_analyzer``, the
  CUDA runtime they link) by the ones this project runs natively;
- the lock is cut to the entries that can install on the root's Python 3.11 (the images run 3.12)
  and are not huge (torch, CUDA libraries), and the skipped ones are recorded.

Each rehearsal runs on an overlay (or a copy) of the cached base, entered with ``unshare`` and
``chroot`` in its own mount and PID namespaces, so every mount dies with the step's process, and
then its temporary directory is removed. ``%post`` runs as Apptainer runs it (``/bin/sh -ex
/.post.script``, apptainer 917d665 ``internal/pkg/build/util.go``), ``%test`` as ``apptainer
test`` does (the ``/.singularity.d/env`` scripts sourced, then the section as a ``#!/bin/sh``
script: only its last command's status counts), and then a *job* check: what Snakemake runs for
a ``script:`` rule in the image (``bash -c 'set -euo pipefail; python <script>'``). The three
steps always run (after a failed ``%post`` on what it left; a real build would stop there).

Run as ``python -m tests.image_rehearsal <image> [--source DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from deploybench.locks import lock_format

MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
BASE_PACKAGES = (
    "python3-pip,python3-setuptools,python3-wheel,python3-yaml,python3-six,ca-certificates"
)
# Bump when the base's recipe changes without its debootstrap arguments changing.
BASE_VERSION = "1"
# The root's interpreter and C library (Debian 12): what a lock entry must install on.
ROOT_PYTHON = "3.11.2"
ROOT_GLIBC_MINOR = 36
UPSTREAM_PIP = "pip==24.3.1"
MAX_WHEEL_BYTES = 25 * 1024 * 1024
# The NGC 25.xx bases are Ubuntu 24.04 (glibc 2.39): a binary built for them may need a glibc
# newer than the root's, and then a step that fails to load it says nothing of the image.
NGC_GLIBC_MINOR = 39
GLIBC_NOTE = (
    "inconclusive: a binary needs a newer glibc than the root's (Debian 12: 2.36) that the NGC "
    "bases have (Ubuntu 24.04: 2.39), so it cannot load here but may in the real image"
)
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PYPI = "https://pypi.org/pypi"
STEP_TIMEOUT_S = 1800
TAIL_LINES = 40
HEAD_LINES = 6
SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"

# Which pip the NGC base runs:
# - tritonserver: Ubuntu's apt python3-pip, never upgraded (server build.py, r25.01 and r25.02:
#   `pip3 install --upgrade pip` is in the RHEL branch only), so Debian-patched: it leaves what
#   apt installed in /usr/lib/python3/dist-packages alone;
# - pytorch, tensorflow: an upstream pip over apt-installed packages, which fails on their
#   missing RECORD files: reported on nvcr.io/nvidia/pytorch:26.02-py3 ("Cannot uninstall wheel
#   0.42.0 ... no RECORD file was found ... installed by debian", NVIDIA-BioNeMo/bionemo-recipes
#   PR 1489). NVIDIA's notes do not state the 25.01/25.02 images' pip: the worse case is taken.
FLAVOURS: dict[str, str] = {
    "nvcr.io/nvidia/tritonserver": "debian-pip",
    "nvcr.io/nvidia/pytorch": "upstream-pip",
    "nvcr.io/nvidia/tensorflow": "upstream-pip",
}


class RehearsalError(RuntimeError):
    """The rehearsal itself could not be set up (not a finding about the definition)."""


# --- the cached base ------------------------------------------------------------------------


def cache_dir() -> Path:
    explicit = os.environ.get("DEPLOYBENCH_CACHE")
    if explicit:
        return Path(explicit) / "rehearsal"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "deploybench" / "rehearsal"


def debootstrap_args(mirror: str = MIRROR) -> list[str]:
    return ["--variant=minbase", f"--include={BASE_PACKAGES}", SUITE, mirror]


def base_path(mirror: str = MIRROR) -> Path:
    key = hashlib.sha256(json.dumps([debootstrap_args(mirror), BASE_VERSION]).encode())
    return cache_dir() / f"base-{key.hexdigest()[:16]}"


def base_root(mirror: str = MIRROR, log: Path | None = None) -> Path:
    """The cached base root, made on first use (in a sibling renamed when complete, so a
    half-made root is never used)."""
    final = base_path(mirror)
    if final.is_dir():
        return final
    if shutil.which("debootstrap") is None:
        raise RehearsalError("debootstrap is not installed (apt-get install -y debootstrap)")
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{final.name}.", suffix=".partial", dir=final.parent))
    try:
        root = partial / "root"
        cmd = ["debootstrap", *debootstrap_args(mirror)]
        cmd.insert(-1, str(root))  # debootstrap SUITE TARGET MIRROR
        out = subprocess.run(
            cmd, check=False, capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        if log is not None:
            log.write_text(out.stdout + out.stderr)
        if out.returncode != 0:
            raise RehearsalError(f"debootstrap failed:\n{tail(out.stdout + out.stderr)}")
        try:
            root.rename(final)
        except OSError:
            if not final.is_dir():  # else another process finished first: use its root
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final


# --- can a rehearsal run here? --------------------------------------------------------------


def _reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=15):
            return True
    except (urllib.error.URLError, OSError):
        return False


def skip_reason(mirror: str = MIRROR) -> str | None:
    """Why a rehearsal cannot run on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "image rehearsal needs root (it runs chroot and mounts)"
    for tool in ("unshare", "chroot", "mount"):
        if shutil.which(tool) is None:
            return f"image rehearsal needs {tool!r} on PATH"
    probe = subprocess.run(
        ["unshare", "--mount", "--pid", "--fork", "--kill-child", "true"],
        check=False,
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"no permission for mount/PID namespaces (unshare): {probe.stderr.strip()}"
    if not base_path(mirror).is_dir() and shutil.which("debootstrap") is None:
        return "image rehearsal needs debootstrap (apt-get install -y debootstrap)"
    # %post installs with apt and pip, so the network is needed even with a cached base.
    if not _reachable(f"{mirror}/dists/{SUITE}/Release"):
        return f"the Debian mirror {mirror} is not reachable"
    if not _reachable(f"{PYPI}/pip/json"):
        return "PyPI is not reachable"
    return None


# --- definition files -----------------------------------------------------------------------


@dataclasses.dataclass
class Section:
    name: str  # "post", "files", ...
    args: str  # what follows the name on its line ("from sdk")
    lines: list[str]

    @property
    def body(self) -> str:
        return "\n".join(self.lines).strip("\n") + "\n"


@dataclasses.dataclass
class Stage:
    header: dict[str, str]
    sections: list[Section]

    @property
    def name(self) -> str:
        return self.header.get("stage", "")

    def section(self, name: str) -> Section | None:
        found = [s for s in self.sections if s.name == name]
        if len(found) > 1:
            raise RehearsalError(f"stage {self.name!r}: more than one %{name} section")
        return found[0] if found else None

    def files(self) -> list[tuple[str, str, str]]:
        """(from stage or "", source, destination) of each %files line."""
        out = []
        for section in self.sections:
            if section.name != "files":
                continue
            args = section.args.split()
            source_stage = args[1] if len(args) == 2 and args[0] == "from" else ""
            for line in section.lines:
                words = line.split("#", 1)[0].split()
                if not words:
                    continue
                out.append((source_stage, words[0], words[-1]))
        return out


def parse_definition(text: str) -> list[Stage]:
    """The stages of a definition: header keys (lower case) and sections, in order. A
    ``Bootstrap:`` line opens a stage, also right after another stage's sections."""
    stages: list[Stage] = []
    section: Section | None = None
    for line in text.splitlines():
        header = re.match(r"^([A-Za-z]+):\s*(.*?)\s*$", line)
        if header and header.group(1).lower() == "bootstrap":
            stages.append(Stage({}, []))
            section = None
        opening = re.match(r"^%(\w+)\s*(.*?)\s*$", line)
        if section is None and not opening and (not line.strip() or line.startswith("#")):
            continue  # blank lines and comments outside sections
        if not stages:
            raise RehearsalError(f"definition does not open with Bootstrap: {line!r}")
        if opening:
            section = Section(opening.group(1).lower(), opening.group(2), [])
            stages[-1].sections.append(section)
        elif section is not None:
            section.lines.append(line)
        elif header:
            stages[-1].header[header.group(1).lower()] = header.group(2)
        else:
            raise RehearsalError(f"unparsed definition line: {line!r}")
    return stages


def argument_defaults(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of every %arguments section."""
    defaults: dict[str, str] = {}
    for stage in parse_definition(text):
        for section in stage.sections:
            if section.name == "arguments":
                for line in section.lines:
                    key, sep, value = line.split("#", 1)[0].strip().partition("=")
                    if sep:
                        defaults[key.strip()] = value.strip()
    return defaults


def substitute(text: str, args: dict[str, str]) -> str:
    """``{{ NAME }}`` replaced by its build argument; an unknown name is an error, as in
    Apptainer."""

    def value(match: re.Match[str]) -> str:
        if match.group(1) not in args:
            raise RehearsalError(f"build argument {match.group(1)} has no value")
        return args[match.group(1)]

    return re.sub(r"\{\{\s*(\w+)\s*\}\}", value, text)


def resolve(text: str, build_args: list[str]) -> list[Stage]:
    """The definition's stages with its build arguments substituted (``build_args``:
    ``KEY=VALUE`` over the %arguments defaults)."""
    args = argument_defaults(text)
    args.update(dict(arg.split("=", 1) for arg in build_args))
    return parse_definition(substitute(text, args))


# --- the lock's subset that fits the root ---------------------------------------------------


# The lock format's one reader (envs/install_lock.py, as the images install with it).
install_lock = lock_format()
LockEntry = install_lock.Entry


@dataclasses.dataclass(frozen=True)
class Skipped:
    entry: str  # name==version
    reason: str


def parse_lock(text: str) -> tuple[str, list[LockEntry]]:
    """The lock's opening comment and its ``name==version`` entries."""
    try:
        header, entries = install_lock.parse(text)
    except install_lock.LockFormatError as exc:
        raise RehearsalError(f"lock: {exc}") from exc
    return header, entries


def root_tags(python: str = ROOT_PYTHON) -> frozenset[Tag]:
    """Wheel tags pip accepts on the root (or on another CPython ``python``, "3.10"): CPython,
    manylinux up to the root's glibc, x86_64."""
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(ROOT_GLIBC_MINOR, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    platforms.append("linux_x86_64")
    version = tuple(int(part) for part in python.split(".")[:2])
    tags = [*cpython_tags(version, platforms=platforms)]
    tags += compatible_tags(version, "cp" + "".join(map(str, version)), platforms=platforms)
    return frozenset(tags)


def pypi_files(name: str, version: str) -> list[dict[str, Any]]:
    """The files of one release on PyPI, cached per release (a release's files do not change;
    the project's JSON is read, as this index does not serve the per-release one)."""
    path = cache_dir() / "pypi" / canonicalize_name(name) / f"{version}.json"
    if not path.is_file():
        url = f"{PYPI}/{canonicalize_name(name)}/json"
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                releases = json.load(response)["releases"]
        except urllib.error.URLError as exc:
            raise RehearsalError(f"{url}: {exc}") from exc
        if version not in releases:
            raise RehearsalError(f"{name}=={version} is not on PyPI")
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.partial")
        partial.write_text(json.dumps(releases[version]))
        partial.replace(path)
    files: list[dict[str, Any]] = json.loads(path.read_text())
    return files


def _python_fits(requires: str | None, python: str = ROOT_PYTHON) -> bool:
    try:
        return not requires or SpecifierSet(requires).contains(python, prereleases=True)
    except InvalidSpecifier:
        return True  # pip ignores what it cannot parse


def _file_fits(
    file: dict[str, Any], from_source: bool, tags: frozenset[Tag], python: str = ROOT_PYTHON
) -> str | None:
    """Why this (locked) file cannot install on the root, or None when it can."""
    if not _python_fits(file.get("requires_python"), python):
        return f"requires Python {file['requires_python']}"
    if file["packagetype"] == "sdist":
        return None if from_source else "sdist (wheels only, not in SOURCE)"
    if from_source:
        return "wheel (built from source: SOURCE)"
    if tags.isdisjoint(parse_wheel_filename(file["filename"])[3]):
        return f"no wheel for CPython {python} manylinux_2_{ROOT_GLIBC_MINOR} x86_64"
    if file["size"] > MAX_WHEEL_BYTES:
        return f"{file['size'] // 2**20} MB wheel"
    return None


def entry_skip_reason(
    entry: LockEntry, source: set[str], tags: frozenset[Tag], python: str = ROOT_PYTHON
) -> str | None:
    """Why a lock entry is left out of the rehearsal, or None when it is installed."""
    files = pypi_files(entry.name, entry.version)
    locked = [f for f in files if f["digests"]["sha256"] in entry.hashes]
    if not locked:
        return "none of its hashes is a file on PyPI"
    from_source = canonicalize_name(entry.name) in source
    reasons = [_file_fits(f, from_source, tags, python) for f in locked]
    if None in reasons:
        return None
    # The reason of the file that came closest (a wheel that fits but for its size first).
    rank = ("MB wheel", "requires Python", "sdist", "wheel (built", "no wheel")
    return min((r for r in reasons if r), key=lambda r: [k in r for k in rank].index(True))


def lock_subset(
    text: str, source: set[str], python: str = ROOT_PYTHON
) -> tuple[str, list[Skipped]]:
    """The lock cut to the entries that fit the root with CPython ``python`` (verbatim, all
    their hashes kept), and the entries left out with the reason."""
    header, entries = parse_lock(text)
    tags = root_tags(python)
    kept: list[str] = []
    skipped: list[Skipped] = []
    # PyPI answers are fetched in parallel on a cold cache (a lock has up to ~90 entries).
    with ThreadPoolExecutor(max_workers=8) as pool:
        reasons = list(pool.map(lambda e: entry_skip_reason(e, source, tags, python), entries))
    for entry, reason in zip(entries, reasons, strict=True):
        if reason is None:
            kept.append(entry.text)
        else:
            skipped.append(Skipped(f"{entry.name}=={entry.version}", reason))
    note = f"# image rehearsal: the entries that install on Python {python} (see skipped.txt)"
    return "\n".join([header, note, *kept]) + "\n", skipped


# --- what the bases provide -----------------------------------------------------------------


def _cuda_runtime() -> Path:
    import nvidia.cuda_runtime  # the CPU venv's CUDA runtime (perf_analyzer links it)

    return Path(next(iter(nvidia.cuda_runtime.__path__))) / "lib" / "libcudart.so.12"


def _perf_analyzer() -> Path:
    from deploybench.tools import perf_analyzer_binary

    return perf_analyzer_binary()


def _tritonserver() -> Path:
    from deploybench.tools import tritonserver_binary

    return tritonserver_binary()


CUDA_LIB = "/usr/local/cuda/lib64"
# Stand-ins for the files an NGC base holds that a definition uses: path in the image → where
# the native install has it. The binaries are real; tritonserver may not run without the rest
# of its install (triton.def's %test falls back to `test -x`).
PROVIDES: dict[str, dict[str, Callable[[], Path]]] = {
    "nvcr.io/nvidia/tritonserver": {
        "/opt/tritonserver/bin/tritonserver": _tritonserver,
        f"{CUDA_LIB}/libcudart.so.12": _cuda_runtime,
    },
    # The SDK image builds perf_analyzer into /workspace/install/bin and pip-installs the
    # tritonclient wheel built beside it, whose bin/perf_analyzer lands in /usr/local/bin
    # (triton-inference-server/server r25.01 Dockerfile.sdk: COPY .../workspace/install/,
    # `pip3 install --upgrade` of tritonclient-*linux*.whl, ENV PATH=/workspace/install/bin).
    "nvcr.io/nvidia/tritonserver:sdk": {
        "/workspace/install/bin/perf_analyzer": _perf_analyzer,
        "/usr/local/bin/perf_analyzer": _perf_analyzer,
        f"{CUDA_LIB}/libcudart.so.12": _cuda_runtime,
    },
}


def base_key(ref: str) -> str:
    """The image repository of a base reference (``:sdk`` for an SDK tag)."""
    repository, _, tag = ref.partition(":")
    return f"{repository}:sdk" if tag.endswith("-sdk") else repository


def flavour_of(ref: str) -> str:
    try:
        return FLAVOURS[base_key(ref)]
    except KeyError:
        raise RehearsalError(f"no pip flavour recorded for base {ref!r} (FLAVOURS)") from None


# --- staging files into the root ------------------------------------------------------------


def _copy_into(stage: Path, source: Path, destination: str) -> None:
    """``source`` at ``destination`` of the root (as %files: a file or a directory tree)."""
    target = stage / destination.lstrip("/")
    if destination.endswith("/") or (target.is_dir() and source.is_file()):
        target = target / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
    else:
        shutil.copy2(source, target)


def _write(stage: Path, path: str, text: str, mode: int = 0o644) -> None:
    target = stage / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(mode)


def ships_stub(stage: Path, name: str, version: str | None) -> None:
    """A metadata-only ``.dist-info`` so that ``importlib.metadata.version(name)`` answers as
    the NGC base would (``0+rehearsal`` where config records no version). Nothing imports."""
    version = version or "0+rehearsal"
    dist = f"{SITE_PACKAGES}/{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        "Summary: image rehearsal stand-in for the base's build (metadata only)\n",
        "INSTALLER": "rehearsal\n",
    }
    for file, text in files.items():
        _write(stage, f"{dist}/{file}", text)
    record = [f"{dist.split('/')[-1]}/{f},," for f in [*files, "RECORD"]]
    _write(stage, f"{dist}/RECORD", "\n".join(record) + "\n")


def stage_host_network(stage: Path) -> None:
    """DNS and the host's trust anchors, so apt and pip reach what the host reaches (the
    network is shared; a TLS-inspecting proxy signs with a host-only CA)."""
    _copy_into(stage, Path("/etc/resolv.conf").resolve(), "/etc/resolv.conf")
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if bundle.is_file():
        _copy_into(stage, bundle, "/etc/ssl/certs/ca-certificates.crt")
    # Kept where update-ca-certificates (an apt trigger) reads them, so a rebuilt bundle keeps
    # them too.
    local = Path("/usr/local/share/ca-certificates")
    for cert in sorted(local.glob("*.crt")) if local.is_dir() else []:
        _copy_into(stage, cert, f"/usr/local/share/ca-certificates/{cert.name}")


def stage_provided(stage: Path, base: str, paths: list[str] | None = None) -> None:
    """The stand-ins of ``base`` (those at ``paths``, or all)."""
    provided = PROVIDES.get(base_key(base), {})
    for path in paths if paths is not None else list(provided):
        if path not in provided:
            raise RehearsalError(f"the rehearsal has no stand-in for {path} of {base}")
        _copy_into(stage, provided[path](), path)
    if any(p.startswith(CUDA_LIB) for p in provided):
        _write(stage, "/etc/ld.so.conf.d/000_cuda.conf", CUDA_LIB + "\n")


# Apptainer's test action (sources /.singularity.d/env/*.sh, then execs the test), and what a
# Snakemake `script:` job runs in the image after its exec action does the same.
ENV_SOURCING = 'for s in /.singularity.d/env/*.sh; do if [ -f "$s" ]; then . "$s"; fi; done; '
TEST_COMMAND = ENV_SOURCING + "exec /.singularity.d/test"
JOB_SCRIPT = "/.rehearsal/job.py"
JOB_COMMAND = ENV_SOURCING + f"exec bash -c 'set -euo pipefail; python {JOB_SCRIPT}'"
JOB_SOURCE = "import sys\n\nimport yaml\n\nprint(sys.version, yaml.__version__)\n"


def test_script(section: Section | None) -> str:
    """/.singularity.d/test as Apptainer writes it: ``#!/bin/sh`` unless the section has its own
    shebang (so without ``-e``: the last command's status is the test's)."""
    if section is None:
        return "#!/bin/sh\n\ntrue\n"
    body = section.body
    if body.lstrip().startswith("#!"):
        shebang, _, body = body.lstrip().partition("\n")
    else:
        shebang = "#!/bin/sh"
    if section.args:
        shebang += " " + section.args.split("#", 1)[0].strip()
    return f"{shebang}\n\n{body}\n"


# --- running in the root --------------------------------------------------------------------

# Run by /bin/sh in the new mount and PID namespaces: the root's mounts (gone with the
# namespace), the staged files, then chroot. Arguments: root lower upper work stage apt-cache.
NAMESPACE_SCRIPT = r"""
set -eu
root=$1 lower=$2 upper=$3 work=$4 stage=$5 apt=$6
shift 6
if [ -n "$lower" ]; then
    mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$root"
fi
if [ -n "$stage" ]; then cp -R --preserve=mode,timestamps "$stage"/. "$root"/; fi
mount -t proc proc "$root/proc"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
mount -t tmpfs -o mode=755,nosuid tmpfs "$root/dev"
for d in null zero full random urandom tty; do
    touch "$root/dev/$d"; mount --bind "/dev/$d" "$root/dev/$d"
done
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$root/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
ln -s pts/ptmx "$root/dev/ptmx"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
mkdir -p "$root/var/cache/apt/archives"
mount --bind "$apt" "$root/var/cache/apt/archives"
exec chroot "$root" "$@"
"""


@dataclasses.dataclass
class StepResult:
    name: str  # "post", "test" or "job"
    returncode: int
    output_tail: str  # the output's last lines (after its first few, where it is long)
    log: Path
    seconds: float

    @property
    def passed(self) -> bool:
        return self.returncode == 0

    @property
    def inconclusive(self) -> bool:
        """Whether this step failed for want of a glibc the NGC base has and the root has not."""
        needed = re.findall(r"version `GLIBC_2\.(\d+)' not found", self.output_tail)
        newer = [ROOT_GLIBC_MINOR < int(minor) <= NGC_GLIBC_MINOR for minor in needed]
        return not self.passed and bool(newer) and all(newer)


@dataclasses.dataclass
class RehearsalResult:
    image: str
    flavour: str
    steps: list[StepResult]
    skipped: list[Skipped]  # lock entries left out
    log_dir: Path

    @property
    def passed(self) -> bool:
        return len(self.steps) == 3 and all(step.passed for step in self.steps)

    def failures(self) -> list[StepResult]:
        return [step for step in self.steps if not step.passed]

    @property
    def inconclusive(self) -> bool:
        """Failed, but only in steps whose failure may be the root's (``StepResult``)."""
        failures = self.failures()
        return bool(failures) and all(step.inconclusive for step in failures)

    def report(self) -> str:
        lines = [f"image {self.image} ({self.flavour}): {'passed' if self.passed else 'FAILED'}"]
        for step in self.steps:
            lines.append(
                f"--- {step.name}: exit {step.returncode} in {step.seconds:.0f} s (log {step.log})"
            )
            if not step.passed:
                lines.append(step.output_tail.rstrip())
        if self.steps and not self.steps[0].passed:
            lines.append("note: a real build stops at a failed %post; test and job ran on its root")
        for step in self.steps:
            if step.inconclusive:
                lines.append(f"note: {step.name} is {GLIBC_NOTE}")
        if self.skipped:
            lines.append(f"--- lock entries left out: {len(self.skipped)}")
            lines += [f"    {s.entry}: {s.reason}" for s in self.skipped]
        return "\n".join(lines)


def tail(text: str, lines: int = TAIL_LINES, head: int = 0) -> str:
    """The last ``lines`` lines of ``text``, after its first ``head`` ones where it is longer
    (a failing command's first words can be followed by pages of usage)."""
    all_lines = text.rstrip().splitlines()
    if len(all_lines) <= head + lines:
        return "\n".join(all_lines)
    cut = f"[... {len(all_lines) - head - lines} lines ...]"
    return "\n".join([*all_lines[:head], cut, *all_lines[-lines:]])


def _overlay_works(base: Path, scratch: Path) -> bool:
    for name in ("u", "w", "m"):
        (scratch / name).mkdir(parents=True)
    probe = subprocess.run(
        ["unshare", "--mount", "--", "mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={base},upperdir={scratch}/u,workdir={scratch}/w", str(scratch / "m")],
        check=False, capture_output=True,
    )  # fmt: skip
    shutil.rmtree(scratch)
    return probe.returncode == 0


@dataclasses.dataclass
class Root:
    """A throwaway copy of the base: an overlay (upper and work in ``tmp``) or a full copy."""

    tmp: Path
    base: Path
    overlay: bool
    apt_cache: Path

    @property
    def mountpoint(self) -> Path:
        return self.tmp / "root"

    def run(
        self, argv: list[str], log: Path, stage: Path | None = None, timeout: int = STEP_TIMEOUT_S
    ) -> int:
        """``argv`` in the root as root, with a clean container environment; output to ``log``."""
        layers = [str(self.base), str(self.tmp / "upper"), str(self.tmp / "work")]
        env = ["PATH=" + CONTAINER_PATH, "HOME=/root", "LANG=C.UTF-8", "TERM=dumb"]
        cmd = ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--"]
        cmd += ["/bin/sh", "-c", NAMESPACE_SCRIPT, "rehearsal", str(self.mountpoint)]
        cmd += layers if self.overlay else ["", "", ""]
        cmd += [str(stage or ""), str(self.apt_cache), "/usr/bin/env", "-i", *env, *argv]
        with log.open("ab") as out:
            # A session of its own, killed whole on any way out (a timeout, Ctrl-C, an error):
            # unshare's --kill-child then ends everything in the step's PID namespace.
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                out.write(f"\n[rehearsal] timed out after {timeout} s\n".encode())
                return 124
            finally:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


@contextmanager
def fresh_root(base: Path) -> Iterator[Root]:
    """A copy of ``base`` for one rehearsal, removed afterwards (mounts only ever exist in the
    steps' own namespaces, so they end with them)."""
    apt_cache = cache_dir() / "apt-archives"
    (apt_cache / "partial").mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="rehearsal-"))
    try:
        overlay = _overlay_works(base, tmp / "probe")
        (tmp / "root").mkdir()
        if overlay:
            (tmp / "upper").mkdir()
            (tmp / "work").mkdir()
        else:
            subprocess.run(["cp", "-a", f"{base}/.", str(tmp / "root")], check=True)
        yield Root(tmp, base, overlay, apt_cache)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def mounts_under(path: Path) -> list[str]:
    """Mount points in this namespace under ``path`` (a rehearsal must leave none)."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if p == str(path) or p.startswith(f"{path}/")]


# --- a rehearsal ----------------------------------------------------------------------------


@dataclasses.dataclass
class Plan:
    """What one rehearsal runs: a definition with its build arguments, and the base's traits."""

    definition: str  # its text
    build_args: list[str]
    source_dir: Path  # relative %files sources are read from here
    flavour: str | None = None  # None: FLAVOURS of the final stage's base
    ships: dict[str, str | None] = dataclasses.field(default_factory=dict)
    replace_files: dict[str, Path] = dataclasses.field(default_factory=dict)  # host → host


# Debian 12's apt-installed dist-infos keep pip's RECORD (python3-yaml 6.0-3 does), but newer
# Debian and Ubuntu packaging (dh-python's pyproject plugin: Debian 13's python3-yaml 6.0.2-1+b2
# ships INSTALLER, METADATA, WHEEL, top_level.txt and no RECORD) drops it, as in the Ubuntu 24.04
# NGC bases: made so here, so that an upstream pip fails on them as it would there.
APT_DIST_INFO = (
    "for d in /usr/lib/python3/dist-packages/*.dist-info; do"
    ' rm -f "$d/RECORD"; echo debian > "$d/INSTALLER"; done'
)


def _prepare(root: Root, stage: Path, flavour: str, log: Path) -> None:
    """Stage the files and make the base's flavour; a failure here is the rehearsal's own."""
    script = f"{APT_DIST_INFO} && ldconfig"
    if flavour == "upstream-pip":
        script += f" && python3 -m pip install -q --break-system-packages '{UPSTREAM_PIP}'"
        script += " && python3 -m pip --version"
    elif flavour != "debian-pip":
        raise RehearsalError(f"unknown flavour {flavour!r}")
    code = root.run(["/bin/sh", "-c", script], log, stage=stage)
    if code != 0:
        raise RehearsalError(f"preparing the root failed (exit {code}):\n{tail(log.read_text())}")


def _stage_definition(stage: Path, stages: list[Stage], plan: Plan) -> Stage:
    """Stage the final stage's %files (``from`` an earlier stage: that base's stand-ins) and
    scripts; returns that stage."""
    final = stages[-1]
    for earlier in stages[:-1]:
        if any(s.name in ("post", "test") for s in earlier.sections):
            raise RehearsalError(f"stage {earlier.name!r}: only the final stage is rehearsed")
    bases = {s.name: s.header.get("from", "") for s in stages}
    for from_stage, source, destination in final.files():
        if from_stage:
            provided = PROVIDES.get(base_key(bases.get(from_stage, "")), {})
            if source not in provided:
                raise RehearsalError(f"no stand-in for {source} of stage {from_stage}")
            _copy_into(stage, provided[source](), destination)
            continue
        host = Path(source) if Path(source).is_absolute() else plan.source_dir / source
        _copy_into(stage, plan.replace_files.get(str(host.resolve()), host), destination)
    post = final.section("post")
    _write(stage, "/.post.script", post.body if post else "", 0o755)
    environment = final.section("environment")
    env_script = f"#!/bin/sh\n\n{environment.body if environment else ''}\n"
    _write(stage, "/.singularity.d/env/90-environment.sh", env_script, 0o755)
    _write(stage, "/.singularity.d/test", test_script(final.section("test")), 0o755)
    _write(stage, JOB_SCRIPT, JOB_SOURCE)
    return final


def rehearse(plan: Plan, log_dir: Path, mirror: str = MIRROR, name: str = "") -> RehearsalResult:
    """Run the plan's %post, %test and the job check in a fresh copy of the base."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stages = resolve(plan.definition, plan.build_args)
    base_ref = stages[-1].header.get("from", "")
    flavour = plan.flavour or flavour_of(base_ref)
    base = base_root(mirror, log_dir / "debootstrap.log")
    with tempfile.TemporaryDirectory(prefix="rehearsal-stage-") as staging:
        stage = Path(staging)
        stage.chmod(0o755)  # copied onto the root's "/" with its mode
        stage_host_network(stage)
        stage_provided(stage, base_ref)
        for dist, version in plan.ships.items():
            ships_stub(stage, dist, version)
        _stage_definition(stage, stages, plan)
        with fresh_root(base) as root:
            _prepare(root, stage, flavour, log_dir / "prepare.log")
            steps = [
                _step(root, "post", ["/bin/sh", "-ex", "/.post.script"], log_dir),
                _step(root, "test", ["/bin/sh", "-c", TEST_COMMAND], log_dir),
                _step(root, "job", ["/bin/sh", "-c", JOB_COMMAND], log_dir),
            ]
    return RehearsalResult(name or base_ref, flavour, steps, [], log_dir)


def _step(root: Root, name: str, argv: list[str], log_dir: Path) -> StepResult:
    log = log_dir / f"{name}.log"
    log.write_text(f"$ {' '.join(argv)}\n")
    start = time.monotonic()
    code = root.run(argv, log)
    seconds = time.monotonic() - start
    output = tail(log.read_text(errors="replace"), head=HEAD_LINES)
    return StepResult(name, code, output, log, seconds)


# --- the project's images -------------------------------------------------------------------


def load_config(source_dir: Path) -> dict[str, Any]:
    return yaml.safe_load((source_dir / "config" / "config.yaml").read_text())


def built_images(source_dir: Path) -> list[str]:
    """The images the workflow builds from a definition."""
    from deploybench import locks  # the installed package, as image_plan's images

    return list(locks.built_images(load_config(source_dir)))


def image_plan(name: str, source_dir: Path, log_dir: Path) -> tuple[Plan, list[Skipped]]:
    """The plan of a configured image: its definition and build arguments as rule
    ``container_image`` passes them, its lock cut to what fits (written to ``log_dir``)."""
    from deploybench import images  # the installed package: its build_args is the rule's

    config = load_config(source_dir)
    image = images.in_source_tree(config["images"][name], source_dir)
    # the root's Python stands in for the base's (the lock is cut to what installs on it)
    args = [
        f"PYTHON={'.'.join(ROOT_PYTHON.split('.')[:2])}" if arg.startswith("PYTHON=") else arg
        for arg in images.build_args(image)
    ]
    source = {str(canonicalize_name(n)) for n in image.get("from_source") or []}
    subset, skipped = lock_subset(Path(image["lock"]).read_text(), source)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "requirements.lock").write_text(subset)
    (log_dir / "skipped.txt").write_text("".join(f"{s.entry}: {s.reason}\n" for s in skipped))
    plan = Plan(
        definition=Path(image["definition"]).read_text(),
        build_args=args,
        source_dir=source_dir,
        ships=(image.get("release") or {}).get("ships") or {},
        replace_files={str(Path(image["lock"]).resolve()): log_dir / "requirements.lock"},
    )
    return plan, skipped


def rehearse_image(
    name: str, source_dir: Path, log_dir: Path | None = None, mirror: str = MIRROR
) -> RehearsalResult:
    """Rehearse the build of the configured image ``name`` from the tree ``source_dir``."""
    log_dir = log_dir or cache_dir() / "logs" / name
    plan, skipped = image_plan(name, source_dir.resolve(), log_dir)
    result = rehearse(plan, log_dir, mirror, name)
    result.skipped = skipped
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("image", help="an image of config/config.yaml built from a definition")
    parser.add_argument("--source", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--mirror", default=MIRROR)
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    built = built_images(args.source)
    if args.image not in built:
        parser.error(f"no built image {args.image!r}: {', '.join(built)}")
    reason = skip_reason(args.mirror)
    if reason:
        print(f"cannot rehearse here: {reason}", file=sys.stderr)
        return 2
    result = rehearse_image(args.image, args.source, args.log_dir, args.mirror)
    print(result.report())
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
