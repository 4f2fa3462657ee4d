"""The libraries of each image see the versions its base ships, and every network its jobs build
is built there.

NGC's torch is a pre-release (``2.6.0a0+ecf3bae40a`` in PyTorch 25.01, ``2.5.0a0+b465a5843b`` in
24.09: ``images.<i>.release.ships``), and transformers enables its PyTorch classes only where its
version gate passes (``is_torch_available``: ``torch >= 2.6.0`` from 5.20; under PEP 440
``2.6.0a0 < 2.6.0``). So each image whose requirements name transformers gets its stand-in
(tests/standin_image.py: another Python, only the lock's packages; the stand-in torch reports the
shipped version), and the preflight's ``model_networks`` check runs in it for the GPU whose runs
use the image, with the config's own models and hyper-parameters.

The stand-in's Python is this machine's apt 3.11 for every image, also the 24.09 ones (3.10 in
NGC): the CPU torch that stands in for NVIDIA's build exists here for 3.11 only. What 3.10 itself
changes is checked by tests/test_python310.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from deploybench import images
from deploybench.errors import ConfigError
from deploybench.locks import canonical, parse_lock, requirement_names
from deploybench.planning.preflight_plan import plan_preflight
from tests import standin_image
from tests.conftest import REPO, base_config, validated

CONFIG = base_config()
IMAGES = sorted(
    name
    for name, image in CONFIG["images"].items()
    if "transformers" in map(canonical, requirement_names(REPO / image["requirements"]))
)


def gpu_using(config: dict, image: str) -> str:
    """The first configured GPU whose runs use ``image``."""
    for gpu in config["gpus"]:
        try:
            plan_preflight(config, gpu, image)
        except ConfigError:
            continue
        return gpu
    raise AssertionError(f"no GPU's runs use image {image}")


def test_the_images_with_transformers_are_the_pytorch_ones():
    assert IMAGES == ["pytorch-24.09", "pytorch-25.01", "triton-24.09", "triton-25.01"]


@pytest.mark.parametrize("image_name", IMAGES)
def test_every_network_builds_in_the_images_stand_in(image_name, tmp_path):
    config = validated(CONFIG)
    gpu = gpu_using(config, image_name)
    spec = plan_preflight(config, gpu, image_name)
    assert "bert" in spec["models"], spec["models"]
    image = images.in_source_tree(config["images"][image_name], REPO)
    args = dict(arg.split("=", 1) for arg in images.build_args(image))
    env = standin_image.environment(Path(image["lock"]), args, standin_image.IMAGE_PYTHON)
    # the check as the preflight job runs it, in the stand-in's Python
    script = (
        "import json, sys\n"
        "from deploybench.preflight.networks import check_model_networks\n"
        "print(json.dumps(check_model_networks(json.loads(sys.argv[1])).as_dict()))\n"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(env / "bin" / "python"), "-c", script, json.dumps(spec)],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=False,
        env={**clean, "PYTHONPATH": str(REPO), "HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    check = json.loads(done.stdout.splitlines()[-1])
    # the stand-in's torch is the one the image has: the base's build, or the lock's
    shipped = (image["release"].get("ships") or {}).get("torch")
    locked = parse_lock(Path(image["lock"]).read_text()).get("torch", (None, 0))[0]
    assert check["facts"]["versions"]["torch"] == (shipped or locked), check
    assert check["status"] == "pass", f"{gpu}/{image_name}: {check['detail']} ({check['fix']})"
    assert set(check["facts"]["models"]) == set(spec["models"])
