"""Container images: which image runs which job, how a ``.sif`` is built, and its digest.

On a cluster every job runs in an Apptainer image (``--sdm apptainer``). Images are NGC images
extended by a definition file in ``envs/`` (the seed pages extend theirs with the Triton
client the same way); rule ``container_image`` builds each one into ``images/<name>.sif`` and
writes ``images/<name>.json`` beside it: the build's inputs (the lock of what it installs,
deploybench/locks.py, with its sha256) and the image's sha256. Every job's provenance copies
that record, so each result names the exact image that produced it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import socket
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

from . import locks
from .errors import ImageBuildError
from .io import atomic_path, sha256_of, write_json
from .planning.workflow_config import ConfigError

IMAGE_DIR = "images"
# What installs a lock in an image (its own pip, inside the build), in the source tree.
INSTALLER = locks.INSTALLER
# Build arguments a definition reads ({{ NAME }}), from the image's config keys.
BUILD_ARGS = {"from": "FROM", "sdk": "SDK", "lock": "LOCK", "installer": "INSTALLER"}


def check_images(config: dict[str, Any]) -> None:
    """Every model's containers name an entry of ``images``."""
    images = config.get("images", {})
    for model, settings in config["models"].items():
        for role, name in settings["containers"].items():
            if name not in images:
                raise ConfigError(
                    f"models.{model}.containers.{role}: unknown image {name!r}; valid choices: "
                    f"{', '.join(sorted(images)) or 'none'}"
                )


def is_built(image: dict[str, Any]) -> bool:
    """Whether the workflow builds this image from a definition (else it is used as is)."""
    return "definition" in image


def in_source_tree(image: dict[str, Any], basedir: str | Path) -> dict[str, Any]:
    """``image`` with its definition, requirements and lock files and the lock's installer
    resolved in the workflow's tree (``source_tree``: that tree, where the lock's inputs are
    read)."""
    resolved = dict(image)
    for key in ("definition", "requirements", "lock"):
        if key in image:
            resolved[key] = str(Path(basedir) / image[key])
    if is_built(image):
        resolved["installer"] = str(Path(basedir) / INSTALLER)
    resolved["source_tree"] = str(basedir)
    return resolved


def data_binds(config: dict[str, Any], workdir: str | Path) -> list[str]:
    """Read-only binds for the data a job reads from outside the working directory (configured
    checkpoints and task data sets): a container sees only what is bound into it."""
    workdir = Path(workdir).resolve()
    paths = set()
    for settings in config["models"].values():
        task = settings.get("accuracy", {}).get("task") or {}
        for value in (settings.get("checkpoint"), task.get("path")):
            if not value or not Path(value).is_absolute():
                continue  # relative paths lie in the working directory, which is mounted
            path = Path(value).resolve()
            if not path.is_relative_to(workdir):
                paths.add(str(path))
    return [f"{p}:{p}:ro" for p in sorted(paths)]


def source_tree() -> Path:
    """The directory holding this deploybench package (the workflow's source tree)."""
    return Path(__file__).resolve().parent.parent


def package_bind() -> str:
    """The read-only bind that gives a job this deploybench package (found through
    ``PYTHONPATH=<source tree>``). Only the package: run from the checkout, the source tree *is*
    the working directory, which Snakemake mounts read-write as the job's home, and Apptainer
    mounts user binds after the home directory, so a read-only bind of the whole tree would
    hide it and every job would fail at its first write (issue 24, finding 3)."""
    package = Path(__file__).resolve().parent
    return f"{package}:{package}:ro"


def job_options(apptainer_args: str, binds: list[str], env: dict[str, str]) -> str:
    """``apptainer_args`` plus a ``--bind`` per bind and an ``--env`` per variable, each added
    only once (jobs on a cluster re-read the workflow with the arguments passed on to them)."""
    args = shlex.split(apptainer_args)
    for bind in binds:
        if bind not in args:
            args += ["--bind", bind]
    for key, value in env.items():
        if f"{key}={value}" not in args:
            args += ["--env", f"{key}={value}"]
    return shlex.join(args)


