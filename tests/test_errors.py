"""One exception hierarchy: every error deploybench defines derives from DeploybenchError."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import deploybench
from deploybench import errors


def _modules():
    for info in pkgutil.walk_packages(deploybench.__path__, "deploybench."):
        if info.name == "deploybench.triton_model":
            continue  # runs inside Triton's python backend (imports its triton_python_backend_utils)
        yield importlib.import_module(info.name)


def test_every_error_class_derives_from_the_base():
    defined = {
        (module.__name__, name): obj
        for module in _modules()
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and issubclass(obj, Exception)
        and obj.__module__.startswith("deploybench")
    }
    assert defined, "no exception classes found"
    outside = sorted(
        f"{m}.{n}"
        for (m, n), cls in defined.items()
        if not issubclass(cls, errors.DeploybenchError)
    )
    assert outside == []


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (errors.ConfigError, ValueError),
        (errors.CheckpointError, ValueError),
        (errors.DataError, ValueError),
        (errors.InputNotFound, FileNotFoundError),
        (errors.ServerError, RuntimeError),
        (errors.PreflightError, RuntimeError),
    ],
)
def test_errors_are_still_the_builtin_their_callers_catch(error, builtin):
    assert issubclass(error, builtin) and issubclass(error, errors.DeploybenchError)
