"""DLE checkpoint facts for the tests: parameter names and shapes listed from DLE's own model
code (``tests/fixtures/dle/*.json``; each file's ``source`` says which code, commit and
hyper-parameters, and how it was listed), and seeded values to fill them with.

The tests write checkpoints in the containers DLE's training scripts save and load them through
the workflow's path; no DLE code is part of this project.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
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


def write_tft_train_checkpoint(folder: Path, state: dict[str, Any]) -> Path:
    """``<folder>/checkpoint.pt`` as DLE's TFT train.py saves it: its argparse namespace, its
    config object (a class from DLE's ``configuration`` module) and the state dict."""
    import torch

    fake = types.ModuleType("configuration")
    config_class = type("ElectricityConfig", (), {"__module__": "configuration"})
    fake.ElectricityConfig = config_class  # type: ignore[attr-defined]
    sys.modules["configuration"] = fake
    try:
        folder.mkdir(parents=True, exist_ok=True)
        ckpt = {"args": argparse.Namespace(dataset="electricity"), "config": config_class()}
        torch.save({**ckpt, "model": state}, folder / "checkpoint.pt")
    finally:
        del sys.modules["configuration"]
    return folder


def tft_reference_checkpoint(layout: str) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """DLE's smoke-size electricity TFT with the fixture's seeded weights in ``layout``
    (``TFTpart2`` or ``flat``): the fixture's reference, the family, the state dict."""
    from deploybench.models import load_family

    ref = dle_fixture("tft-electricity")["reference"]
    family = load_family("tft", ref["hparams"])
    state = seeded_values(ref["parameters"], ref["seed"])
    # The attention mask is DLE's buffer (the causal -inf triangle), not a trained value.
    state["TFTpart2.attention._mask"] = family.init_state(0)["model"]["attention._mask"]
    assert set(state) == set(ref["parameters"]) | set(ref["buffers"])
    if layout == "flat":
        state = {k.removeprefix("TFTpart2."): v for k, v in state.items()}
    return ref, family, state
