"""Small file helpers: every output is written whole or not at all."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MIB = 2**20  # bytes in a mebibyte: workspace sizes are configured, and memory reported, in MiB


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """A temporary path beside ``path`` that replaces it only if the block succeeds.

    The block may write a file or a directory there (a TF SavedModel is a directory).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.is_dir():
            _remove(target)
        elif tmp_path.exists():
            # mkstemp makes the file 0600; give it the mode a plain open() would (others on a
            # shared cluster file system must be able to read results).
            tmp_path.chmod(0o666 & ~_umask())
        tmp_path.replace(target)
    finally:
        _remove(tmp_path)


def _umask() -> int:
    mask = os.umask(0)  # the only portable way to read it is to set it
    os.umask(mask)
    return mask


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def write_text(path: Path | str, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_csv(path: Path | str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def write_json(path: Path | str, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


SKIPPED = {".snakemake_timestamp"}
# Python's bytecode cache: a model repository's `model.py` is imported by the server's python
# backend stub, which writes `1/__pycache__/` into the repository after the job that made it
# (with PYTHONDONTWRITEBYTECODE set too, seen in the smoke run). Derived from the `.py` beside it.
BYTECODE_CACHE = "__pycache__"


def content_files(directory: Path | str) -> list[Path]:
    """A directory's files, sorted, less what others write into it later: Snakemake's
    timestamp in a directory output and Python's bytecode caches."""
    directory = Path(directory)
    return sorted(
        p
        for p in directory.rglob("*")
        if p.is_file()
        and p.name not in SKIPPED
        and BYTECODE_CACHE not in p.relative_to(directory).parts
    )


def sha256_of(path: Path | str, chunk: int = 1 << 22) -> str:
    """The sha256 of a file, or of a directory's files (relative names and contents, in order)."""
    path = Path(path)
    digest = hashlib.sha256()
    files = [path]
    if path.is_dir():
        files = content_files(path)
    for file in files:
        if file != path:
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with file.open("rb") as f:
            while block := f.read(chunk):
                digest.update(block)
    return digest.hexdigest()
