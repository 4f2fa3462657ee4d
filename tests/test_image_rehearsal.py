"""Image-build rehearsals (tests/image_rehearsal.py): each built image's definition run for
real (%post, %test, and a Snakemake job's launch) in a Debian 12 root with the NGC base's
traits, and crafted definitions showing that the rehearsal detects each class of failure.

They need root, mount namespaces, debootstrap and the network; where any is missing they skip
with the reason. By default one image per definition is rehearsed, the one that builds a package
from source (the most steps: triton-25.02-tf, tensorflow-25.02); its twin differs only in its
lock, whose CUDA wheels a rehearsal leaves out anyway. DEPLOYBENCH_REHEARSE=all rehearses every
built image (about 2.5 minutes more).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests import image_rehearsal as rehearsal
from tests.conftest import REPO, processes_mentioning

pytestmark = pytest.mark.rehearsal

FIXTURES = Path(__file__).parent / "fixtures" / "rehearsal"


@pytest.fixture(scope="module")
def can_rehearse() -> None:
    reason = rehearsal.skip_reason()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must rehearse the image definitions: {reason}")
        pytest.skip(reason)


@pytest.fixture
def own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory for the rehearsal's own (so a test can see it is cleaned up)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def crafted(
    name: str,
    tmp_path: Path,
    flavour: str = "debian-pip",
    build_args: list[str] | None = None,
    ships: dict[str, str | None] | None = None,
) -> rehearsal.RehearsalResult:
    """Rehearse the fixture definition ``name`` on the base of ``flavour``."""
    plan = rehearsal.Plan(
        definition=(FIXTURES / name).read_text(),
        build_args=build_args or [],
        source_dir=FIXTURES,
        flavour=flavour,
        ships=ships or {},
    )
    return rehearsal.rehearse(plan, tmp_path / "logs" / name, name=name)


def returncodes(result: rehearsal.RehearsalResult) -> dict[str, int]:
    return {step.name: step.returncode for step in result.steps}


def assert_cleaned_up(tmp: Path) -> None:
    assert not list(tmp.iterdir()), "rehearsal left temporary files"
    assert not rehearsal.mounts_under(tmp), "rehearsal left mounts"


# --- the project's images -------------------------------------------------------------------


def rehearsed_images() -> list[str]:
    """Every built image with DEPLOYBENCH_REHEARSE=all; else one per definition, the one that
    builds the most from source (ties: the first)."""
    built = rehearsal.built_images(REPO)
    if os.environ.get("DEPLOYBENCH_REHEARSE") == "all":
        return built
    images = rehearsal.load_config(REPO)["images"]
    chosen: dict[str, str] = {}
    for name in built:
        definition = images[name]["definition"]
        sources = len(images[name].get("from_source") or [])
        if definition not in chosen or sources > len(
            images[chosen[definition]].get("from_source") or []
        ):
            chosen[definition] = name
    return sorted(chosen.values())


def test_one_image_per_definition_is_rehearsed_by_default(monkeypatch):
    monkeypatch.delenv("DEPLOYBENCH_REHEARSE", raising=False)
    assert rehearsed_images() == ["tensorflow-25.02", "triton-25.02-tf"]
    monkeypatch.setenv("DEPLOYBENCH_REHEARSE", "all")
    assert rehearsed_images() == rehearsal.built_images(REPO)


@pytest.mark.parametrize("image", rehearsed_images())
def test_image_definition_builds(image: str, can_rehearse: None, tmp_path: Path) -> None:
    """%post, %test and a job launch pass for the image as rule container_image builds it."""
    result = rehearsal.rehearse_image(image, REPO, tmp_path / "logs")
    if result.inconclusive:  # a step failed only for the root's older glibc: no verdict
        pytest.xfail(result.report())
    assert result.passed, result.report()


# --- the rehearsal detects each class of failure --------------------------------------------


def test_failing_test_section_fails(can_rehearse: None, tmp_path: Path, own_tmp: Path) -> None:
    result = crafted("failing-test.def", tmp_path)
    assert returncodes(result) == {"post": 0, "test": 1, "job": 0}, result.report()
    assert not result.passed
    assert "Python 3.11" in result.steps[1].output_tail  # the test ran in the root
    assert_cleaned_up(own_tmp)


def test_image_without_python_fails_the_job(can_rehearse: None, tmp_path: Path) -> None:
    result = crafted("no-python.def", tmp_path)
    assert returncodes(result) == {"post": 0, "test": 0, "job": 127}, result.report()
    assert "python: command not found" in result.steps[2].output_tail


@pytest.mark.parametrize(
    ("flavour", "post_code", "says"),
    [
        # Debian's pip leaves /usr/lib/python3/dist-packages alone and installs to /usr/local.
        ("debian-pip", 0, "Not uninstalling pyyaml at /usr/lib/python3/dist-packages"),
        # An upstream pip tries to uninstall the apt-installed PyYAML, which has no RECORD.
        ("upstream-pip", 1, "no RECORD file was found for PyYAML"),
    ],
)
def test_pinned_pyyaml_over_apt(
    flavour: str, post_code: int, says: str, can_rehearse: None, tmp_path: Path
) -> None:
    ships = {"torch": "2.6.0a0+ecf3bae40a", "numpy": None}
    result = crafted("pinned-pyyaml.def", tmp_path, flavour, ships=ships)
    assert result.steps[0].returncode == post_code, result.report()
    assert says in result.steps[0].log.read_text()
    if post_code == 0:  # then the pinned PyYAML and the SHIPS stand-ins are what runs
        assert result.passed, result.report()


def test_interrupted_rehearsal_cleans_up(can_rehearse: None, tmp_path: Path) -> None:
    """Ctrl-C during %post: the step's processes end and nothing is left behind."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    logs = tmp_path / "logs"
    code = (
        "import sys; from pathlib import Path; from tests import image_rehearsal as r\n"
        "plan = r.Plan(Path(sys.argv[1]).read_text(), [], Path('.'), 'debian-pip')\n"
        "r.rehearse(plan, Path(sys.argv[2]))\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp)}
    args = [sys.executable, "-c", code, str(FIXTURES / "slow-post.def"), str(logs)]
    proc = subprocess.Popen(args, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        post = logs / "post.log"
        while not (post.is_file() and "sleep 600" in post.read_text()):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "%post did not start"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
        leftovers = processes_mentioning(str(tmp))
        for leftover in leftovers:  # a failed test leaves nothing running either
            leftover.kill()
    assert not leftovers, [p.info["cmdline"] for p in leftovers]
    assert "KeyboardInterrupt" in stderr
    assert_cleaned_up(tmp)
    sleeping = subprocess.run(["pgrep", "-f", "sleep 600"], capture_output=True, check=False)
    assert sleeping.returncode == 1, f"left running: {sleeping.stdout!r}"


# --- parsing (no root needed) ---------------------------------------------------------------


TWO_STAGES = """\
# a comment before the first stage
Bootstrap: docker
From: {{ SDK }}
Stage: sdk

Bootstrap: docker
From: {{ FROM }}
Stage: final

%arguments
    FROM=base:1
    SDK=base:1-sdk
    LOCK=envs/x.lock
    SOURCE=

%files from sdk
    /workspace/install/bin/perf_analyzer /usr/local/bin/perf_analyzer  # from the SDK

%files
    {{ LOCK }} /opt/requirements.lock

%post
    SOURCE="{{SOURCE}}"

%test
    perf_analyzer --version
"""


def test_definition_stages_and_files() -> None:
    sdk, final = rehearsal.resolve(TWO_STAGES, ["FROM=base:2", "LOCK=/x.lock"])
    assert (sdk.name, sdk.header["from"], sdk.sections) == ("sdk", "base:1-sdk", [])
    assert (final.name, final.header["from"]) == ("final", "base:2")
    assert final.files() == [
        ("sdk", "/workspace/install/bin/perf_analyzer", "/usr/local/bin/perf_analyzer"),
        ("", "/x.lock", "/opt/requirements.lock"),
    ]
    post = final.section("post")
    assert post is not None and post.body == '    SOURCE=""\n'  # the %arguments default


def test_project_definitions_parse() -> None:
    for definition in sorted((REPO / "envs").glob("*.def")):
        stages = rehearsal.parse_definition(definition.read_text())
        assert stages[-1].section("post") is not None, definition


def test_unknown_build_argument_is_an_error() -> None:
    with pytest.raises(rehearsal.RehearsalError, match="NOPE"):
        rehearsal.resolve("Bootstrap: docker\nFrom: {{ NOPE }}\n", [])


def test_test_section_is_a_plain_sh_script() -> None:
    """As Apptainer writes it: no -e, so only the last command's status counts."""
    (stage,) = rehearsal.parse_definition("Bootstrap: docker\n%test\n    false\n    true\n")
    script = rehearsal.test_script(stage.section("test"))
    assert script.startswith("#!/bin/sh\n")
    assert subprocess.run(["/bin/sh", "-c", script], check=False).returncode == 0


def test_glibc_gap_is_inconclusive(tmp_path: Path) -> None:
    """A binary that needs glibc 2.38 fails to load on Debian 12 but not on Ubuntu 24.04."""
    error = "perf_analyzer: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.{}' not found"
    log = tmp_path / "test.log"
    step = rehearsal.StepResult("test", 1, error.format(38), log, 0.0)
    assert step.inconclusive
    assert not rehearsal.StepResult("test", 1, error.format(41), log, 0.0).inconclusive
    assert not rehearsal.StepResult("test", 99, "unrecognized option", log, 0.0).inconclusive
    result = rehearsal.RehearsalResult("x", "debian-pip", [step], [], tmp_path)
    assert result.inconclusive and not result.passed
    assert "inconclusive" in result.report()


def test_base_flavours() -> None:
    assert rehearsal.flavour_of("nvcr.io/nvidia/tritonserver:25.01-py3") == "debian-pip"
    assert rehearsal.flavour_of("nvcr.io/nvidia/pytorch:25.01-py3") == "upstream-pip"
    assert rehearsal.flavour_of("nvcr.io/nvidia/tensorflow:25.02-tf2-py3") == "upstream-pip"
