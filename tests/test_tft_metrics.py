"""TFT's task metric (normalised quantile risk), its test-data readers and the traffic variant."""

import pickle
import sys
import types

import numpy as np
import pytest

from deploybench.export import export_model
from deploybench.models import load_family
from deploybench.models.tft import quantile_risk
from deploybench.runtime import load_runner

QUANTILES = (0.1, 0.5, 0.9)

# A tiny electricity-like network: 12 steps, 9 of history, a 3-step horizon.
SMALL = {
    "static_categorical_inp_lens": [5],
    "temporal_known_continuous_inp_size": 3,
    "example_length": 12,
    "encoder_length": 9,
    "n_head": 2,
    "hidden_size": 8,
}

# DLE's TrafficConfig (PyTorch/Forecasting/TFT/configuration.py); the continuous sizes are
# derived there from its feature list: 3 known (time_on_day, day_of_week, hours_from_start),
# no observed, one target (values).
TRAFFIC_HPARAMS = {
    "static_categorical_inp_lens": [963],
    "temporal_known_continuous_inp_size": 3,
    "temporal_observed_continuous_inp_size": 0,
    "temporal_target_size": 1,
    "quantiles": [0.1, 0.5, 0.9],
    "example_length": 192,
    "encoder_length": 168,
    "n_head": 4,
    "hidden_size": 128,
    "dropout": 0.3,
    "attn_dropout": 0.0,
}


# --- quantile risk: known answers -----------------------------------------------------------


def test_perfect_forecast_has_zero_risk():
    target = np.array([[1.0, -2.0], [3.0, 4.0]])
    pred = np.repeat(target[..., None], 3, axis=-1)
    assert quantile_risk(pred, target, QUANTILES) == {"p10": 0.0, "p50": 0.0, "p90": 0.0}


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        # Over-forecast by 1 on 4 steps, Σ|y| = 10: loss (1-q) per step → 2·4(1-q)/10.
        (1.0, {"p10": 0.72, "p50": 0.4, "p90": 0.08}),
        # Under-forecast by 2: loss 2q per step → 2·8q/10.
        (-2.0, {"p10": 0.16, "p50": 0.8, "p90": 1.44}),
    ],
)
def test_constant_offset_risk_matches_hand_computation(offset, expected):
    target = np.array([[1.0, 2.0], [3.0, 4.0]])
    pred = np.repeat(target[..., None], 3, axis=-1) + offset
    risk = quantile_risk(pred, target, QUANTILES)
    assert risk == pytest.approx(expected)


def test_risk_normalises_by_absolute_targets():
    # Σ|y| = 4 although Σy = 0; under-forecast by 1 everywhere: 2·2q/4 = q.
    target = np.array([[2.0, -2.0]])
    pred = np.repeat(target[..., None], 3, axis=-1) - 1.0
    assert quantile_risk(pred, target, QUANTILES) == pytest.approx(
        {"p10": 0.1, "p50": 0.5, "p90": 0.9}
    )


def test_risk_rejects_mismatched_shapes_and_zero_targets():
    with pytest.raises(ValueError, match="do not match"):
        quantile_risk(np.zeros((2, 3, 2)), np.ones((2, 3)), QUANTILES)
    with pytest.raises(ValueError, match="every target is zero"):
        quantile_risk(np.zeros((2, 3, 3)), np.zeros((2, 3)), QUANTILES)


# --- DLE's processed test split ------------------------------------------------------------


@pytest.fixture
def small():
    return load_family("tft", SMALL)


def _series(series_id: int, rows: int, rng: np.random.Generator) -> np.ndarray:
    """One series in DLE's test.bin columns: id, time, target, 3 known, static category."""
    out = np.empty((rows, 7), dtype=np.float32)
    out[:, 0] = series_id
    out[:, 1] = np.arange(rows)
    out[:, 2:6] = rng.standard_normal((rows, 4))
    out[:, 6] = series_id % 5
    return out.view(np.int32)  # DLE stores the float32 bits as int32


