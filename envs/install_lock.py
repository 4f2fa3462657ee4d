"""Install an image's hash-pinned lock with the image's own pip (run by envs/*.def's %post).

    python3 install_lock.py LOCK [--source NAME,NAME]

Standard library only: it runs in the NGC base before anything of deploybench is there. It is
also the one reader of the lock format (``parse``): deploybench/locks.py checks locks with it and
tests/image_rehearsal.py cuts them with it (both load this file, ``locks.lock_format``).

Every file of the lock is installed with ``--no-deps --require-hashes`` (the lock is complete for
what it installs and must not touch the base's own builds), wheels only but for the ``--source``
distributions, built from their hash-pinned sdists.

One trap of the NGC bases: a Python package installed by apt (or distutils) has no ``RECORD``
file, and an upstream pip cannot uninstall it ("Cannot uninstall wheel 0.42.0 … no RECORD file
was found … The package was installed by debian", reported on ``nvcr.io/nvidia/pytorch:26.02``;
Debian's patched pip leaves ``/usr/lib/python3/dist-packages`` alone instead). So the lock's
entries that the image holds without a ``RECORD`` are installed with ``--ignore-installed``: the
new version lands in pip's own site directory, which comes first on ``sys.path``, and the
apt-installed one stays where it is, shadowed, as Debian's pip would leave it.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

# A lock entry starts with `name==version` at the start of a line (uv writes no extras, but a
# `name[extra]==version` reads the same); its hashes and `# via` comments follow indented.
ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;\\]+)")
HASH = re.compile(r"--hash=sha256:([^\s\\]+)")
PIP = [
    sys.executable, "-m", "pip", "install", "--no-cache-dir", "--break-system-packages",
    "--no-deps", "--require-hashes", "--only-binary", ":all:",
]  # fmt: skip
# pip's override of PEP 668 (an EXTERNALLY-MANAGED Python: Ubuntu 24.04's) exists from 23.0.1 on
# (pip NEWS.rst, 23.0.1: "Implement --break-system-packages", #11780); an older pip rejects the
# option ("no such option"), and none before 23.0 enforces PEP 668 (nor has Ubuntu 22.04's Python
# the marker), so there the install goes without it. Ubuntu 22.04 (NGC 24.09) ships pip 22.0.2.
BREAK_SYSTEM_PACKAGES_FROM = (23, 0, 1)


def pip_release(version: str) -> tuple[int, ...]:
    """``23.0.1`` → (23, 0, 1); what follows the release numbers (``rc1``, ``.dev0``) is left."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(n) for n in found.group(0).split(".")) if found else ()


def installed_pip_version() -> str | None:
    """This Python's pip's version (None: no pip here, and the install will say so)."""
    try:
        return metadata.version("pip")
    except metadata.PackageNotFoundError:  # e.g. a pip without metadata: ask it
        out = subprocess.run(
            [sys.executable, "-m", "pip", "--version"], capture_output=True, text=True, check=False
        )
        found = re.match(r"pip (\S+)", out.stdout)
        return found.group(1) if found else None


def pip_command(pip_version: str | None = None) -> list[str]:
    """The install command, with ``--break-system-packages`` only for a pip that has it (this
    Python's pip unless ``pip_version`` is given)."""
    version = pip_version or installed_pip_version()
    if version is None or pip_release(version) >= BREAK_SYSTEM_PACKAGES_FROM:
        return list(PIP)
    return [arg for arg in PIP if arg != "--break-system-packages"]


class LockFormatError(ValueError):
    """A lock line that is not a ``name==version`` pin."""


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Foo_Bar`` == ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclasses.dataclass(frozen=True)
class Entry:
    """One locked distribution."""

    name: str  # as the lock spells it
    version: str
    hashes: tuple[str, ...]  # sha256 digests of its files, in lock order
    text: str  # verbatim: its requirement line, hash lines and comments (no final newline)

    @property
    def key(self) -> str:
        return canonical(self.name)

    @property
    def requirement(self) -> str:
        """The entry as pip reads it: its requirement and hash lines, without comments."""
        lines = self.text.splitlines()
        kept = [lines[0], *(ln for ln in lines[1:] if ln[:1].isspace() and _is_data(ln))]
        return "".join(line + "\n" for line in kept)


def _is_data(line: str) -> bool:
    return bool(line.strip()) and not line.lstrip().startswith("#")


def parse(lock_text: str) -> tuple[str, list[Entry]]:
    """The lock's opening comment (the lines before its first entry) and its entries, in lock
    order. Every line that starts unindented and is not a comment must be a ``name==version``
    pin; whatever follows it until the next one belongs to its entry."""
    header: list[str] = []
    blocks: list[list[str]] = []
    for line in lock_text.splitlines():
        if line[:1].isspace() or not _is_data(line):
            (blocks[-1] if blocks else header).append(line)
        else:
            blocks.append([line])
    found = []
    for block in blocks:
        match = ENTRY.match(block[0])
        if match is None:
            requirement = block[0].split(";", 1)[0].rstrip(" \\").strip()
            raise LockFormatError(f"{requirement!r} is not pinned with ==")
        pip_lines = [line for line in block if _is_data(line)]
        hashes = tuple(HASH.findall("\n".join(pip_lines)))
        found.append(Entry(match.group(1), match.group(2), hashes, "\n".join(block)))
    return "\n".join(header), found


def entries(lock_text: str) -> dict[str, str]:
    """Canonical name → the entry as pip reads it (its requirement and hash lines), in lock
    order."""
    return {entry.key: entry.requirement for entry in parse(lock_text)[1]}


def without_record(names: Iterable[str], path: list[str] | None = None) -> list[str]:
    """Those of ``names`` installed (on ``path``, default ``sys.path``) without a RECORD file:
    installed by apt or distutils, which no upstream pip can uninstall."""
    wanted = set(names)
    foreign = set()
    for dist in metadata.distributions(path=path or sys.path):
        name = canonical(dist.metadata["Name"] or "")
        if name in wanted and dist.read_text("RECORD") is None:
            foreign.add(name)
    return sorted(foreign)


def pip_commands(lock: Path, source: list[str], workdir: Path) -> list[tuple[list[str], list[str]]]:
    """The pip installs for ``lock``, each with the names it installs: the entries pip can
    replace, then (``--ignore-installed``) those it cannot uninstall."""
    lock_entries = entries(lock.read_text())
    foreign = without_record(lock_entries)
    no_binary = ["--no-binary", ",".join(source)] if source else []
    commands = []
    for part, extra in (
        ([n for n in lock_entries if n not in foreign], []),
        (foreign, ["--ignore-installed"]),
    ):
        if not part:
            continue
        requirements = workdir / f"lock-{len(commands)}.txt"
        requirements.write_text("".join(lock_entries[n] for n in part))
        commands.append((part, [*pip_command(), *extra, *no_binary, "-r", str(requirements)]))
    return commands


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lock", type=Path)
    parser.add_argument("--source", default="", help="distributions built from their sdist")
    args = parser.parse_args(argv)
    source = [s for s in args.source.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp:
        for names, command in pip_commands(args.lock, source, Path(tmp)):
            if "--ignore-installed" in command:
                print(f"install_lock: installed without RECORD, kept beside: {', '.join(names)}")
            print("install_lock: $", " ".join(command), flush=True)
            subprocess.run(command, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
