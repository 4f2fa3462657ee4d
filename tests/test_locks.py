"""The images' hash-pinned locks (deploybench/locks.py, envs/containers/<image>.lock).

The locks in the tree are checked as they are (coverage, pins, hashes, nothing the base ships);
resolving them again with the pinned uv must give the same bytes (this needs PyPI, and is
skipped only where PyPI cannot be reached); and with the stand-in tests/bin/apptainer, a changed
lock rebuilds its image and changes the record every job's provenance copies.
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from deploybench import images, locks
from deploybench.errors import LockError
from deploybench.io import sha256_of
from deploybench.planning.workflow_config import ConfigError
from tests.conftest import REPO, base_config, planned_jobs, run_snakemake, write_config

STANDIN = REPO / "tests" / "bin"
UV = str(Path(sys.executable).with_name("uv"))
BUILT = locks.built_images(base_config())


def spec_of(name: str, root: Path = REPO) -> locks.LockSpec:
    return locks.lock_spec(name, BUILT[name], root)


def test_every_built_image_has_its_own_lock():
    assert sorted(BUILT) == [
        "pytorch-24.09", "pytorch-25.01", "tensorflow-24.09", "tensorflow-25.02",
        "triton-24.09", "triton-24.09-tf", "triton-25.01", "triton-25.02-tf",
    ]  # fmt: skip


def test_a_lock_is_resolved_for_its_bases_python_and_glibc():
    for name, python, platform in (
        ("triton-25.01", "3.12", "x86_64-manylinux_2_39"),  # Ubuntu 24.04
        ("triton-24.09", "3.10", "x86_64-manylinux_2_35"),  # Ubuntu 22.04
    ):
        spec = spec_of(name)
        assert (spec.python, spec.platform) == (python, platform)
        text = spec.lock_path.read_text()
        assert f"--python-version {python}" in text and f"--python-platform {platform}" in text
    paths = [image["lock"] for image in BUILT.values()]
    assert len(set(paths)) == len(paths)


@pytest.mark.parametrize("name", sorted(BUILT))
def test_lock_covers_its_requirements_every_line_pinned_and_hashed(name):
    spec = spec_of(name)
    text = spec.lock_path.read_text()
    assert locks.problems(spec, text) == []
    entries = locks.parse_lock(text)
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            assert re.match(r"^[a-z0-9-]+==\S+ \\$", line), line
    assert all(count >= 1 for _, count in entries.values())
    for required in locks.requirement_names(spec.requirements_path):
        assert (required in entries) != (required in spec.ships), required
    assert not set(spec.ships) & set(entries)
    # the lock was made from the requirements and settings as they are now
    assert locks.check_current(spec) == sha256_of(spec.lock_path)


def test_what_the_base_ships_is_left_out_with_what_only_it_needs():
    framework = locks.parse_lock(spec_of("pytorch-25.01").lock_path.read_text())
    triton = locks.parse_lock(spec_of("triton-25.01").lock_path.read_text())
    # NGC PyTorch keeps its torch; tritonserver has none, so its lock installs the PyPI twin
    assert "torch" not in framework and triton["torch"][0] == "2.6.0"
    cuda_wheels = {n for n in triton if n.startswith("nvidia-")} | {"triton", "networkx"}
    assert cuda_wheels and not cuda_wheels & set(framework)
    # what the lock shares with the base's torch fits torch 2.6.0 (sympy==1.13.1), rather than
    # the newest sympy onnxruntime alone would take
    assert framework["sympy"] == triton["sympy"] == ("1.13.1", framework["sympy"][1])
    tf = locks.parse_lock(spec_of("tensorflow-25.02").lock_path.read_text())
    assert not {"tensorflow", "keras", "numpy", "tensorboard"} & set(tf)
    # protobuf as TensorFlow 2.17 needs it (<5), and the Triton client that works with it
    assert tf["protobuf"][0].startswith("4.") and tf["tritonclient"][0] == "2.51.0"


def test_requirement_names_and_lock_parsing(tmp_path):
    req = tmp_path / "r.txt"
    req.write_text(
        "# c\nTorch\ntritonclient[http,grpc]  # client\nonnx>=1.14 ; python_version>'3'\n"
    )
    assert locks.requirement_names(req) == ["torch", "tritonclient", "onnx"]
    req.write_text("-r other.txt\n")
    with pytest.raises(LockError, match=r"'-r other.txt': options are not supported"):
        locks.requirement_names(req)
    with pytest.raises(LockError, match="'onnx>=1.14' is not pinned with =="):
        locks.parse_lock("onnx>=1.14 \\\n    --hash=sha256:00\n")
    assert locks.parse_lock("Foo_Bar==1.0 \\\n    --hash=sha256:ab \\\n    --hash=sha256:cd\n") == {
        "foo-bar": ("1.0", 2)
    }


def test_the_temporary_constraints_file_leaves_no_trace_in_the_notes():
    uv_output = (
        "attrs==26.1.0 \\\n    --hash=sha256:ab\n    # via\n    #   -c /tmp/x/resolution.txt\n"
        "    #   aiohttp\n    #   jsonschema\n"
        "brotli==1.2.1 \\\n    --hash=sha256:cd\n    # via\n    #   -c /tmp/x/resolution.txt\n"
        "    #   geventhttpclient\n"
    )
    assert locks._drop_constraint_notes(uv_output, "/tmp/x/resolution.txt") == (
        "attrs==26.1.0 \\\n    --hash=sha256:ab\n    # via\n    #   aiohttp\n    #   jsonschema\n"
        "brotli==1.2.1 \\\n    --hash=sha256:cd\n    # via geventhttpclient\n"
    )


def test_an_unknown_image_is_named_with_the_valid_choices():
    with pytest.raises(
        ConfigError, match=r"unknown image 'nope'; valid choices: pytorch-24.09, pytorch-25.01, "
    ):
        locks.main(["--image", "nope"])


def test_an_image_without_lock_settings_is_a_config_error():
    image = dict(BUILT["pytorch-25.01"])
    del image["lock"], image["exclude_newer"]
    with pytest.raises(ConfigError, match=r"images.pytorch-25.01: .* needs lock, exclude_newer"):
        locks.lock_spec("pytorch-25.01", image, REPO)


def _tree(tmp_path: Path) -> Path:
    """A copy of what a lock is made from, to change."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "envs", src / "envs")
    return src