def _fake_sklearn_scalers(monkeypatch, scales: dict) -> bytes:
    """A pickle as sklearn writes StandardScalers, made without sklearn installed."""

    class StandardScaler:
        pass

    module = types.ModuleType("sklearn.preprocessing._data")
    StandardScaler.__module__ = module.__name__
    StandardScaler.__qualname__ = "StandardScaler"
    module.StandardScaler = StandardScaler
    for name in ("sklearn", "sklearn.preprocessing"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    scalers = {}
    for key, (mean, std) in scales.items():
        scaler = StandardScaler()
        scaler.__dict__.update(
            with_mean=True,
            with_std=True,
            copy=True,
            feature_names_in_=np.array(["power_usage"], dtype=object),
            n_features_in_=1,
            n_samples_seen_=np.int64(1000),
            mean_=np.array([mean]),
            var_=np.array([std**2]),
            scale_=np.array([std]),
            _sklearn_version="0.24.2",
        )
        scalers[key] = scaler
    data = pickle.dumps(scalers)
    for name in ("sklearn.preprocessing._data", "sklearn.preprocessing", "sklearn"):
        monkeypatch.delitem(sys.modules, name)
    return data


@pytest.fixture
def dle_split(tmp_path, monkeypatch):
    """Series 3 (14 rows: 3 examples) and 7 (12 rows: 1 example); series 9 is too short."""
    rng = np.random.default_rng(0)
    grouped = [_series(3, 14, rng), _series(7, 12, rng), _series(9, 10, rng)]
    folder = tmp_path / "electricity_bin"
    folder.mkdir()
    (folder / "test.bin").write_bytes(pickle.dumps(grouped))
    scales = {3: (10.0, 2.0), 7: (-5.0, 4.0), 9: (0.0, 1.0)}
    (folder / "tgt_scalers.bin").write_bytes(_fake_sklearn_scalers(monkeypatch, scales))
    return folder, [g.view(np.float32) for g in grouped], scales


def test_dle_split_yields_every_window_in_dles_order(small, dle_split):
    folder, grouped, scales = dle_split
    batches = list(small.dataset_batches(folder, batch_size=3, limit=None))
    assert [len(labels["target"]) for _, labels in batches] == [3, 1]
    specs = {s.name: s for s in small.inputs}
    for feeds, _ in batches:
        assert list(feeds) == [s.name for s in small.inputs]
        for name, value in feeds.items():
            assert value.dtype == specs[name].dtype
            assert value.shape[1:] == specs[name].shape
    feeds, labels = batches[0]
    # The third example is series 3 from row 2.
    window = grouped[0][2:14]
    np.testing.assert_array_equal(feeds["k_cont__3"][2], window[:, 3:6])
    np.testing.assert_array_equal(feeds["target__6"][2], window[:, 2:3])
    np.testing.assert_array_equal(feeds["s_cat__0"][2], np.full((12, 1), 3))
    np.testing.assert_array_equal(feeds["id__7"][2], np.full((12, 1), 3))
    assert not feeds["s_cont__1"].any() and feeds["o_cont__5"].shape == (3, 1)
    mean, std = scales[3]
    np.testing.assert_allclose(labels["target"][2], window[9:, 2] * std + mean, rtol=1e-6)
    np.testing.assert_array_equal(labels["target_scale"][2], [mean, std])
    assert batches[1][1]["target_scale"].tolist() == [list(scales[7])]


def test_limit_caps_the_examples(small, dle_split):
    batches = list(small.dataset_batches(dle_split[0], batch_size=3, limit=2))
    assert [len(labels["target"]) for _, labels in batches] == [2]


def test_one_global_scaler_unscales_every_series(small, tmp_path, monkeypatch):
    """Traffic's layout: a single scaler stored under the key ''."""
    rng = np.random.default_rng(1)
    (tmp_path / "test.bin").write_bytes(pickle.dumps([_series(0, 12, rng), _series(1, 13, rng)]))
    scalers = _fake_sklearn_scalers(monkeypatch, {"": (100.0, 10.0)})
    (tmp_path / "tgt_scalers.bin").write_bytes(scalers)
    (_, labels), *_ = small.dataset_batches(tmp_path, batch_size=8, limit=None)
    assert labels["target_scale"].tolist() == [[100.0, 10.0]] * 3


def test_task_metric_unscales_predictions_per_series(small, dle_split):
    folder, _, scales = dle_split
    outputs, labels, scaled = [], [], []
    for feeds, lab in small.dataset_batches(folder, batch_size=3, limit=None):
        future = feeds["target__6"][:, 9:, :].astype(np.float64)  # standardised units
        scaled.append(future)
        labels.append(lab)
        outputs.append({"target__0": np.repeat(future, 3, axis=-1)})
    perfect = small.task_metric(outputs, labels)
    assert next(iter(perfect)) == "quantile_risk_p50" == small.metric_name
    assert perfect == pytest.approx({"quantile_risk_p50": 0, "quantile_risk_p10": 0,
                                     "quantile_risk_p90": 0}, abs=1e-6)  # fmt: skip
    # Over-forecast by 0.5 standardised units: 0.5·std in the data's units, std 2 for the
    # three windows of series 3 and 4 for the one of series 7 (3 horizon steps each).
    shifted = [{"target__0": o["target__0"] + 0.5} for o in outputs]
    risk = small.task_metric(shifted, labels)
    over = 3 * (3 * 0.5 * scales[3][1] + 1 * 0.5 * scales[7][1])  # Σ |ŷ - y| = 15
    total = np.abs(np.concatenate([lab["target"] for lab in labels])).sum()
    for q in QUANTILES:
        assert risk[f"quantile_risk_p{round(q * 100)}"] == pytest.approx(
            2 * (1 - q) * over / total, rel=1e-6
        )


def test_served_model_accepts_the_readers_feeds(small, dle_split):
    feeds, _ = next(small.dataset_batches(dle_split[0], batch_size=3, limit=None))
    module = small.serving_module(small.init_state(0))
    out = small.framework_outputs(module, feeds)
    assert out["target__0"].shape == (3, 3, 3) and np.isfinite(out["target__0"]).all()


def test_dle_split_errors_are_clear(small, dle_split, tmp_path):
    folder = dle_split[0]
    (tmp_path / "test.bin").write_bytes((folder / "test.bin").read_bytes())
    with pytest.raises(FileNotFoundError, match="tgt_scalers.bin is missing"):
        list(small.dataset_batches(tmp_path, 2, None))
    wider = load_family("tft", {**SMALL, "temporal_known_continuous_inp_size": 4})
    with pytest.raises(ValueError, match="need 8 4-byte columns"):
        list(wider.dataset_batches(folder, 2, None))
    observed = load_family("tft", {**SMALL, "temporal_observed_continuous_inp_size": 1})
    with pytest.raises(ValueError, match="convert to the .npz layout"):
        list(observed.dataset_batches(folder, 2, None))
    (folder / "test.bin").write_bytes(pickle.dumps(print))  # a global no data file names
    with pytest.raises(
        ValueError, match="DLE data file .*: refuses to load global 'builtins.print'"
    ):
        list(small.dataset_batches(folder, 2, None))
    with pytest.raises(FileNotFoundError, match="no TFT test data"):
        list(small.dataset_batches(tmp_path / "nowhere", 2, None))


# --- the .npz layout -----------------------------------------------------------------------


def _write_npz(path, n: int, t: int, series_ids, rng: np.random.Generator) -> None:
    np.savez(
        path,
        s_cat=np.repeat(np.array(series_ids)[:, None, None], t, axis=1),
        k_cont=rng.standard_normal((n, t, 3)).astype(np.float32),
        target=rng.standard_normal((n, t, 1)).astype(np.float32),
        id=np.repeat(np.array(series_ids)[:, None, None], t, axis=1),
        target_scale=np.array([[1.0, 2.0]] * n),
    )


def test_npz_layout_fills_absent_groups(small, tmp_path):
    _write_npz(tmp_path / "test.npz", 5, 12, [0, 1, 2, 3, 4], np.random.default_rng(2))
    batches = list(small.dataset_batches(tmp_path, batch_size=2, limit=None))
    assert [len(lab["target"]) for _, lab in batches] == [2, 2, 1]
    feeds, labels = batches[0]
    assert feeds["s_cat__0"].dtype == np.int64 and feeds["k_cat__2"].shape == (2, 1)
    assert labels["target"].shape == (2, 3)
    with np.load(tmp_path / "test.npz") as data:
        expected = data["target"][:2, 9:, 0] * 2.0 + 1.0
    np.testing.assert_allclose(labels["target"], expected, rtol=1e-6)


def test_npz_of_another_example_length_is_rejected(small, tmp_path):
    _write_npz(tmp_path / "short.npz", 2, 10, [0, 1], np.random.default_rng(3))
    with pytest.raises(ValueError, match=r"shape \(10, 1\) per example; .* expects \(12, 1\)"):
        list(small.dataset_batches(tmp_path / "short.npz", 2, None))
    np.savez(tmp_path / "bad.npz", target=np.zeros((2, 12, 1)), target_scale=np.zeros(2))
    with pytest.raises(ValueError, match="target_scale must be"):
        list(small.dataset_batches(tmp_path / "bad.npz", 2, None))


# --- the traffic variant -------------------------------------------------------------------


def test_traffic_variant_exports_and_serves_its_data(tmp_path):
    """DLE's traffic hyper-parameters, at hidden size 16 so the export takes seconds."""
    traffic = load_family("tft", {**TRAFFIC_HPARAMS, "hidden_size": 16})
    shapes = {s.name: s.shape for s in traffic.inputs}
    assert shapes["s_cat__0"] == (192, 1) and shapes["k_cont__3"] == (192, 3)
    assert [(o.name, o.shape) for o in traffic.outputs] == [("target__0", (24, 3))]
    state = traffic.init_state(0)
    assert tuple(state["model"]["embedding.s_cat_embed.0.weight"].shape) == (963, 16)

    out = tmp_path / "traffic.onnx"
    tolerance = {"target__0": {"atol": 1e-4, "rtol": 1e-3}}
    report = export_model(traffic, state, "onnx", "fp32", out, tolerance=tolerance)
    assert all(check["passed"] for check in report["checks"])

    _write_npz(tmp_path / "test.npz", 4, 192, [0, 500, 962, 7], np.random.default_rng(4))
    feeds, labels = next(traffic.dataset_batches(tmp_path, batch_size=4, limit=None))
    runner = load_runner("onnxruntime", out, input_names=list(feeds), output_names=["target__0"])
    served = runner(feeds)[0]
    expected = traffic.framework_outputs(traffic.serving_module(state), feeds)["target__0"]
    np.testing.assert_allclose(served, expected, atol=1e-4, rtol=1e-3)
    risk = traffic.task_metric([{"target__0": served}], [labels])
    assert list(risk) == ["quantile_risk_p50", "quantile_risk_p10", "quantile_risk_p90"]
    assert all(np.isfinite(v) and v > 0 for v in risk.values())
