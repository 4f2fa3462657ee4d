"""Hash-pinned locks of what each container image installs over its NGC base.

``envs/containers/<framework>.txt`` names what deploybench's jobs import, without versions; each
built image (``images:`` in config/config.yaml) has a lock made from it by uv for the image's
Python and platform, with every distribution's sha256, which the definition installs with
``pip install --no-deps --require-hashes``. Two builds a month apart install the same files.

What the NGC base ships (``release.ships``: NVIDIA's own torch or TensorFlow builds, numpy, …)
stays out of the lock, and so does everything only they need (torch's CUDA wheels, keras, …).
The resolution runs twice:

1. the requirements with ``pins`` as constraints, giving every version; a shipped package is
   resolved as its PyPI twin (``pins: {torch: 2.6.0}`` for NGC's 2.6.0a0 build), so what the
   lock shares with it (sympy, protobuf, ml-dtypes, …) fits what the base's own build needs;
2. the same with step 1's versions as constraints and each shipped package overridden by a
   never-true marker (``torch ; sys_platform == 'never'``), which removes it and the part of
   the tree only it needs; with ``--generate-hashes`` this is the lock.

Re-resolving is deterministic: uv is pinned (envs/dev.txt), the index is read as of the image's
``exclude_newer``, and the existing lock is uv's preference. The lock's header records how it
was made; ``check_current`` compares it with the config offline, so a build never installs a
lock made from other requirements or settings (``make locks`` regenerates them all).

``python -m deploybench.locks [--image NAME] [--check]``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import ConfigError, LockError, ResolveError

# NGC's 25.xx images are Ubuntu 24.04 (glibc 2.39): wheels for manylinux_2_39 and older run;
# the 24.xx ones (V100's) Ubuntu 22.04, glibc 2.35 (`release.glibc`).
DEFAULT_GLIBC = "2.39"
INDEX = "https://pypi.org/simple"
# Never true on the platform we resolve for: an override with it removes a package.
NEVER = "sys_platform == 'never'"
LOCK_KEYS = ("definition", "requirements", "lock", "from", "release", "exclude_newer")
# What installs a lock in an image (its own pip, inside the build), in the source tree.
INSTALLER = "envs/install_lock.py"
SOURCE_TREE = Path(__file__).resolve().parent.parent
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@functools.cache
def lock_format() -> ModuleType:
    """The one reader of the lock format: the images' installer (``INSTALLER``; standard library
    only, as it runs in the NGC base before deploybench is there), loaded from the source tree,
    where the locks are. Jobs in a container see only the package: they read no lock."""
    path = SOURCE_TREE / INSTALLER
    spec = importlib.util.spec_from_file_location("deploybench_install_lock", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise LockError(f"{path}: not found; locks are read in deploybench's source tree")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Foo_Bar`` == ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(path: str | Path) -> list[str]:
    """The distribution names a requirements file asks for (extras, versions, markers and
    comments dropped), canonical, in file order."""
    names: list[str] = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-"):
            raise LockError(f"{path}: {line!r}: options are not supported; name packages only")
        match = _NAME.match(line)
        if not match:
            raise LockError(f"{path}: {line!r} is not a requirement")
        name = canonical(match.group(1))
        if name not in names:
            names.append(name)
    return names


@dataclass(frozen=True)
class LockSpec:
    """What one image's lock is made from (paths relative to the source tree ``root``)."""

    image: str
    root: Path
    requirements: str
    lock: str
    base: str
    python: str
    glibc: str
    exclude_newer: str
    ships: dict[str, str | None]
    pins: dict[str, str]
    from_source: tuple[str, ...] = ()

    @property
    def platform(self) -> str:
        """uv's --python-platform for the base: wheels for its glibc and older run there."""
        return f"x86_64-manylinux_{self.glibc.replace('.', '_')}"

    @property
    def requirements_path(self) -> Path:
        return self.root / self.requirements

    @property
    def lock_path(self) -> Path:
        return self.root / self.lock


def _relative(root: Path, path: str) -> str:
    return os.path.relpath(root / path, root)


def lock_spec(name: str, image: dict[str, Any], root: str | Path) -> LockSpec:
    """The lock inputs of image ``name`` (its ``images:`` entry; paths relative to ``root`` or
    absolute under it)."""
    missing = [key for key in LOCK_KEYS if key not in image]
    if missing:
        raise ConfigError(
            f"images.{name}: a built image needs {', '.join(missing)} to lock its requirements "
            f"(keys: {', '.join(LOCK_KEYS)})"
        )
    release = image["release"]
    ships = {canonical(k): (None if v is None else str(v)) for k, v in release["ships"].items()}
    pins = {canonical(k): str(v) for k, v in (image.get("pins") or {}).items()}
    root = Path(root)
    spec = LockSpec(
        image=name,
        root=root,
        requirements=_relative(root, image["requirements"]),
        lock=_relative(root, image["lock"]),
        base=str(image["from"]),
        python=str(release["python"]),
        glibc=str(release.get("glibc", DEFAULT_GLIBC)),
        exclude_newer=str(image["exclude_newer"]),
        ships=dict(sorted(ships.items())),
        pins=dict(sorted(pins.items())),
        from_source=tuple(sorted(canonical(n) for n in image.get("from_source") or [])),
    )
    return spec