def test_a_stale_or_incomplete_lock_fails_before_the_build(tmp_path):
    src = _tree(tmp_path)
    spec = spec_of("pytorch-25.01", src)
    requirements = (src / spec.requirements).read_text()
    (src / spec.requirements).write_text(requirements + "einops\n")
    with pytest.raises(LockError, match=r"other requirements or settings .* run `make locks`"):
        locks.check_current(spec)
    (src / spec.requirements).write_text(requirements)
    # other settings than the lock's: another pin
    changed = {**BUILT["pytorch-25.01"], "pins": {"torch": "2.6.1"}}
    with pytest.raises(LockError, match="other requirements or settings"):
        locks.check_current(locks.lock_spec("pytorch-25.01", changed, REPO))
    # a lock that lost a requirement (made by hand, say) is incomplete
    spec = spec_of("triton-25.01", src)
    text = spec.lock_path.read_text()
    start = text.index("\nmonai==")
    end = text.index("\n", text.index("# via", start))
    spec.lock_path.write_text(text[:start] + text[end:])
    with pytest.raises(LockError, match=r"monai \(in envs/containers/pytorch.txt\) is neither"):
        locks.check_current(spec)
    spec.lock_path.unlink()
    with pytest.raises(LockError, match="triton-25.01.lock does not exist; run `make locks`"):
        locks.check_current(spec)


def _ships_check() -> str:
    """The check framework.def runs after installing the lock (its heredoc)."""
    definition = (REPO / "envs" / "framework.def").read_text()
    return definition.split("<<'CHECK'\n", 1)[1].split("\nCHECK\n", 1)[0]


@pytest.mark.parametrize("definition", ["framework.def", "triton.def"])
def test_the_definition_checks_the_bases_python_is_the_locks(definition, tmp_path):
    text = (REPO / "envs" / definition).read_text()
    script = tmp_path / "python_check.py"
    script.write_text(text.split("<<'PYTHON_CHECK'\n", 1)[1].split("\nPYTHON_CHECK\n", 1)[0])
    assert '"{{ PYTHON }}"' in text and "\n    PYTHON=3.12\n" in text  # passed, with a default
    this = f"{sys.version_info[0]}.{sys.version_info[1]}"
    ok = subprocess.run(
        [sys.executable, str(script), this], capture_output=True, text=True, check=False
    )
    assert ok.returncode == 0, ok.stderr
    wrong = subprocess.run(
        [sys.executable, str(script), "3.10"], capture_output=True, text=True, check=False
    )
    assert wrong.returncode != 0
    assert f"the base image's Python is {this}, not 3.10 (images.<image>.release" in wrong.stderr


