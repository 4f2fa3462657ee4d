"""The containers DLE's training scripts save a network's weights in, read by one reader."""

from __future__ import annotations

import argparse

import pytest
import torch

from deploybench.checkpoint import read_state_dict, resolve_checkpoint_file

WEIGHTS = {"conv.weight": torch.arange(6.0).reshape(1, 2, 3), "conv.bias": torch.ones(1)}


def _assert_weights(state, expected=WEIGHTS):
    assert state.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(state[name], value), name


@pytest.mark.parametrize(
    ("container", "name"),
    [
        (WEIGHTS, "bare.pt"),  # torch.save(model.state_dict())
        ({"args": argparse.Namespace(lr=1), "config": None, "model": WEIGHTS}, "tft.pt"),
        ({"model": WEIGHTS}, "bert_large_qa.pt"),  # run_squad.py
        (
            {"epoch": 3, "iteration": 9, "state_dict": WEIGHTS, "optimizer": {}, "scaler": {}},
            "FastPitch_checkpoint_3.pt",
        ),
        ({"model": {f"module.{k}": v for k, v in WEIGHTS.items()}}, "ddp.pt"),
    ],
)
def test_weights_are_found_in_every_container(tmp_path, container, name):
    torch.save(container, tmp_path / name)
    _assert_weights(read_state_dict(tmp_path / name))


def test_ema_copy_is_read_only_when_asked(tmp_path):
    ema = {k: v + 1 for k, v in WEIGHTS.items()}
    torch.save({"state_dict": WEIGHTS, "ema_state_dict": ema}, tmp_path / "fp.pt")
    _assert_weights(read_state_dict(tmp_path / "fp.pt"))
    _assert_weights(read_state_dict(tmp_path / "fp.pt", ema=True), ema)
    torch.save({"state_dict": WEIGHTS}, tmp_path / "no-ema.pt")
    with pytest.raises(ValueError, match=r"checkpoint_ema is set but .* no 'ema_state_dict'"):
        read_state_dict(tmp_path / "no-ema.pt", ema=True)


def test_lightning_checkpoint_keeps_only_the_network(tmp_path):
    ckpt = {
        "pytorch-lightning_version": "1.2.7",
        "epoch": 7,
        "global_step": 70,
        "state_dict": {
            **{f"model.{k}": v for k, v in WEIGHTS.items()},
            "loss.dice.weight": torch.zeros(2),  # another member of the Lightning module
        },
        "hyper_parameters": {"args": argparse.Namespace(dim=3)},
    }
    torch.save(ckpt, tmp_path / "nvidia_nnunet_pyt_ckpt_amp_3d_fold2.ckpt")
    _assert_weights(read_state_dict(tmp_path))  # a directory holding one .ckpt


def test_channels_last_weights_become_contiguous(tmp_path):
    kernel = torch.arange(2 * 3 * 2 * 2 * 2.0).reshape(2, 3, 2, 2, 2)
    strided = kernel.to(memory_format=torch.channels_last_3d)
    assert not strided.is_contiguous()
    torch.save({"model": {"w": strided}}, tmp_path / "cl.pt")
    state = read_state_dict(tmp_path / "cl.pt")
    assert state["w"].is_contiguous()
    assert torch.equal(state["w"], kernel)


def test_checkpoint_directories(tmp_path):
    torch.save(WEIGHTS, tmp_path / "a.pt")
    assert resolve_checkpoint_file(tmp_path) == tmp_path / "a.pt"
    torch.save(WEIGHTS, tmp_path / "b.pt")
    with pytest.raises(ValueError, match=r"holds 2 checkpoints \(a.pt, b.pt\): configure one"):
        resolve_checkpoint_file(tmp_path)
    torch.save({"model": WEIGHTS}, tmp_path / "pytorch_model.bin")  # run_squad.py's name
    assert resolve_checkpoint_file(tmp_path) == tmp_path / "pytorch_model.bin"
    torch.save({"model": WEIGHTS}, tmp_path / "checkpoint.pt")  # TFT's train.py name wins
    assert resolve_checkpoint_file(tmp_path) == tmp_path / "checkpoint.pt"
    with pytest.raises(FileNotFoundError, match="not found"):
        resolve_checkpoint_file(tmp_path / "empty")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ([1, 2], r"not a TFT checkpoint .* found a list"),
        ({"weights": 1}, r"not a TFT checkpoint .* keys: \['weights'\]"),
        ({"model": {"w": 1}}, "weights are not a state dict of tensors"),
    ],
)
def test_other_contents_are_refused_by_name(tmp_path, content, message):
    torch.save(content, tmp_path / "x.pt")
    with pytest.raises(ValueError, match=message):
        read_state_dict(tmp_path / "x.pt", model="TFT")