def uv_version(uv: str) -> str:
    out = subprocess.run([uv, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


def ships_arg(ships: dict[str, str | None]) -> str:
    """``name==version`` (or ``name`` where no version is recorded) for each shipped package,
    space-separated: what the definition checks in the built image."""
    return " ".join(
        name if version is None else f"{name}=={version}" for name, version in ships.items()
    )


def header(spec: LockSpec, resolver: str) -> str:
    """The lock's opening comment: how it was made (``resolver``: uv's version). Part of the
    lock, so a change of any input makes ``--check`` (and the image build) see it as stale."""
    digest = hashlib.sha256(spec.requirements_path.read_bytes()).hexdigest()
    pins = " ".join(f"{n}=={v}" for n, v in spec.pins.items()) or "none"
    no_binary = "".join(f" --no-binary {n}" for n in spec.from_source)
    return "\n".join(
        [
            f"# Lock of image {spec.image} (over {spec.base}): made by",
            f"#   python -m deploybench.locks --image {spec.image}   (`make locks`: every image)",
            f"# from {spec.requirements} and images.{spec.image} in config/config.yaml",
            f"#   (requirements sha256 {digest}).",
            "# Do not edit: change those and regenerate.",
            f"# resolver: uv {resolver} pip compile --python-version {spec.python}",
            f"#   --python-platform {spec.platform}",
            f"#   --exclude-newer {spec.exclude_newer} --only-binary :all:{no_binary}",
            "#   --generate-hashes",
            f"# pins: {pins}",
            f"# shipped by the base, not in this lock: {ships_arg(spec.ships) or 'none'}",
            "",
        ]
    )


def _uv_compile(
    uv: str, spec: LockSpec, out: Path, *options: str, cwd: Path
) -> subprocess.CompletedProcess[str]:
    cmd = [
        uv, "pip", "compile", spec.requirements,
        "--no-config", "--index-url", INDEX,
        "--python-version", spec.python, "--python-platform", spec.platform,
        "--exclude-newer", spec.exclude_newer, "--only-binary", ":all:",
        *[arg for name in spec.from_source for arg in ("--no-binary", name)],
        "--no-header", "--quiet", "--output-file", str(out), *options,
    ]  # fmt: skip
    try:
        result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as err:
        raise ResolveError(f"no uv at {uv}: `make setup` installs it (envs/dev.txt)") from err
    if result.returncode != 0:
        raise ResolveError(
            f"uv could not lock {spec.requirements} for image {spec.image}:\n{result.stderr[-3000:]}"
        )
    return result


def _drop_constraint_notes(text: str, constraints: str) -> str:
    """uv's ``# via`` notes without ``-c <step 1 file>`` (a temporary path), a note left with
    one source written on one line, as uv writes those."""
    lines = [line for line in text.splitlines() if line.strip() != f"#   -c {constraints}"]
    out: list[str] = []
    for i, line in enumerate(lines):
        if line.strip() == "# via":
            items = 0
            for following in lines[i + 1 :]:
                if not following.lstrip().startswith("#   "):
                    break
                items += 1
            if items == 1:
                out.append(f"{line} {lines[i + 1].strip().removeprefix('#').strip()}")
                continue
            if items == 0:
                continue
        elif out and out[-1].lstrip().startswith("# via ") and line.lstrip().startswith("#   "):
            continue  # the single source, already on the "# via" line
        out.append(line)
    return "\n".join(out) + "\n"


def resolve(spec: LockSpec, uv: str = "uv") -> str:
    """The lock's text for ``spec``: header, then uv's hash-pinned resolution."""
    with tempfile.TemporaryDirectory(prefix="deploybench-lock-") as tmp:
        work = Path(tmp)
        pins = work / "pins.txt"
        pins.write_text("".join(f"{n}=={v}\n" for n, v in spec.pins.items()))
        full = work / "resolution.txt"
        if spec.lock_path.is_file():
            # uv prefers the versions already in its output file: an existing lock changes
            # only where it must.
            shutil.copy(spec.lock_path, full)
        _uv_compile(uv, spec, full, "--constraint", str(pins), "--no-annotate", cwd=spec.root)
        overrides = work / "shipped.txt"
        overrides.write_text("".join(f"{n} ; {NEVER}\n" for n in spec.ships))
        locked = work / "lock.txt"
        if spec.lock_path.is_file():
            shutil.copy(spec.lock_path, locked)
        _uv_compile(
            uv, spec, locked,
            "--constraint", str(full), "--override", str(overrides), "--generate-hashes",
            # step 1 has just read all it needs from the index into uv's cache
            "--offline",
            cwd=spec.root,
        )  # fmt: skip
        body = _drop_constraint_notes(locked.read_text(), str(full))
    return header(spec, uv_version(uv)) + body


def parse_lock(text: str) -> dict[str, tuple[str, int]]:
    """Canonical name → (pinned version, number of sha256 hashes) of each locked package."""
    installer = lock_format()
    try:
        _, entries = installer.parse(text)
    except installer.LockFormatError as err:
        raise LockError(str(err)) from err
    return {e.key: (e.version, len(e.hashes)) for e in entries}


def problems(spec: LockSpec, text: str) -> list[str]:
    """What is wrong with lock ``text`` for ``spec``, offline (no resolver): not covering the
    requirements, a shipped package in it, a line without a pin or hash."""
    try:
        entries = parse_lock(text)
    except LockError as err:
        return [str(err)]
    found = []
    for name in requirement_names(spec.requirements_path):
        if name not in entries and name not in spec.ships:
            found.append(f"{name} (in {spec.requirements}) is neither locked nor shipped")
    found += [f"{n} is shipped by the base but locked" for n in spec.ships if n in entries]
    found += [f"{n}=={v} has no sha256 hash" for n, (v, count) in entries.items() if not count]
    found += [
        f"{n} is pinned to {spec.pins[n]} but locked at {entries[n][0]}"
        for n in spec.pins
        if n in entries and entries[n][0] != spec.pins[n]
    ]
    return found


def check_current(spec: LockSpec) -> str:
    """The lock's sha256 when it exists, covers its requirements and was made from the
    requirements and config as they are now; else a LockError saying what to run."""
    fix = f"run `make locks` (or python -m deploybench.locks --image {spec.image})"
    if not spec.lock_path.is_file():
        raise LockError(f"images.{spec.image}: lock {spec.lock} does not exist; {fix}")
    text = spec.lock_path.read_text()
    expected = _header_without_resolver(header(spec, "any"))
    if not _header_without_resolver(text).startswith(expected):
        raise LockError(
            f"images.{spec.image}: {spec.lock} was made from other requirements or settings "
            f"than {spec.requirements} and images.{spec.image} have now; {fix}"
        )
    found = problems(spec, text)
    if found:
        raise LockError(f"images.{spec.image}: {spec.lock}: {'; '.join(found)}; {fix}")
    return hashlib.sha256(spec.lock_path.read_bytes()).hexdigest()


def _header_without_resolver(text: str) -> str:
    """The header less uv's version: a build checks the lock's inputs, and need not run the
    same uv (or any) as the one that made it."""
    return re.sub(r"^# resolver: uv \S+ ", "# resolver: uv ", text, count=1, flags=re.MULTILINE)


def built_images(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: i for n, i in config.get("images", {}).items() if "definition" in i}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploybench.locks",
        description="Regenerate (or --check) the hash-pinned locks of the built images.",
    )
    parser.add_argument("--image", action="append", help="only this image (repeatable)")
    parser.add_argument("--check", action="store_true", help="re-resolve; fail if a lock differs")
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--uv", default=None, help="the uv to run (default: beside python)")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    uv = args.uv or str(Path(sys.executable).with_name("uv"))
    if not Path(uv).exists():
        uv = shutil.which("uv") or uv
    import yaml  # only the command line reads YAML: jobs import canonical() from here

    config = yaml.safe_load((root / args.config).read_text())
    images = built_images(config)
    for name in args.image or []:
        if name not in images:
            raise ConfigError(f"unknown image {name!r}; valid choices: {', '.join(sorted(images))}")
    specs = [lock_spec(name, images[name], root) for name in args.image or sorted(images)]
    # The resolutions wait on the index, not the CPU: run them side by side.
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        texts = list(pool.map(lambda spec: resolve(spec, uv), specs))
    stale = []
    for spec, text in zip(specs, texts, strict=True):
        name = spec.image
        found = problems(spec, text)
        if found:
            raise LockError(f"images.{name}: the resolution is incomplete: {'; '.join(found)}")
        old = spec.lock_path.read_text() if spec.lock_path.is_file() else None
        if args.check:
            if old != text:
                stale.append(spec.lock)
            print(f"{spec.lock}: {'differs' if old != text else 'up to date'}")
        else:
            spec.lock_path.write_text(text)
            print(f"{spec.lock}: {'unchanged' if old == text else 'written'}")
    if stale:
        print(f"stale: {', '.join(stale)}; run `make locks`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
