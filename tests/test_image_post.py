"""The definitions' ``%post`` as written (envs/*.def, build arguments substituted as Apptainer
does: tests/image_rehearsal.py ``resolve``), run with ``/bin/sh -ex`` as Apptainer runs it, on
this machine rather than in a root, for the two choices it makes about its base:

- apt: ``apt-get`` only for the packages the base lacks (``dpkg-query``), as a build may have no
  route to the Ubuntu mirrors. The OS tools are stand-ins on ``PATH`` (real apt would need the
  network and a root): ``dpkg-query`` answers as the real one does for an installed and a missing
  package, ``apt-get`` records its calls. The image rehearsal runs the same lines with the real
  tools (tests/test_image_rehearsal.py: its Debian root lacks ``libb64-0d``).
- pip: ``--break-system-packages`` (envs/install_lock.py) only for a pip that has it (23.0.1 on):
  the install step runs for real with a real old pip (22.0.2, as Ubuntu 22.04's; 23.0, the last
  without the option) and the first one that has it, in throwaway venvs of Python 3.10 (the 24.09
  bases' Python), installing one real entry of a lock from PyPI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from deploybench.locks import lock_format
from tests import image_rehearsal as rehearsal
from tests.conftest import REPO

INSTALLER = REPO / "envs" / "install_lock.py"
PYTHON310 = Path.home() / ".pyenv" / "versions" / "3.10.13" / "bin" / "python3"
# dpkg-query -W -f='${Status}' PKG as dpkg 1.21 answers: the status of an installed package,
# else nothing on stdout and exit 1.
DPKG_QUERY = """#!/bin/sh
for pkg; do :; done
case " $DPKG_INSTALLED " in
    *" $pkg "*) printf 'install ok installed' ;;
    *) echo "dpkg-query: no packages found matching $pkg" >&2; exit 1 ;;
esac
"""
APT_GET = """#!/bin/sh
echo "$*" >> "$APT_LOG"
exit "${APT_EXIT:-0}"
"""


def post_section(definition: str, build_args: list[str]) -> str:
    """The definition's %post with its build arguments substituted."""
    stages = rehearsal.resolve((REPO / "envs" / definition).read_text(), build_args)
    post = stages[-1].section("post")
    assert post is not None
    return post.body


