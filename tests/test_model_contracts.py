"""What every model family must provide: the language refuses a model class that lacks it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from deploybench.models import TorchFamily


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
