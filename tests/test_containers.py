"""Containers: which image wraps which job, how images are built, and what results record.

No container runtime runs here (../shared/notes/apptainer.md), so the end-to-end test puts the
clearly named stand-in tests/bin/apptainer on PATH: it records each call, builds each image as
an environment of another Python holding only the image's lock and base (tests/standin_image.py)
and runs the inner command in a mount namespace laid out as a container's. The real CPU chain runs through Snakemake's `--sdm apptainer` code path, and
the test asserts the exact `apptainer` command lines each job got.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from deploybench import images, job_imports, locks
from deploybench.checkpoint import write_seeded_checkpoint
from deploybench.errors import ImageBuildError
from deploybench.gpus import image_chain
from deploybench.io import sha256_of
from deploybench.models import load_family
from deploybench.planning.workflow_config import ConfigError
from tests import standin_image
from tests.conftest import (
    BIN,
    REPO,
    base_config,
    orchestration_config,
    planned_jobs,
    run_snakemake,
    workflow_rules,
    write_config,
)

STANDIN = REPO / "tests" / "bin"
RUN = "results/tft/cpu/onnx/fp32"
# The job's script names the rule it belongs to; perf.py runs offline and online.
ROLE_OF_SCRIPT = {
    "checkpoint.py": "framework",
    "export.py": "framework",
    "repository.py": "framework",
    "accuracy.py": "triton",
    "perf.py": "triton",
}


def test_build_command_passes_pinned_bases_as_build_args():
    image = base_config()["images"]["triton-25.01"]
    args = images.build_args(image)
    assert args == [
        "FROM=nvcr.io/nvidia/tritonserver:25.01-py3",
        "SDK=nvcr.io/nvidia/tritonserver:25.01-py3-sdk",
        "LOCK=envs/containers/triton-25.01.lock",
        "PYTHON=3.12",  # the definition checks the base's Python against it
    ]
    cmd = images.build_command("apptainer", "envs/triton.def", "images/x.sif", args, [])
    assert cmd[:3] == ["apptainer", "build", "--force"]
    assert cmd[-2:] == ["images/x.sif", "envs/triton.def"]
    assert cmd.count("--build-arg") == 4


def test_every_model_runs_in_images_of_its_framework():
    config = base_config()
    for model, settings in config["models"].items():
        framework = config["images"][settings["containers"]["framework"]]
        triton = config["images"][settings["containers"]["triton"]]
        assert framework["definition"] == "envs/framework.def"
        assert triton["definition"] == "envs/triton.def"
        # the Triton image's Python packages match the framework the model is written in, each
        # image locked for its own base
        assert framework["requirements"] == triton["requirements"], model
        assert framework["lock"] != triton["lock"], model
        assert triton["from"].split(":")[1] == triton["sdk"].split(":")[1].removesuffix("-sdk")
        for definition in (framework["definition"], triton["definition"]):
            assert (REPO / definition).is_file()


def test_definitions_use_the_build_args_they_are_given():
    framework = (REPO / "envs" / "framework.def").read_text()
    triton = (REPO / "envs" / "triton.def").read_text()
    assert "From: {{ FROM }}" in framework and "{{ LOCK }}" in framework
    assert "{{ SHIPS }}" in framework
    # trtexec on PATH where NGC's framework images keep it
    from deploybench.preflight.tensorrt import NGC_TRTEXEC

    environment = framework.split("%environment", 1)[1].split("\n%", 1)[0]
    assert f'PATH="$PATH:{NGC_TRTEXEC.parent}"' in environment
    assert "From: {{ SDK }}" in triton and "Stage: sdk" in triton
    assert "From: {{ FROM }}" in triton and "%files from sdk" in triton
    assert "perf_analyzer" in triton


@pytest.mark.parametrize("version", ["1.2.3", "1.2.5"])
def test_an_apptainer_below_the_floor_is_refused_before_the_build(tmp_path, monkeypatch, version):
    """Apptainer 1.2.x drops the definitions' empty %arguments defaults and skips SHIPS: the
    build stops before it starts, naming the version and the floor."""
    monkeypatch.setenv("APPTAINER_STANDIN_VERSION", version)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("APPTAINER_STANDIN_LOG", str(log))
    image = images.in_source_tree(base_config()["images"]["pytorch-25.01"], REPO)
    out = tmp_path / "images" / "pytorch-25.01.sif"
    with pytest.raises(ImageBuildError, match=rf"Apptainer {version} cannot build .*>= 1\.3\.0"):
        images.build(
            name="pytorch-25.01",
            image=image,
            out=str(out),
            record_out=str(out.with_suffix(".json")),
            log_file=str(tmp_path / "build.log"),
            apptainer=str(STANDIN / "apptainer"),
        )
    assert [call[0] for call in _calls(log)] == ["--version"]  # nothing built
    assert not out.parent.exists() or not any(out.parent.iterdir())
    monkeypatch.setenv("APPTAINER_STANDIN_VERSION", "1.3.0")
    assert "1.3.0" in images.check_apptainer(str(STANDIN / "apptainer"))


def test_every_image_holds_what_its_jobs_import():
    """What the jobs of the rules declaring an image import (read from the jobs' code) comes
    from that image's lock or the packages its base ships; the charts and reports, which no
    image's lock holds, run where Snakemake runs."""
    by_role = job_imports.rules_by_role(workflow_rules())
    assert set(by_role) == {"framework", "triton", job_imports.DRIVER_ROLE}
    assert {"plots", "model_report", "search_plots"} <= set(by_role[job_imports.DRIVER_ROLE])
    assert "preflight_check" in by_role["framework"] and "preflight_check" in by_role["triton"]
    role_modules = job_imports.role_imports(by_role)
    config = base_config()
    for name, image in config["images"].items():
        # the roles it plays: the models' images, or older ones a GPU falls back on
        roles = {
            role
            for model in config["models"].values()
            for role, used in model["containers"].items()
            if name in image_chain(config, used)
        }
        modules = sorted({m for role in roles for m in role_modules[role]})
        held = set(locks.parse_lock((REPO / image["lock"]).read_text()))
        held |= {locks.canonical(n) for n in image["release"]["ships"]}
        imported = job_imports.distributions_imported(modules)
        missing = {
            top: dists
            for top, dists in imported.items()
            if not {locks.canonical(d) for d in dists} & held
        }
        assert roles and not missing, (name, sorted(roles), missing)


def test_a_build_without_network_stops_before_it_starts_saying_where_to_build(
    tmp_path, monkeypatch
):
    """`container_image` runs where Snakemake runs: on a compute node without network the
    build stops at once, naming the host and where to build instead."""
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("APPTAINER_STANDIN_LOG", str(log))
    monkeypatch.setenv("DEPLOYBENCH_BUILD_HOSTS", "127.0.0.1:9")  # nothing listens there
    image = images.in_source_tree(base_config()["images"]["triton-25.01"], REPO)
    out = tmp_path / "images" / "triton-25.01.sif"
    with pytest.raises(
        ImageBuildError, match=r"cannot reach 127\.0\.0\.1:9 .*--until container_image"
    ):
        images.build(
            name="triton-25.01", image=image, out=str(out), record_out=str(tmp_path / "r.json"),
            log_file=str(tmp_path / "build.log"), apptainer=str(STANDIN / "apptainer"),
        )  # fmt: skip
    assert [call[0] for call in _calls(log)] == ["--version"] and not out.exists()
    assert "cannot reach 127.0.0.1:9" in (tmp_path / "build.log").read_text()
    # what a build reaches by default: the bases' registry and PyPI; a proxy instead
    monkeypatch.delenv("DEPLOYBENCH_BUILD_HOSTS")
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    assert images.build_hosts(image) == [
        ("nvcr.io", 443), ("pypi.org", 443), ("files.pythonhosted.org", 443)
    ]  # fmt: skip
    monkeypatch.setenv("HTTPS_PROXY", "http://user:pw@proxy.site:3128")
    assert images.build_hosts(image) == [("proxy.site", 3128)]


def test_unknown_image_name_is_a_config_error():
    config = base_config()
    config["models"]["tft"]["containers"]["triton"] = "triton-99.99"
    with pytest.raises(
        ConfigError, match=r"unknown image 'triton-99.99'; valid choices: .*triton-25.01"
    ):
        images.check_images(config)


def test_data_outside_the_workdir_is_bound_read_only(tmp_path):
    config = base_config()
    outside = tmp_path / "data" / "ckpt.pt"
    config["models"]["tft"]["checkpoint"] = str(outside)
    config["models"]["bert"]["accuracy"]["task"]["path"] = "squad"  # relative: in the workdir
    binds = images.data_binds(config, tmp_path / "work")
    assert binds == [f"{outside}:{outside}:ro"]
    args = images.job_options("--nv", binds, {"PYTHONPATH": "/src"})
    assert args == f"--nv --bind {outside}:{outside}:ro --env PYTHONPATH=/src"
    # a job re-reading the workflow adds nothing
    assert images.job_options(args, binds, {"PYTHONPATH": "/src"}) == args


def test_running_image_reads_the_build_record(tmp_path, monkeypatch):
    sif = tmp_path / "x.sif"
    sif.write_bytes(b"image")
    record = {"name": "x", "sha256": sha256_of(sif)}
    (tmp_path / "x.json").write_text(json.dumps(record))
    monkeypatch.setenv("APPTAINER_CONTAINER", str(sif))
    info = images.running_image()
    assert info["runtime"] == "apptainer" and info["sha256"] == record["sha256"]
    monkeypatch.delenv("APPTAINER_CONTAINER")
    assert images.running_image() == {"image": None, "runtime": "native venv"}


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line)["argv"] for line in log.read_text().splitlines()]