def python_version(python: str | Path) -> str:
    out = subprocess.run(
        [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def run_post(
    definition: str,
    tmp: Path,
    bindir: Path,
    lock: str = "# empty lock\n",
    source: str = "",
    installed: str = "",
    apt_exit: int = 0,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the definition's %post with ``bindir``'s python3 and pip, the lock and the installer
    where %files puts them (under ``tmp``), and stand-in dpkg-query/apt-get; returns the run and
    the apt-get calls."""
    opt = tmp / "opt" / "deploybench"
    opt.mkdir(parents=True)
    (opt / "requirements.lock").write_text(lock)
    shutil.copy(INSTALLER, opt / "install_lock.py")
    stubs = tmp / "stubs"
    stubs.mkdir()
    for name, text in (("dpkg-query", DPKG_QUERY), ("apt-get", APT_GET)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    args = [f"PYTHON={python_version(bindir / 'python3')}", f"SOURCE={source}"]
    script = tmp / "post.script"
    script.write_text(post_section(definition, args).replace("/opt/deploybench/", f"{opt}/"))
    apt_log = tmp / "apt.log"
    env = {
        "PATH": f"{stubs}:{bindir}:/usr/bin:/bin",
        "HOME": str(tmp),
        "LANG": "C.UTF-8",
        "DPKG_INSTALLED": installed,
        "APT_LOG": str(apt_log),
        "APT_EXIT": str(apt_exit),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    run = subprocess.run(
        ["/bin/sh", "-ex", str(script)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    calls = apt_log.read_text().splitlines() if apt_log.is_file() else []
    return run, calls


# --- apt: only for what the base lacks ------------------------------------------------------


def test_the_apt_lines_are_the_same_in_both_definitions() -> None:
    def apt_lines(definition: str) -> str:
        post = post_section(definition, [])
        start = post.index("    # apt-get only for the packages of WANT")
        return post[start : post.index("    fi\n", post.index("rm -rf /var/lib/apt")) + 7]

    triton, framework = apt_lines("triton.def"), apt_lines("framework.def")
    assert triton.replace("framework.def", "OTHER") == framework.replace("triton.def", "OTHER")


def test_triton_post_on_a_base_with_its_packages_runs_no_apt(tmp_path: Path) -> None:
    run, calls = run_post(
        "triton.def", tmp_path, Path(sys.executable).parent, installed="python3-pip libb64-0d"
    )
    assert run.returncode == 0, run.stderr
    assert calls == []
    assert "apt-get" not in run.stderr  # not even tried (sh -x traces every command)


def test_triton_post_installs_only_the_package_the_base_lacks(tmp_path: Path) -> None:
    run, calls = run_post(
        "triton.def", tmp_path, Path(sys.executable).parent, installed="python3-pip"
    )
    assert run.returncode == 0, run.stderr
    assert calls == ["update -qq", "install -y -qq --no-install-recommends libb64-0d"]


def test_triton_post_builds_from_source_with_the_compiler_packages(tmp_path: Path) -> None:
    run, calls = run_post(
        "triton.def", tmp_path, Path(sys.executable).parent, source="geventhttpclient",
        installed="python3-pip libb64-0d python3-dev",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert calls[1:] == ["install -y -qq --no-install-recommends build-essential"]


def test_failing_apt_names_the_missing_packages_and_the_mirrors(tmp_path: Path) -> None:
    run, calls = run_post("triton.def", tmp_path, Path(sys.executable).parent, apt_exit=100)
    assert run.returncode == 1
    assert calls == ["update -qq"]
    assert "the base image lacks python3-pip libb64-0d, and apt-get could not" in run.stderr
    assert "Ubuntu mirrors (http, port 80)" in run.stderr
    assert "install_lock.py" not in run.stderr  # the build stopped there


# --- pip: --break-system-packages only where pip has it --------------------------------------


@pytest.fixture(scope="module")
def pip_venvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Venvs of Python 3.10 (else this Python) holding each pip, by version: their bin dirs."""
    python = str(PYTHON310) if PYTHON310.is_file() else sys.executable

    def make(version: str, venv: Path) -> Path:
        subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
        install = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
        subprocess.run(
            [*install, "install", "-q", "--disable-pip-version-check", f"pip=={version}"],
            check=True, timeout=300,
        )  # fmt: skip
        return venv / "bin"

    versions = ("22.0.2", "23.0", "23.0.1")
    dirs = [tmp_path_factory.mktemp(f"pip-{version}") for version in versions]  # not threadsafe
    with ThreadPoolExecutor(max_workers=len(versions)) as pool:
        return dict(zip(versions, pool.map(make, versions, dirs), strict=True))


def six_lock() -> str:
    """One entry of a real lock (six: a small pure wheel), verbatim with its hashes."""
    lock = (REPO / "envs" / "containers" / "triton-24.09.lock").read_text()
    (entry,) = [e for e in lock_format().parse(lock)[1] if e.key == "six"]
    return f"# one entry of envs/containers/triton-24.09.lock\n{entry.text}\n"


def test_pip_before_23_0_1_has_no_break_system_packages(pip_venvs: dict[str, Path]) -> None:
    """What the definitions guard against: the installer's command as is fails there."""
    for version in ("22.0.2", "23.0"):
        pip = [str(pip_venvs[version] / "python"), "-m", "pip"]
        run = subprocess.run(
            [*pip, "install", "--break-system-packages", "--dry-run", "six"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert run.returncode == 2 and "no such option: --break-system-packages" in run.stderr


@pytest.mark.parametrize(
    ("definition", "pip", "flag"),
    [
        ("triton.def", "22.0.2", False),
        ("triton.def", "23.0", False),  # the last pip without the option
        ("triton.def", "23.0.1", True),  # the first with it
        ("framework.def", "22.0.2", False),
        ("framework.def", "23.0.1", True),
    ],
)
def test_install_passes_break_system_packages_only_to_a_pip_that_has_it(
    definition: str, pip: str, flag: bool, pip_venvs: dict[str, Path], tmp_path: Path
) -> None:
    bindir = pip_venvs[pip]
    uninstall = [str(bindir / "python"), "-m", "pip", "uninstall", "-y", "-q", "six"]
    subprocess.run(uninstall, capture_output=True, check=False)  # a venv is used twice
    run, calls = run_post(
        definition, tmp_path, bindir, lock=six_lock(), installed="python3-pip libb64-0d"
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert calls == []
    (command,) = [ln for ln in run.stdout.splitlines() if ln.startswith("install_lock: $")]
    assert ("--break-system-packages" in command.split()) is flag, command
    assert "Successfully installed six-1.17.0" in run.stdout
    installed = subprocess.run(
        [str(bindir / "python"), "-c", "import six; print(six.__version__, six.__file__)"],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONNOUSERSITE": "1"},
    )  # fmt: skip
    assert installed.stdout.startswith("1.17.0 " + str(bindir.parent)), installed.stdout