def sif_path(name: str) -> str:
    return f"{IMAGE_DIR}/{name}.sif"


def record_path(name: str) -> str:
    return f"{IMAGE_DIR}/{name}.json"


def container_uri(name: str, image: dict[str, Any]) -> str:
    """What Snakemake's ``container:`` gets: the built ``.sif`` or the configured image."""
    return sif_path(name) if is_built(image) else str(image["image"])


def build_args(image: dict[str, Any]) -> list[str]:
    """``KEY=VALUE`` build arguments for the definition's ``{{ KEY }}`` placeholders: the bases,
    the lock, and (where there are any) the packages the base ships, which the definition checks,
    and those the lock builds from source."""
    args = [f"{arg}={image[key]}" for key, arg in BUILD_ARGS.items() if key in image]
    ships = (image.get("release") or {}).get("ships") or {}
    if ships:
        normal = {locks.canonical(k): v for k, v in sorted(ships.items())}
        args.append(f"SHIPS={locks.ships_arg(normal)}")
    if image.get("from_source"):
        args.append(f"SOURCE={','.join(sorted(image['from_source']))}")
    python = (image.get("release") or {}).get("python")
    if python:  # the definition checks the base's Python is the lock's
        args.append(f"PYTHON={python}")
    return args


def build_command(
    apptainer: str, definition: str, out: str | Path, args: list[str], extra: list[str]
) -> list[str]:
    """``apptainer build`` of ``definition`` into ``out`` (an argument list: no shell)."""
    cmd = [apptainer, "build", "--force", *extra]
    for arg in args:
        cmd += ["--build-arg", arg]
    return [*cmd, str(out), definition]


# The oldest Apptainer that builds envs/*.def as written. 1.2.x drops an empty %arguments
# default (SOURCE=, SHIPS=: "build var SOURCE is not defined") and skips a --build-arg holding a
# second "=" (SHIPS=torch==2.6.0a0+...), so the image's "ships" check is skipped: v1.2.5
# cmd/internal/cli/build_linux.go getKeyVal splits with strings.SplitN(text, "=", -1). v1.3.0
# moved it to internal/pkg/build/args/args.go with SplitN(text, "=", 2), and 881a781ab ("Allow
# templated build arguments to definition files to have empty values") is first in v1.3.0-rc.1.
APPTAINER_FLOOR = (1, 3, 0)


