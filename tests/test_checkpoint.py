"""The containers DLE's training scripts save a network's weights in, read by one reader; and
crafted files that would run code when loaded, refused with nothing run."""

from __future__ import annotations

import argparse
import collections
import functools
import os
import pickle
import re
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch

from deploybench.checkpoint_io import read_state_dict, resolve_checkpoint_file, torch_load
from deploybench.models import load_family
from deploybench.unpickle import Placeholder, UnsafePickleError
from tests.test_tft_metrics import SMALL as TFT_SMALL_HPARAMS

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


# --- files that would run code when loaded ----------------------------------------------------

PROTOCOLS = (2, 3, 4, 5)
PAYLOADS = (
    "exec",
    "eval",
    "__import__",
    "os.system",
    "subprocess.Popen",
    "torch.load",
    "numpy.load",
    "functools.partial",
    "getattr(__import__)",
    "nested",
)
PAYLOAD_MODULE = "deploybench_test_payload"  # a module whose import creates the marker


class _Call:
    """Pickles as ``func(*args)``: how a crafted file makes the unpickler call something."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args

    def __call__(self, *args):  # pickle checks that a reduce's function is callable
        raise AssertionError("only pickled, never called")


def _touch(marker):
    return _Call(os.system, f"touch {marker}")


def _payloads(tmp_path, marker):
    """name → (object whose loading creates ``marker``, the global a refusal names)."""
    inner_pt, inner_npy = tmp_path / "inner.pt", tmp_path / "inner.npy"
    torch.save({"model": {}, "x": _touch(marker)}, inner_pt)
    np.save(inner_npy, np.array([_touch(marker)], dtype=object), allow_pickle=True)
    unsafe_pickle = argparse.Namespace(Unpickler=pickle.Unpickler, load=pickle.load)
    vars(unsafe_pickle)["__name__"] = "pickle"
    code = f"open({str(marker)!r}, 'w').close()"
    return {
        "exec": (_Call(exec, code), "builtins.exec"),
        "eval": (_Call(eval, code), "builtins.eval"),
        "__import__": (_Call(__import__, PAYLOAD_MODULE), "builtins.__import__"),
        "os.system": (_touch(marker), f"{os.system.__module__}.system"),
        "subprocess.Popen": (_Call(subprocess.Popen, ["touch", str(marker)]), "subprocess.Popen"),
        # torch.load of another file with the stock pickle module (so no weights_only)
        "torch.load": (
            _Call(torch.load, str(inner_pt), None, unsafe_pickle),
            "torch.serialization.load",
        ),
        # numpy.load(file, mmap_mode=None, allow_pickle=True) of an object array
        "numpy.load": (_Call(np.load, str(inner_npy), None, True), "numpy.load"),
        "functools.partial": (
            _Call(functools.partial(os.system, f"touch {marker}")),
            "functools.partial",
        ),
        "getattr(__import__)": (
            _Call(_Call(getattr, _Call(__import__, "os"), "system"), f"touch {marker}"),
            "builtins.getattr",
        ),
        # an allowed container (a Namespace in an OrderedDict) holding the malicious object
        "nested": (
            collections.OrderedDict(args=argparse.Namespace(lr=0.1, hook=_touch(marker))),
            f"{os.system.__module__}.system",
        ),
    }


@pytest.fixture
def payload_env(tmp_path, monkeypatch):
    """``tmp_path/marker`` must not appear; ``import deploybench_test_payload`` creates it."""
    marker = tmp_path / "marker"
    (tmp_path / f"{PAYLOAD_MODULE}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path, marker
    sys.modules.pop(PAYLOAD_MODULE, None)


def _appears(marker, timeout=10.0):
    """Whether ``marker`` appears (a Popen'd ``touch`` finishes after the load returns)."""
    deadline = time.monotonic() + timeout
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return marker.exists()


def _write(container, obj, path, protocol):
    if container == "raw":  # DLE's test.bin: a plain pickle
        path.write_bytes(pickle.dumps(obj, protocol=protocol))
    else:
        zipped = container == "zip"
        torch.save(
            {"model": WEIGHTS, "config": obj},
            path,
            pickle_protocol=protocol,
            _use_new_zipfile_serialization=zipped,
        )


def _load_unsafely(container, path):
    if container == "raw":
        return pickle.loads(path.read_bytes())
    return torch.load(path, weights_only=False)


@pytest.mark.parametrize("container", ["raw", "zip", "legacy"])
@pytest.mark.parametrize("payload", PAYLOADS)
def test_crafted_files_are_refused_with_nothing_run(payload_env, payload, container):
    """Each payload runs its command when loaded the usual way (so the check means something);
    the workflow's readers (TFT's test.bin reader for plain pickles, the checkpoint reader for
    torch's zip and legacy formats) refuse it at every protocol, naming the global, and the
    marker the command would create never appears."""
    tmp_path, marker = payload_env
    obj, name = _payloads(tmp_path, marker)[payload]
    folder = tmp_path / "data"
    folder.mkdir()
    file = folder / ("test.bin" if container == "raw" else "checkpoint.pt")
    tft = load_family("tft", TFT_SMALL_HPARAMS)
    for protocol in PROTOCOLS:
        _write(container, obj, file, protocol)
        _load_unsafely(container, file)
        assert _appears(marker), f"{payload} at protocol {protocol} is not a live payload"
        marker.unlink()
        sys.modules.pop(PAYLOAD_MODULE, None)

        what = "DLE data file" if container == "raw" else "checkpoint"
        message = rf"^{what} {re.escape(str(file))}: refuses to load global '{re.escape(name)}'"
        with pytest.raises(UnsafePickleError, match=message):
            if container == "raw":
                list(tft.dataset_batches(folder, 2, None))
            else:
                read_state_dict(folder)
    assert not _appears(marker, timeout=0.5 if payload == "subprocess.Popen" else 0.0)
    assert PAYLOAD_MODULE not in sys.modules


def _fake_module(monkeypatch, module, **classes):
    """Classes as if ``module`` were importable while a file is written (as DLE's scripts
    pickle their own classes); ``monkeypatch`` removes it again, so the reader sees a module
    that is not installed."""
    parts = module.split(".")
    for i in range(1, len(parts)):  # pickle imports the parent packages too
        parent = ".".join(parts[:i])
        monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
    fake = types.ModuleType(module)
    for name, cls in classes.items():
        cls.__module__, cls.__qualname__ = module, name
        setattr(fake, name, cls)
    monkeypatch.setitem(sys.modules, module, fake)
    return fake


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_dle_layouts_load_at_every_protocol(tmp_path, monkeypatch, protocol, legacy):
    """TFT's checkpoint.pt (its configuration class and argparse namespace) and a Lightning
    .ckpt of nnU-Net (callback states keyed by Lightning's callback class, as Lightning < 1.5
    saves them) load without DLE's code or Lightning: the classes as inert placeholders."""

    class ElectricityConfig:
        def __init__(self):
            self.hidden_size = 128

    class ModelCheckpoint:
        pass

    with monkeypatch.context() as patch:
        _fake_module(patch, "configuration", ElectricityConfig=ElectricityConfig)
        lightning = "pytorch_lightning.callbacks.model_checkpoint"
        _fake_module(patch, lightning, ModelCheckpoint=ModelCheckpoint)
        args = argparse.Namespace(dataset="electricity", lr=1e-3, quantiles=[0.1, 0.5, 0.9])
        tft = {"model": WEIGHTS, "config": ElectricityConfig(), "args": args}
        ckpt = {
            "pytorch-lightning_version": "1.2.7",
            "state_dict": {f"model.{k}": v for k, v in WEIGHTS.items()},
            "callbacks": {ModelCheckpoint: {"best_model_score": torch.tensor(0.9)}},
            "hyper_parameters": {"args": argparse.Namespace(dim=3)},
        }
        folder = tmp_path / "tft"
        folder.mkdir()
        for obj, file in ((tft, folder / "checkpoint.pt"), (ckpt, tmp_path / "fold2.ckpt")):
            torch.save(
                obj, file, pickle_protocol=protocol, _use_new_zipfile_serialization=not legacy
            )
    assert "configuration" not in sys.modules
    _assert_weights(read_state_dict(folder))
    _assert_weights(read_state_dict(tmp_path / "fold2.ckpt"))
    loaded = torch_load(folder / "checkpoint.pt")
    assert loaded["args"] == args  # a real Namespace
    config = loaded["config"]
    assert isinstance(config, Placeholder)
    assert config.global_name == "configuration.ElectricityConfig"
    assert config.state == {"hidden_size": 128}
    ((callback, state),) = torch_load(tmp_path / "fold2.ckpt")["callbacks"].items()
    assert callback.global_name == f"{lightning}.ModelCheckpoint"
    assert float(state["best_model_score"]) == pytest.approx(0.9)


def test_placeholders_call_nothing_and_importable_code_is_refused(tmp_path, monkeypatch):
    """A class of a training script's own code loads as a placeholder that runs none of its
    code, even when the pickle calls it with arguments (REDUCE); once that code is importable
    here, loading would run it, so the file is refused."""
    marker = tmp_path / "marker"
    source = tmp_path / "src"
    source.mkdir()
    (source / "dle_train_config.py").write_text(
        "import pathlib\n"
        "class Config:\n"
        "    def __init__(self, *args):\n"
        f"        pathlib.Path({str(marker)!r}).touch()\n"
        "    def __setstate__(self, state):\n"
        f"        pathlib.Path({str(marker)!r}).touch()\n"
    )
    with monkeypatch.context() as patch:
        patch.syspath_prepend(str(source))
        import dle_train_config

        config = dle_train_config.Config.__new__(dle_train_config.Config)
        config.hidden_size = 128  # pickled as state: __setstate__ runs on loading
        data = {
            "model": WEIGHTS,
            "config": _Call(dle_train_config.Config, "electricity"),
            "state": config,
        }
        torch.save(data, tmp_path / "a.pt")
        assert not marker.exists()
        torch.load(tmp_path / "a.pt", weights_only=False)  # the real classes run
        assert marker.exists()
        marker.unlink()
        del sys.modules["dle_train_config"]
    loaded = torch_load(tmp_path / "a.pt")
    assert loaded["config"].args == ("electricity",)
    assert loaded["config"].global_name == "dle_train_config.Config"
    assert loaded["state"].state == {"hidden_size": 128}
    assert not marker.exists()
    monkeypatch.syspath_prepend(str(source))
    with pytest.raises(UnsafePickleError, match="refuses to load global 'dle_train_config.Config'"):
        torch_load(tmp_path / "a.pt")
    assert not marker.exists()
    assert "dle_train_config" not in sys.modules


def test_a_file_may_not_change_a_class_it_names(tmp_path):
    """BUILD on a global (here setattr(argparse.Namespace, '__eq__', 1)) would change code the
    whole process shares."""
    opcodes = (
        b"\x80\x02cargparse\nNamespace\n"  # PROTO 2, GLOBAL argparse.Namespace
        b"N}X\x06\x00\x00\x00__eq__K\x01s\x86b."  # (None, {"__eq__": 1}), TUPLE2, BUILD, STOP
    )
    (tmp_path / "test.bin").write_bytes(opcodes)
    eq = argparse.Namespace.__eq__
    tft = load_family("tft", TFT_SMALL_HPARAMS)
    with pytest.raises(
        UnsafePickleError, match="refuses to set attributes of global 'argparse.Namespace'"
    ):
        list(tft.dataset_batches(tmp_path, 2, None))
    assert argparse.Namespace.__eq__ is eq


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_a_torchscript_archive_is_not_read_as_a_checkpoint(tmp_path):
    """torch.load would hand it to torch.jit.load, which runs the archive's code."""
    torch.jit.save(torch.jit.trace(torch.nn.Linear(2, 1), torch.ones(1, 2)), tmp_path / "m.pt")
    with pytest.raises(ValueError, match="a TorchScript archive"):
        read_state_dict(tmp_path / "m.pt")
