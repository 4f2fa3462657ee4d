"""DLE checkpoint facts for the tests: parameter names and shapes listed from DLE's own model
code (``tests/fixtures/dle/*.json``; each file's ``source`` says which code, commit and
hyper-parameters, and how it was listed), and seeded values to fill them with.

The tests write checkpoints in the containers DLE's training scripts save and load them through
the workflow's path; no DLE code is part of this project.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

FIXTURES = Path(__file__).parent / "fixtures" / "dle"


def dle_fixture(name: str) -> dict[str, Any]:
    """``tests/fixtures/dle/<name>.json``."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def seeded_values(shapes: dict[str, list[int]], seed: int) -> dict[str, Any]:
    """A distinct float32 tensor per name (drawn in sorted-name order, so the same names and
    seed give the same values in any process)."""
    import torch

    rng = np.random.default_rng(seed)
    return {
        name: torch.from_numpy(rng.standard_normal(shapes[name]).astype(np.float32) * 0.1)
        for name in sorted(shapes)
    }