def test_the_definition_checks_what_the_base_ships(tmp_path):
    script = tmp_path / "check.py"
    script.write_text(_ships_check())
    from importlib.metadata import version

    torch = version("torch")  # 2.13.0+cpu here: a local build of 2.13.0
    public = torch.split("+")[0]

    def check(*specs: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, str(script), *specs]
        return subprocess.run(cmd, capture_output=True, text=True, check=False)

    assert check(f"torch=={public}", "numpy", f"pyyaml=={version('pyyaml')}").returncode == 0
    assert check(f"torch=={torch}").returncode == 0
    bad = check("numpy==0.1", "not-installed-here", f"torch=={public}")
    assert bad.returncode != 0
    assert "numpy is " in bad.stderr and "not 0.1" in bad.stderr
    assert "not-installed-here is not installed" in bad.stderr
    assert "torch" not in bad.stderr.split("says:")[1]


def test_build_args_carry_the_lock_what_the_base_ships_and_source_builds():
    config = base_config()["images"]
    assert images.build_args(config["pytorch-25.01"]) == [
        "FROM=nvcr.io/nvidia/pytorch:25.01-py3",
        "LOCK=envs/containers/pytorch-25.01.lock",
        "SHIPS=numpy torch==2.6.0a0+ecf3bae40a",
        "PYTHON=3.12",
    ]
    assert images.build_args(config["triton-25.02-tf"])[-3:] == [
        "LOCK=envs/containers/triton-25.02-tf.lock",
        "SOURCE=geventhttpclient",
        "PYTHON=3.12",
    ]
    assert images.build_args(config["triton-24.09"])[-1] == "PYTHON=3.10"
    for definition in ("framework.def", "triton.def"):
        text = (REPO / "envs" / definition).read_text()
        assert "{{ LOCK }}" in text and "{{ INSTALLER }}" in text
        assert "python3 /opt/deploybench/install_lock.py /opt/deploybench/requirements.lock" in text
    installer = (REPO / images.INSTALLER).read_text()
    assert '"--require-hashes"' in installer and '"--no-deps"' in installer


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        return False
    return True


def test_resolving_the_locks_again_changes_nothing():
    if not _pypi_reachable():
        pytest.skip("pypi.org cannot be reached: the locks cannot be resolved again here")
    specs = [spec_of(name) for name in sorted(BUILT)]
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        texts = list(pool.map(lambda spec: locks.resolve(spec, UV), specs))
    for spec, text in zip(specs, texts, strict=True):
        old = spec.lock_path.read_text()
        diff = "".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True), n=1))
        assert text == old, f"{spec.lock} is not what `make locks` makes now:\n{diff[:3000]}"


def test_a_changed_lock_rebuilds_its_image_and_changes_its_record(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for part in ("Snakefile", "rules", "scripts", "envs", "config"):
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy2
        copy(REPO / part, src / part)
    work = tmp_path / "work"
    work.mkdir()
    write_config(work, base_config())
    record = work / "images" / "pytorch-25.01.json"
    log = work / "apptainer-calls.jsonl"

    def snakemake(*args: str) -> subprocess.CompletedProcess[str]:
        return run_snakemake(
            work,
            "images/pytorch-25.01.json",
            *args,
            snakefile=src / "Snakefile",
            env={"APPTAINER_STANDIN_LOG": str(log)},
            path_first=(STANDIN,),
        )

    result = snakemake()
    assert result.returncode == 0, result.stderr[-3000:]
    lock = src / "envs" / "containers" / "pytorch-25.01.lock"
    before = json.loads(record.read_text())
    assert before["lock"] == "envs/containers/pytorch-25.01.lock"
    assert before["lock_sha256"] == sha256_of(lock)
    calls = [json.loads(line)["argv"] for line in log.read_text().splitlines()]
    build = next(c for c in calls if c[0] == "build")
    assert f"LOCK={lock}" in build and "SHIPS=numpy torch==2.6.0a0+ecf3bae40a" in build
    assert planned_jobs(snakemake("-n")) == {}

    lock.write_text(lock.read_text() + "# changed by the test\n")
    assert planned_jobs(snakemake("-n")) == {"container_image": 1}
    result = snakemake()
    assert result.returncode == 0, result.stderr[-3000:]
    after = json.loads(record.read_text())
    assert after["lock_sha256"] == sha256_of(lock) != before["lock_sha256"]