def _source_tree(tmp_path: Path, *, with_package: bool = False) -> Path:
    """A copy of the workflow's source tree, so a test may edit a definition file; with the
    package, laid out as a user's checkout."""
    src = tmp_path / "src"
    src.mkdir()
    parts = ("Snakefile", "rules", "scripts", "envs", "config", "profiles")
    for part in (*parts, "deploybench") if with_package else parts:
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy2
        copy(REPO / part, src / part, **({"ignore": IGNORE} if copy is shutil.copytree else {}))
    return src


IGNORE = shutil.ignore_patterns("__pycache__")


def standin_cannot_isolate() -> str | None:
    """Why the stand-in cannot make a container's mount namespace here (None: it can)."""
    probe = subprocess.run(
        ["unshare", "--mount", "true"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        reason = f"no mount namespace for the apptainer stand-in: {probe.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the containers tests: {reason}")
        return reason
    return None


# On the host, but neither in the stand-in's image nor among Apptainer's default mounts (the
# checkout itself may lie under /tmp, which is one).
HOST_ONLY = Path("/var/lib")


def _standin(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": os.pathsep.join([str(STANDIN), str(BIN), os.environ["PATH"]])}
    return subprocess.run(
        ["apptainer", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_standin_mounts_as_apptainer_does(tmp_path):
    """The stand-in's `exec` mounts in Apptainer's order and shows nothing else of the host, so
    a mount mistake fails here as it would in a real container."""
    if reason := standin_cannot_isolate():
        pytest.skip(reason)
    assert HOST_ONLY.exists()
    tree = tmp_path / "checkout"
    (tree / "deploybench").mkdir(parents=True)
    image = tmp_path / "x.sif"
    image.write_text("stand-in image")
    probe = (
        'echo "home=$HOME path=$PATH pwd=$PWD"; touch results.csv; echo "write=$?"; '
        'touch deploybench/x.py; echo "package_write=$?"; '
        f'test -e {HOST_ONLY}; echo "host_file=$?"; exit 3'
    )
    # Snakemake's command from a checkout: --home <cwd>, then this project's binds
    whole_tree = _standin(
        tree, "exec", "--home", str(tree), "--bind", f"{tree}:{tree}:ro", str(image),
        "bash", "-c", probe,
    )  # fmt: skip
    assert whole_tree.returncode == 3, whole_tree.stderr  # the command's own exit status
    assert "write=1" in whole_tree.stdout  # a read-only bind over the home hides it
    assert "Read-only file system" in whole_tree.stderr
    package = tree / "deploybench"
    package_only = _standin(
        tree, "exec", "--home", str(tree), "--bind", f"{package}:{package}:ro", str(image),
        "bash", "-c", probe,
    )  # fmt: skip
    out = package_only.stdout
    assert "write=0" in out and "package_write=1" in out, out + package_only.stderr
    assert "host_file=1" in out  # what is not bound is not there
    assert f"home={tree} " in out and f"pwd={tree}" in out
    # the image's PATH, not the host's: the stand-in's image is this venv
    assert (
        f"path={BIN}:/opt/tritonserver/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        in out
    )
    assert (tree / "results.csv").exists() and not (package / "x.py").exists()
    missing = _standin(tree, "exec", "--home", str(tree), str(tmp_path / "no.sif"), "true")
    assert missing.returncode == 255 and "could not open image" in missing.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("layout", ["checkout"])
def test_cpu_chain_under_sdm_apptainer_wraps_every_job_in_its_pinned_image(tmp_path, layout):
    """The CPU chain with every job in its (stand-in) container, from a checkout, where the
    working directory is the source tree and the package bound read-only lies inside the job's
    read-write home. The images are environments of another Python holding only what each
    image's lock and base hold (tests/standin_image.py); the charts and the report page, drawn
    where Snakemake runs, are made too. (`layout="workdir"`, a working directory of its own, passes too; CI leaves
    it to tests/test_slurm.py's chain, which runs the same jobs under the same stand-in from a
    working directory of its own.)"""
    if reason := standin_cannot_isolate():
        pytest.skip(reason)
    src = _source_tree(tmp_path, with_package=layout == "checkout")
    if layout == "checkout":
        work, package_root = src, src
    else:
        work, package_root = tmp_path / "work", REPO
        work.mkdir()
    config = orchestration_config()
    # a checkpoint outside the working directory: the jobs reading it need it bound
    checkpoint = tmp_path / "checkpoints" / "tft.pt"
    checkpoint.parent.mkdir()
    tft = config["models"]["tft"]
    write_seeded_checkpoint(load_family(tft["module"], tft["hparams"]), 7, checkpoint)
    tft["checkpoint"] = str(checkpoint)
    write_config(work, config)
    log = tmp_path / "apptainer-calls.jsonl"
    # the default target: the run's results, its charts and its model's report page
    assert config["targets"] == ["tft/cpu/onnx/fp32"] and RUN.endswith(config["targets"][0])
    targets: list[str] = []

    def snakemake(*args: str):
        return run_snakemake(
            work,
            *targets,
            "--sdm", "apptainer",
            "--apptainer-args=--nv",
            *args,
            snakefile=src / "Snakefile",
            # the checkout's own deploybench, as a user's `snakemake` in their checkout has it
            env={"APPTAINER_STANDIN_LOG": str(log), "PYTHONPATH": str(package_root)},
            path_first=(STANDIN,),
        )  # fmt: skip

    result = snakemake()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    calls = _calls(log)

    # each image built once, from its definition, with the pinned NGC bases
    builds = {c[-1]: c for c in calls if c[0] == "build"}
    assert set(builds) == {str(src / "envs" / "framework.def"), str(src / "envs" / "triton.def")}
    triton_build = builds[str(src / "envs" / "triton.def")]
    assert "FROM=nvcr.io/nvidia/tritonserver:25.01-py3" in triton_build
    assert "SDK=nvcr.io/nvidia/tritonserver:25.01-py3-sdk" in triton_build
    assert not any(c[0] == "pull" for c in calls)  # nothing pulled: every image is built

    expected_image = {
        role: f"images/{tft['containers'][role]}.sif" for role in ("framework", "triton")
    }
    jobs = [c for c in calls if c[0] == "exec"]
    scripts = []
    for call in jobs:
        script = call[-1].rsplit(".", 2)[-2] + ".py"  # .snakemake/scripts/tmpXXXX.<name>.py
        scripts.append(script)
        image = next(a for a in call if a.endswith(".sif"))
        options = call[1 : call.index(image)]
        assert image == expected_image[ROLE_OF_SCRIPT[script]], (script, image)
        assert "--nv" in options
        assert options[options.index("--home") + 1] == str(work)
        binds = [options[i + 1] for i, o in enumerate(options) if o == "--bind"]
        assert f"{checkpoint.parent}:{checkpoint.parent}:ro" not in binds  # a file, not its dir
        assert f"{checkpoint}:{checkpoint}:ro" in binds
        # the package only, so that the job imports this deploybench and can write its home
        package = package_root / "deploybench"
        assert f"{package}:{package}:ro" in binds
        assert str(package_root) not in [(b.split(":") * 2)[1] for b in binds]  # not the tree
        assert options[options.index("--env") + 1] == f"PYTHONPATH={package_root}"
        assert call[-3:-1] == ["bash", "-c"]
    # the charts and the report were drawn too, where Snakemake runs (in no image)
    assert sorted(scripts) == sorted(
        ["checkpoint.py", "export.py", "repository.py", "accuracy.py", "perf.py", "perf.py"]
    )
    assert (work / "reports" / "targets" / "tft.html").is_file()
    assert list((work / RUN / "plots").glob("*.svg"))

    # every result names the image that produced it, with the build record's digest
    for name, role in (
        ("accuracy", "triton"),
        ("offline", "triton"),
        ("online", "triton"),
    ):
        container = json.loads((work / RUN / f"{name}.provenance.json").read_text())["container"]
        record = json.loads((work / expected_image[role]).with_suffix(".json").read_text())
        assert container["image"] == expected_image[role]
        assert container["sha256"] == record["sha256"] == sha256_of(work / expected_image[role])
        # run by the image's Python and tritonserver, none of the driver's (not pytriton's
        # server through Snakemake's search paths)
        provenance = json.loads((work / RUN / f"{name}.provenance.json").read_text())
        assert provenance["python"] == standin_image.image_python_version()
        assert provenance["tritonserver"]["binary"] == "/opt/tritonserver/bin/tritonserver"
        assert "standin" in container["record"]["apptainer"]  # the record says what built it
        # and what it installed: the lock's digest
        lock = src / container["record"]["lock"]
        assert container["record"]["lock_sha256"] == sha256_of(lock)
    export = json.loads(
        (work / "results/tft/export/onnx/fp32/model.onnx.provenance.json").read_text()
    )
    assert export["container"]["image"] == expected_image["framework"]

    # up to date; then a changed Triton definition rebuilds that image and reruns only the
    # jobs that ran in it
    if layout == "checkout":
        return
    assert planned_jobs(snakemake("-n")) == {}
    definition = src / "envs" / "triton.def"
    definition.write_text(definition.read_text() + "\n# changed\n")
    assert planned_jobs(snakemake("-n")) == {
        "container_image": 1,
        "accuracy": 1,
        "offline": 1,
        "online": 1,
    }


def test_native_runs_need_no_image(tmp_path):
    write_config(tmp_path, base_config())
    jobs = planned_jobs(run_snakemake(tmp_path, "-n", "results/tft/cpu/onnx/fp32/online.csv"))
    assert "container_image" not in jobs and jobs["online"] == 1


def test_a_prebuilt_image_is_pulled_not_built_and_preflighted_the_same_way(tmp_path):
    """`images.<image>.image` (a site's own image) instead of a build: Snakemake pulls it, and
    the preflight checks it in the same jobs as a built one."""
    config = base_config()
    release = config["images"]["triton-25.01"]["release"]
    site_image = "docker://registry.example.org/site/tritonserver-deploybench:25.01"
    config["images"]["triton-25.01"] = {"image": site_image, "release": release}
    write_config(tmp_path, config)
    result = run_snakemake(tmp_path, "preflight", "-n", "--sdm", "apptainer", path_first=(STANDIN,))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert f"Singularity image {site_image} will be pulled" in out
    # only the framework image is built; both images get their preflight job
    assert planned_jobs(result) == {"container_image": 1, "preflight_check": 2, "preflight": 1}
    assert "wildcards: image=pytorch-25.01" in out and "gpu=cpu, image=triton-25.01" in out
