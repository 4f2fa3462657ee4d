"""What every model family must provide: the language refuses a model class that lacks it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploybench import models
from deploybench.errors import ConfigError
from deploybench.models import TorchFamily, framework_of, load_family, model_modules
from tests.conftest import REPO, base_config


class _NoExampleInputs(TorchFamily):
    """A model class that forgot ``example_inputs``."""

    def build(self) -> Any:
        raise AssertionError("never built")


def test_a_family_missing_an_abstract_method_cannot_be_instantiated():
    with pytest.raises(TypeError, match="abstract method.*example_inputs"):
        _NoExampleInputs()  # type: ignore[abstract]


def test_the_optional_methods_keep_their_clear_errors():
    class Minimal(_NoExampleInputs):
        def example_inputs(self, batch: int, seed: int) -> dict[str, np.ndarray]:
            return {}

    family = Minimal()
    with pytest.raises(NotImplementedError, match="Minimal has no data-set reader"):
        family.dataset_batches("data", 1, None)
    with pytest.raises(NotImplementedError, match="Minimal has no task metric"):
        family.task_metric([], [])


# What a framework image ships when it runs a framework's models (its ``release.ships``).
FRAMEWORK_PACKAGES = {"pytorch": "torch", "tensorflow": "tensorflow"}


@pytest.mark.parametrize("model", sorted(base_config()["models"]))
def test_each_family_framework_agrees_with_the_config(model):
    """The framework the DAG plans for (read from the module, not imported), the family's own
    and the one its configured framework image ships are one."""
    config = base_config()
    settings = config["models"][model]
    family = load_family(settings["module"], settings["hparams"])
    assert framework_of(settings["module"]) == family.framework
    ships = config["images"][settings["containers"]["framework"]]["release"]["ships"]
    assert {FRAMEWORK_PACKAGES[family.framework]} == set(FRAMEWORK_PACKAGES.values()) & set(ships)


def test_model_modules_are_the_files_of_the_models_package():
    files = Path(models.__file__).parent.glob("*.py")
    assert model_modules() == sorted(
        {f.stem for f in files} - {"__init__", "base", "fastpitch_data"}
    )
    configured = {s["module"] for s in base_config()["models"].values()}
    assert configured <= set(model_modules())


def test_an_unknown_module_is_refused_naming_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown model module 'tfx'; valid: \['bert', "):
        framework_of("tfx")
    with pytest.raises(ConfigError, match="unknown model module 'tfx'"):
        load_family("tfx", {})


def test_framework_of_imports_no_framework():
    """The DAG is built without torch or TensorFlow: framework_of reads the module's source."""
    code = (
        "import sys; from deploybench.models import framework_of; "
        "print(framework_of('tft'), framework_of('resnet50')); "
        "print(sorted({'torch', 'tensorflow', 'deploybench.models.tft'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[:2] == ["pytorch tensorflow", "[]"]


def test_a_module_without_exactly_one_family_class_is_refused(tmp_path, monkeypatch):
    (tmp_path / "two.py").write_text(
        "class A(TorchFamily):\n    pass\n\nclass B(KerasFamily):\n    pass\n"
    )
    (tmp_path / "none.py").write_text("class Helper:\n    pass\n")
    monkeypatch.setattr(models, "MODELS_DIR", tmp_path)
    models._family_class.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"exactly one family class.*found \['A', 'B'\]"):
            framework_of("two")
        with pytest.raises(ConfigError, match="found none"):
            framework_of("none")
    finally:
        models._family_class.cache_clear()
