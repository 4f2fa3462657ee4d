"""The accuracy job's task-metric rows: not measured without a data set, thresholds enforced."""

import numpy as np
import pytest

from deploybench.accuracy import TASK_COLUMNS, task_rows
from deploybench.models import load_family

SMALL_TFT = {
    "static_categorical_inp_lens": [5],
    "temporal_known_continuous_inp_size": 3,
    "hidden_size": 8,
    "n_head": 2,
    "example_length": 12,
    "encoder_length": 8,
}


@pytest.fixture(scope="module")
def family():
    return load_family("tft", SMALL_TFT)


@pytest.fixture(scope="module")
def served(family):
    """The framework standing in for Triton: task_rows only sees an inference function."""
    module = family.serving_module(family.init_state(0))
    return lambda feeds: family.framework_outputs(module, feeds)


@pytest.fixture
def dataset(tmp_path):
    rng = np.random.default_rng(0)
    n, t = 6, 12
    ids = np.arange(n) % 5
    path = tmp_path / "test.npz"
    np.savez(
        path,
        s_cat=np.repeat(ids[:, None, None], t, axis=1),
        k_cont=rng.standard_normal((n, t, 3)).astype(np.float32),
        target=rng.standard_normal((n, t, 1)).astype(np.float32),
        id=np.repeat(ids[:, None, None], t, axis=1),
        target_scale=np.array([[10.0, 2.0]] * n),
    )
    return str(path)


def test_without_a_data_set_the_row_says_not_measured(family, served):
    [row] = task_rows(family, {"path": None}, served)
    assert set(row) == set(TASK_COLUMNS)
    assert row["metric"] == "quantile_risk_p50" and row["value"] == ""
    assert "not measured" in row["note"] and row["passed"] == ""


def test_metric_over_the_data_set_and_its_threshold(family, served, dataset):
    calls = []

    def counting(feeds):
        calls.append(len(feeds["s_cat__0"]))
        return served(feeds)

    rows = task_rows(family, {"path": dataset, "batch_size": 4, "threshold": 1e9}, counting)
    assert calls == [4, 2]  # every example once, in batches
    assert [r["metric"] for r in rows] == [
        "quantile_risk_p50",
        "quantile_risk_p10",
        "quantile_risk_p90",
    ]
    first = rows[0]
    assert first["passed"] is True and first["batches"] == 2 and first["value"] > 0
    # lower is better for quantile risk: a threshold below the value fails
    strict = task_rows(family, {"path": dataset, "batch_size": 4, "threshold": 0.0}, served)
    assert strict[0]["passed"] is False
    assert strict[0]["value"] == pytest.approx(first["value"])
    # the limit caps the examples read
    limited = task_rows(family, {"path": dataset, "batch_size": 4, "limit": 3}, served)
    assert limited[0]["batches"] == 1 and limited[0]["passed"] == ""


def test_an_empty_data_set_is_an_error(family, served, dataset):
    with pytest.raises(ValueError, match="yielded no batches"):
        task_rows(family, {"path": dataset, "limit": 0}, served)