def apptainer_version(apptainer: str) -> str:
    out = subprocess.run([apptainer, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def check_apptainer(apptainer: str) -> str:
    """``apptainer --version``'s answer, if it is at least ``APPTAINER_FLOOR``."""
    floor = ".".join(map(str, APPTAINER_FLOOR))
    try:
        answer = apptainer_version(apptainer)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ImageBuildError(f"cannot run `{apptainer} --version`: {exc}") from exc
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", answer)
    if "apptainer" not in answer.lower() or found is None:
        raise ImageBuildError(
            f"`{apptainer} --version` says {answer!r}: the images are built with Apptainer "
            f">= {floor} (SingularityCE's build arguments differ)"
        )
    version = tuple(int(part) for part in found.groups())
    if version < APPTAINER_FLOOR:
        raise ImageBuildError(
            f"Apptainer {'.'.join(map(str, version))} cannot build envs/*.def: it drops empty "
            f"%arguments defaults and skips build arguments holding a second '=' (fixed in "
            f"1.3.0). Use Apptainer >= {floor} (a newer module, or apptainer.org's release)"
        )
    return answer


# Where `apptainer build` goes: the bases' registry, and PyPI for the lock's files (their
# hosts, from the index the lock names). DEPLOYBENCH_BUILD_HOSTS ("host:port,...") replaces
# them (a site's mirrors); an HTTPS proxy in the environment is checked instead of them.
PYPI_HOSTS = ("pypi.org", "files.pythonhosted.org")
NETWORK_TIMEOUT_S = 10.0


def build_hosts(image: dict[str, Any]) -> list[tuple[str, int]]:
    """The (host, port) pairs an image's build must reach."""
    override = os.environ.get("DEPLOYBENCH_BUILD_HOSTS")
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    if override:
        names = [h.strip() for h in override.split(",") if h.strip()]
    elif proxy:
        names = [urllib.parse.urlsplit(proxy).netloc.rsplit("@", 1)[-1]]
    else:
        registries = {str(image[k]).split("/", 1)[0] for k in ("from", "sdk") if image.get(k)}
        names = sorted(registries) + list(PYPI_HOSTS)
    hosts = []
    for name in names:
        host, _, port = name.partition(":")
        hosts.append((host, int(port or 443)))
    return hosts


def check_network(name: str, image: dict[str, Any], timeout_s: float = NETWORK_TIMEOUT_S) -> None:
    """Fail before the build when a host it needs cannot be reached (a compute node without
    network: `container_image` runs wherever Snakemake runs)."""
    unreachable = []
    for host, port in build_hosts(image):
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError as exc:
            unreachable.append(f"{host}:{port} ({exc.strerror or exc})")
    if unreachable:
        raise ImageBuildError(
            f"building image {name} needs the network, but this node cannot reach "
            f"{', '.join(unreachable)}. Build the images where there is network (a login node): "
            "`snakemake --until container_image --profile ...`, then run the workflow as before "
            "(set DEPLOYBENCH_BUILD_HOSTS=host:port,... for a site's mirrors)"
        )


def build(
    *,
    name: str,
    image: dict[str, Any],
    out: str,
    record_out: str,
    log_file: str,
    apptainer: str = "apptainer",
    extra_args: list[str] | None = None,
) -> dict[str, Any]:
    """Build the image into a temporary file, move it into place, and write its record. A lock
    that is missing or stale (made from other requirements or settings) fails first, offline."""
    definition = str(image["definition"])
    try:
        apptainer_answer = check_apptainer(apptainer)
        check_network(name, image)
    except ImageBuildError as exc:  # in the rule's log too, where its error points
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "a") as log:
            log.write(f"{exc}\n")
        raise
    spec = locks.lock_spec(name, image, image.get("source_tree") or source_tree())
    lock_sha256 = locks.check_current(spec)
    args = build_args(image)
    with atomic_path(out) as partial:
        cmd = build_command(apptainer, definition, partial, args, list(extra_args or []))
        with open(log_file, "a") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)
        record = {
            "name": name,
            "sha256": sha256_of(partial),
            "definition": definition,
            "definition_sha256": sha256_of(definition),
            "requirements_sha256": sha256_of(image["requirements"]),
            "installer_sha256": sha256_of(image["installer"]),
            "lock": spec.lock,
            "lock_sha256": lock_sha256,
            "build_args": args,
            "bases": {k: image[k] for k in ("from", "sdk") if k in image},
            "apptainer": apptainer_answer,
            "built": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
    write_json(record_out, record)
    return record


def running_image() -> dict[str, Any]:
    """The image this process runs in (Apptainer sets ``APPTAINER_CONTAINER``), with its build
    record when the workflow built it; ``{"runtime": "native venv"}`` outside a container."""
    image = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
    if not image:
        return {"image": None, "runtime": "native venv"}
    info: dict[str, Any] = {"image": image, "runtime": "apptainer"}
    record = Path(image).with_suffix(".json")
    if record.is_file():
        info["record"] = json.loads(record.read_text())
        info["sha256"] = info["record"]["sha256"]
    elif Path(image).is_file():
        # An image Snakemake pulled itself (no record): hash it here.
        info["sha256"] = sha256_of(image)
    return info
