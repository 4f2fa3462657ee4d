"""Temporal Fusion Transformer (Lim et al., 2019) as deployed by DeepLearningExamples.

Over 600 lines on purpose: one model, one module: its network, checkpoint layout and data set.

A compact re-implementation of the architecture that DLE's TFT deploys on Triton: input
embeddings, variable selection networks (VSN) built from gated residual networks (GRN), a static
covariate encoder, LSTM encoder/decoder, interpretable multi-head attention and a quantile head.
Parameter names follow DLE's checkpoint layout (``checkpoint.pt`` = ``{"model": state_dict,
"config": ..., "args": ...}``) as DLE 21.11-23.03 (the seed page's) writes it; DLE 23.04+ keeps
the back half under ``TFTpart2.``, which ``adapt_state_dict`` strips.

The Triton interface is DLE's: eight inputs ``s_cat__0 … id__7`` (absent feature groups are sent
as one zero column) and one output ``target__0`` of shape ``[batch, horizon, quantiles]``.

The task metric is DLE's normalised quantile risk (P10 / P50 / P90 in its README) on un-scaled
forecasts; the test data is read from DLE's processed ``test.bin``/``tgt_scalers.bin`` (plain
pickles, read by ``deploybench.unpickle`` without DLE's code or sklearn, refusing any global
that could run code) or from a documented ``.npz`` layout.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError, DataError, InputNotFound
from ..tensors import TensorSpec
from ..unpickle import load_pickle_file
from .base import Batch, TorchFamily, check_hparams


@dataclass(frozen=True)
class TFTConfig:
    """Hyper-parameters of one TFT variant (DLE's ``configuration.py`` values per data set)."""

    static_categorical_inp_lens: tuple[int, ...]
    temporal_known_continuous_inp_size: int
    temporal_observed_continuous_inp_size: int = 0
    temporal_target_size: int = 1
    static_continuous_inp_size: int = 0
    temporal_known_categorical_inp_lens: tuple[int, ...] = ()
    temporal_observed_categorical_inp_lens: tuple[int, ...] = ()
    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)
    example_length: int = 192
    encoder_length: int = 168
    n_head: int = 4
    hidden_size: int = 128
    dropout: float = 0.1
    attn_dropout: float = 0.0

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> TFTConfig:
        check_hparams(cls, values, "TFT")
        tuples = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        return cls(**tuples)  # type: ignore[arg-type]

    @property
    def num_static_vars(self) -> int:
        return self.static_continuous_inp_size + len(self.static_categorical_inp_lens)

    @property
    def num_future_vars(self) -> int:
        return self.temporal_known_continuous_inp_size + len(
            self.temporal_known_categorical_inp_lens
        )

    @property
    def num_historic_vars(self) -> int:
        return (
            self.num_future_vars
            + self.temporal_observed_continuous_inp_size
            + self.temporal_target_size
            + len(self.temporal_observed_categorical_inp_lens)
        )

    @property
    def horizon(self) -> int:
        return self.example_length - self.encoder_length


class GLU(nn.Module):
    """Gated linear unit: a linear layer to twice the width, halves gated by a sigmoid."""

    def __init__(self, hidden_size: int, output_size: int) -> None:
        super().__init__()
        self.lin = nn.Linear(hidden_size, output_size * 2)

    def forward(self, x: Tensor) -> Tensor:
        return F.glu(self.lin(x))


class MaybeLayerNorm(nn.Module):
    """LayerNorm, or identity for a single output (DLE normalises nothing of width one)."""

    def __init__(self, output_size: int | None, hidden_size: int, eps: float) -> None:
        super().__init__()
        width = output_size or hidden_size
        self.ln: nn.Module = nn.Identity() if output_size == 1 else nn.LayerNorm(width, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.ln(x)


class GRN(nn.Module):
    """Gated residual network with an optional context vector."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        output_size: int | None = None,
        context_hidden_size: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.layer_norm = MaybeLayerNorm(output_size, hidden_size, eps=1e-3)
        self.lin_a = nn.Linear(input_size, hidden_size)
        self.lin_c = (
            nn.Linear(context_hidden_size, hidden_size, bias=False) if context_hidden_size else None
        )
        self.lin_i = nn.Linear(hidden_size, hidden_size)
        self.glu = GLU(hidden_size, output_size or hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(input_size, output_size) if output_size else None

    def forward(self, a: Tensor, c: Tensor | None = None) -> Tensor:
        x = self.lin_a(a)
        if c is not None and self.lin_c is not None:
            x = x + self.lin_c(c).unsqueeze(1)
        x = self.glu(self.dropout(self.lin_i(F.elu(x))))
        skip = a if self.out_proj is None else self.out_proj(a)
        return self.layer_norm(x + skip)


class TFTEmbedding(nn.Module):
    """Embeds every input variable into ``hidden_size``: lookups for categoricals, a learned
    vector scaled by the value (plus bias) for continuous inputs."""

    def __init__(self, cfg: TFTConfig) -> None:
        super().__init__()
        h = cfg.hidden_size

        def lookups(lens: tuple[int, ...]) -> nn.ModuleList | None:
            return nn.ModuleList(nn.Embedding(n, h) for n in lens) if lens else None

        def vectors(size: int) -> tuple[nn.Parameter | None, nn.Parameter | None]:
            if not size:
                return None, None
            weight = nn.Parameter(torch.empty(size, h))
            nn.init.xavier_normal_(weight)
            return weight, nn.Parameter(torch.zeros(size, h))

        self.s_cat_embed = lookups(cfg.static_categorical_inp_lens)
        self.t_cat_k_embed = lookups(cfg.temporal_known_categorical_inp_lens)
        self.t_cat_o_embed = lookups(cfg.temporal_observed_categorical_inp_lens)
        self.s_cont_embedding_vectors, self.s_cont_embedding_bias = vectors(
            cfg.static_continuous_inp_size
        )
        self.t_cont_k_embedding_vectors, self.t_cont_k_embedding_bias = vectors(
            cfg.temporal_known_continuous_inp_size
        )
        self.t_cont_o_embedding_vectors, self.t_cont_o_embedding_bias = vectors(
            cfg.temporal_observed_continuous_inp_size
        )
        self.t_tgt_embedding_vectors, self.t_tgt_embedding_bias = vectors(cfg.temporal_target_size)

    @staticmethod
    def _embed(
        cat: Tensor | None,
        cont: Tensor | None,
        lookups: nn.ModuleList | None,
        weight: Tensor | None,
        bias: Tensor | None,
    ) -> Tensor | None:
        parts = []
        if cat is not None and lookups is not None:
            parts.append(torch.stack([emb(cat[..., i]) for i, emb in enumerate(lookups)], dim=-2))
        if cont is not None and weight is not None and bias is not None:
            parts.append(cont.unsqueeze(-1) * weight + bias)
        return torch.cat(parts, dim=-2) if parts else None

    def forward(
        self, inputs: dict[str, Tensor | None]
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        s_cat, s_cont = inputs["s_cat"], inputs["s_cont"]
        # Static inputs repeat along time; DLE reads the first step.
        static = self._embed(
            s_cat[:, 0, :] if s_cat is not None else None,
            s_cont[:, 0, :] if s_cont is not None else None,
            self.s_cat_embed,
            self.s_cont_embedding_vectors,
            self.s_cont_embedding_bias,
        )
        known = self._embed(
            inputs["k_cat"],
            inputs["k_cont"],
            self.t_cat_k_embed,
            self.t_cont_k_embedding_vectors,
            self.t_cont_k_embedding_bias,
        )
        observed = self._embed(
            inputs["o_cat"],
            inputs["o_cont"],
            self.t_cat_o_embed,
            self.t_cont_o_embedding_vectors,
            self.t_cont_o_embedding_bias,
        )
        target = self._embed(
            None, inputs["target"], None, self.t_tgt_embedding_vectors, self.t_tgt_embedding_bias
        )
        if static is None or known is None or target is None:
            raise ValueError("TFT needs static, known and target inputs")
        return static, known, observed, target


class VariableSelectionNetwork(nn.Module):
    """Softmax weights over the variables (from a joint GRN) mix per-variable GRN outputs."""

    def __init__(self, cfg: TFTConfig, num_inputs: int) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.joint_grn = GRN(h * num_inputs, h, output_size=num_inputs, context_hidden_size=h)
        self.var_grns = nn.ModuleList(GRN(h, h, dropout=cfg.dropout) for _ in range(num_inputs))

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        weights = F.softmax(self.joint_grn(x.flatten(-2), c=context), dim=-1)
        transformed = torch.stack([grn(x[..., i, :]) for i, grn in enumerate(self.var_grns)], -1)
        return torch.matmul(transformed, weights.unsqueeze(-1)).squeeze(-1)


class StaticCovariateEncoder(nn.Module):
    """Four context vectors from the static variables: selection, enrichment, LSTM h and c."""

    def __init__(self, cfg: TFTConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.vsn = VariableSelectionNetwork(cfg, cfg.num_static_vars)
        self.context_grns = nn.ModuleList(GRN(h, h, dropout=cfg.dropout) for _ in range(4))

    def forward(self, x: Tensor) -> list[Tensor]:
        selected = self.vsn(x)
        return [grn(selected) for grn in self.context_grns]


class InterpretableMultiHeadAttention(nn.Module):
    """Multi-head attention whose heads share one value projection and are averaged, so the
    attention weights stay interpretable; causal mask over the example."""

    def __init__(self, cfg: TFTConfig) -> None:
        super().__init__()
        if cfg.hidden_size % cfg.n_head:
            raise ConfigError(
                f"hidden_size {cfg.hidden_size} is not divisible by n_head {cfg.n_head}"
            )
        self.n_head = cfg.n_head
        self.d_head = cfg.hidden_size // cfg.n_head
        self.qkv_linears = nn.Linear(
            cfg.hidden_size, (2 * self.n_head + 1) * self.d_head, bias=False
        )
        self.out_proj = nn.Linear(self.d_head, cfg.hidden_size, bias=False)
        self.attn_dropout = nn.Dropout(cfg.attn_dropout)
        self.out_dropout = nn.Dropout(cfg.dropout)
        self.scale = self.d_head**-0.5
        mask = torch.triu(torch.full((cfg.example_length, cfg.example_length), float("-inf")), 1)
        self.register_buffer("_mask", mask.unsqueeze(0))

    def forward(self, x: Tensor) -> Tensor:
        bs, t, _ = x.shape
        width = self.n_head * self.d_head
        q, k, v = self.qkv_linears(x).split((width, width, self.d_head), dim=-1)
        q = q.view(bs, t, self.n_head, self.d_head).permute(0, 2, 1, 3)
        k = k.view(bs, t, self.n_head, self.d_head).permute(0, 2, 3, 1)
        scores = torch.matmul(q, k) * self.scale + self._mask
        probs = self.attn_dropout(F.softmax(scores, dim=3))
        heads = torch.matmul(probs, v.view(bs, t, 1, self.d_head).transpose(1, 2))
        return self.out_dropout(self.out_proj(heads.mean(dim=1)))


class TemporalFusionTransformer(nn.Module):
    """The TFT forecaster: quantile forecasts for the ``horizon`` steps after the encoder."""

    def __init__(self, cfg: TFTConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.encoder_length = cfg.encoder_length
        self.embedding = TFTEmbedding(cfg)
        self.static_encoder = StaticCovariateEncoder(cfg)
        self.history_vsn = VariableSelectionNetwork(cfg, cfg.num_historic_vars)
        self.history_encoder = nn.LSTM(h, h, batch_first=True)
        self.future_vsn = VariableSelectionNetwork(cfg, cfg.num_future_vars)
        self.future_encoder = nn.LSTM(h, h, batch_first=True)
        self.input_gate = GLU(h, h)
        self.input_gate_ln = nn.LayerNorm(h, eps=1e-3)
        self.enrichment_grn = GRN(h, h, context_hidden_size=h, dropout=cfg.dropout)
        self.attention = InterpretableMultiHeadAttention(cfg)
        self.attention_gate = GLU(h, h)
        self.attention_ln = nn.LayerNorm(h, eps=1e-3)
        self.positionwise_grn = GRN(h, h, dropout=cfg.dropout)
        self.decoder_gate = GLU(h, h)
        self.decoder_ln = nn.LayerNorm(h, eps=1e-3)
        self.quantile_proj = nn.Linear(h, len(cfg.quantiles))

    def forward(self, inputs: dict[str, Tensor | None]) -> Tensor:
        static, known, observed, target = self.embedding(inputs)
        c_select, c_enrich, c_h, c_c = self.static_encoder(static)
        enc = self.encoder_length

        past = [known[:, :enc], target[:, :enc]]
        if observed is not None:
            past.insert(0, observed[:, :enc])
        history_features = self.history_vsn(torch.cat(past, dim=-2), c_select)
        future_features = self.future_vsn(known[:, enc:], c_select)
        history, state = self.history_encoder(
            history_features, (c_h.unsqueeze(0), c_c.unsqueeze(0))
        )
        future, _ = self.future_encoder(future_features, state)

        # Gated skip connection around the LSTMs.
        embedded = torch.cat([history_features, future_features], dim=1)
        temporal = self.input_gate_ln(
            self.input_gate(torch.cat([history, future], dim=1)) + embedded
        )
        enriched = self.enrichment_grn(temporal, c=c_enrich)
        attended = self.attention(enriched)

        # Only the forecast horizon is decoded.
        attended, temporal, enriched = attended[:, enc:], temporal[:, enc:], enriched[:, enc:]
        x = self.attention_ln(self.attention_gate(attended) + enriched)
        x = self.positionwise_grn(x)
        x = self.decoder_ln(self.decoder_gate(x) + temporal)
        return self.quantile_proj(x)


INPUT_GROUPS = ("s_cat", "s_cont", "k_cat", "k_cont", "o_cat", "o_cont", "target", "id")


class TFTServing(nn.Module):
    """DLE's Triton signature: eight positional tensors, absent groups as one zero column."""

    def __init__(self, model: TemporalFusionTransformer, cfg: TFTConfig) -> None:
        super().__init__()
        self.model = model
        self.present = {
            "s_cat": bool(cfg.static_categorical_inp_lens),
            "s_cont": bool(cfg.static_continuous_inp_size),
            "k_cat": bool(cfg.temporal_known_categorical_inp_lens),
            "k_cont": bool(cfg.temporal_known_continuous_inp_size),
            "o_cat": bool(cfg.temporal_observed_categorical_inp_lens),
            "o_cont": bool(cfg.temporal_observed_continuous_inp_size),
            "target": True,
            "id": False,  # the id only routes examples in DLE's data pipeline
        }

    def forward(
        self,
        s_cat: Tensor,
        s_cont: Tensor,
        k_cat: Tensor,
        k_cont: Tensor,
        o_cat: Tensor,
        o_cont: Tensor,
        target: Tensor,
        id: Tensor,  # DLE's input name, shadowing the builtin on purpose
    ) -> Tensor:
        tensors = (s_cat, s_cont, k_cat, k_cont, o_cat, o_cont, target, id)
        inputs = {
            name: (t if self.present[name] else None) for name, t in zip(INPUT_GROUPS, tensors)
        }
        return self.model(inputs)


@dataclass
class TFTSpec:
    """Everything the workflow needs to know about one TFT variant."""

    cfg: TFTConfig
    inputs: list[TensorSpec] = field(init=False)
    outputs: list[TensorSpec] = field(init=False)

    def __post_init__(self) -> None:
        c, t = self.cfg, self.cfg.example_length

        def width(present: int, n: int) -> tuple[int, ...]:
            return (t, n) if present else (1,)

        groups = {
            "s_cat": (
                "int64",
                width(len(c.static_categorical_inp_lens), len(c.static_categorical_inp_lens)),
            ),
            "s_cont": (
                "float32",
                width(c.static_continuous_inp_size, c.static_continuous_inp_size),
            ),
            "k_cat": (
                "int64",
                width(
                    len(c.temporal_known_categorical_inp_lens),
                    len(c.temporal_known_categorical_inp_lens),
                ),
            ),
            "k_cont": (
                "float32",
                width(c.temporal_known_continuous_inp_size, c.temporal_known_continuous_inp_size),
            ),
            "o_cat": (
                "int64",
                width(
                    len(c.temporal_observed_categorical_inp_lens),
                    len(c.temporal_observed_categorical_inp_lens),
                ),
            ),
            "o_cont": (
                "float32",
                width(
                    c.temporal_observed_continuous_inp_size, c.temporal_observed_continuous_inp_size
                ),
            ),
            "target": ("float32", (t, c.temporal_target_size)),
            "id": ("int64", (t, 1)),
        }
        self.inputs = [
            TensorSpec(f"{name}__{i}", dtype, shape)
            for i, (name, (dtype, shape)) in enumerate(groups.items())
        ]
        self.outputs = [TensorSpec("target__0", "float32", (c.horizon, len(c.quantiles)))]


# DLE 23.04+ (modeling.py since "Move to nvFuser") holds everything after the static covariate
# encoder as ``self.TFTpart2 = TFTBack(config)`` (scripted or not): 120 of TFT's 174 names carry
# this prefix; the parameters are the same.
DLE_BACK_PREFIX = "TFTpart2."


class TFTFamily(TorchFamily):
    """The workflow's view of TFT: build, checkpoint, serving module, example inputs."""

    name = "TFT"
    # The attention's causal mask: -inf above the diagonal (a buffer DLE's checkpoints carry).
    infinite_by_design = ("*attention._mask",)
    metric_name = "quantile_risk_p50"
    higher_is_better = False

    def __init__(self, hparams: dict[str, Any]) -> None:
        self.cfg = TFTConfig.from_mapping(hparams)
        self.spec = TFTSpec(self.cfg)
        self.inputs = self.spec.inputs
        self.outputs = self.spec.outputs

    def build(self) -> nn.Module:
        return TemporalFusionTransformer(self.cfg)

    def wrap(self, model: nn.Module) -> nn.Module:
        assert isinstance(model, TemporalFusionTransformer)  # what build() made
        return TFTServing(model, self.cfg)

    def adapt_state_dict(self, state: dict[str, Any]) -> dict[str, Any]:
        """DLE's names in either layout (flat, or 23.04+'s ``TFTpart2.``) → this module's."""
        return {k.removeprefix(DLE_BACK_PREFIX): v for k, v in state.items()}

    def init_state(self, seed: int) -> dict[str, Any]:
        """A seeded-random initialisation in DLE's checkpoint layout."""
        state = super().init_state(seed)
        return {**state, "config": _plain_config(self.cfg)}

    def example_inputs(self, batch: int, seed: int) -> dict[str, np.ndarray]:
        """Deterministic synthetic inputs in the value ranges of DLE's pre-processed data:
        valid category ids, standardised continuous covariates and targets."""
        rng = np.random.default_rng(seed)
        out: dict[str, np.ndarray] = {}
        cat_lens = {
            "s_cat": self.cfg.static_categorical_inp_lens,
            "k_cat": self.cfg.temporal_known_categorical_inp_lens,
            "o_cat": self.cfg.temporal_observed_categorical_inp_lens,
        }
        for spec in self.inputs:
            group = spec.name.rsplit("__", 1)[0]
            shape = (batch, *spec.shape)
            if cat_lens.get(group):
                highs = np.array(cat_lens[group])
                per_series = rng.integers(0, highs, size=(batch, 1, len(highs)))
                # Static categoricals repeat along time, as DLE's data loader gives them.
                values = (
                    np.broadcast_to(per_series, shape)
                    if group == "s_cat"
                    else rng.integers(0, highs, size=shape)
                )
                out[spec.name] = np.ascontiguousarray(values, dtype=spec.dtype)
            elif group == "id":
                out[spec.name] = np.repeat(
                    rng.integers(0, 1000, size=(batch, 1, 1)), spec.shape[0], axis=1
                ).astype(spec.dtype)
            elif spec.shape == (1,):
                out[spec.name] = np.zeros(shape, dtype=spec.dtype)
            else:
                out[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        return out

    def perf_inputs(self, seed: int, dataset: str | Path | None = None) -> dict[str, np.ndarray]:
        """With a data set, its test split's first example, as DLE's perf data
        (``triton/prepare_input_data.py``: its loader's first batch of the test split, batch
        size 1); without one, the seeded example."""
        if not dataset:
            return super().perf_inputs(seed)
        for feeds, _ in self.dataset_batches(dataset, 1, 1):
            return feeds
        raise DataError(f"{dataset}: the test split has no example to make the perf input of")

    def perf_input_source(self, seed: int, dataset: str | Path | None = None) -> str:
        if not dataset:
            return super().perf_input_source(seed)
        return f"the test split's first example of {dataset} (DLE's perf input)"

    def dataset_batches(
        self, path: str | Path, batch_size: int, limit: int | None
    ) -> Iterator[Batch]:
        """Batches of the test split at ``path``, at most ``limit`` examples (None: all).

        ``path`` is DLE's processed data-set directory (``<dataset>_bin`` holding ``test.bin`` and
        ``tgt_scalers.bin``) or a ``.npz`` file (or a directory holding ``test.npz``) in the
        layout of :func:`read_npz_examples`. Feeds follow the Triton signature; labels are
        ``{"target": unscaled future target [n, horizon], "target_scale": [n, 2] (mean, std)}``,
        the scale being what un-scales this batch's predictions.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        source = open_test_examples(Path(path), self.cfg)
        count = source.count if limit is None else min(limit, source.count)
        for start in range(0, count, batch_size):
            groups, scale = source.take(start, min(start + batch_size, count))
            yield self._feeds(groups), self._labels(groups["target"], scale)

    def task_metric(
        self, outputs: list[dict[str, np.ndarray]], labels: list[Any]
    ) -> dict[str, float]:
        """DLE's normalised quantile risk of the un-scaled forecasts, P50 first."""
        if 0.5 not in self.cfg.quantiles:
            raise ValueError(f"{self.metric_name} needs the 0.5 quantile; got {self.cfg.quantiles}")
        if not outputs or len(outputs) != len(labels):
            raise ValueError(f"need one label per output batch; got {len(outputs)}, {len(labels)}")
        scaled = np.concatenate([o[self.outputs[0].name] for o in outputs]).astype(np.float64)
        scale = np.concatenate([lab["target_scale"] for lab in labels]).astype(np.float64)
        target = np.concatenate([lab["target"] for lab in labels])
        # Predictions are in the model's standardised units: un-scale per example, as DLE does
        # per series (electricity) or with the one global scaler (traffic).
        pred = scaled * scale[:, 1, None, None] + scale[:, 0, None, None]
        risks = quantile_risk(pred, target, self.cfg.quantiles)
        ordered = ["p50", *(k for k in risks if k != "p50")]
        return {f"quantile_risk_{k}": risks[k] for k in ordered}

    def _feeds(self, groups: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The eight Triton inputs; groups the model does not use go as one zero column."""
        n = len(groups["target"])
        feeds = {}
        for spec in self.inputs:
            group = spec.name.rsplit("__", 1)[0]
            if spec.shape == (1,) and group not in ("target", "id"):
                feeds[spec.name] = np.zeros((n, 1), dtype=spec.dtype)
                continue
            if group not in groups:
                raise DataError(f"the data set has no {group!r} inputs, which the model needs")
            values = np.ascontiguousarray(groups[group], dtype=spec.dtype)
            if values.shape != (n, *spec.shape):
                raise DataError(
                    f"data-set group {group!r} has shape {values.shape[1:]} per example; "
                    f"the configured model expects {spec.shape}"
                )
            feeds[spec.name] = values
        return feeds

    def _labels(self, target: np.ndarray, scale: np.ndarray) -> dict[str, np.ndarray]:
        """The un-scaled future target of the first target channel (DLE scores only that)."""
        future = target[:, self.cfg.encoder_length :, 0].astype(np.float64)
        scale = np.asarray(scale, dtype=np.float64)
        return {"target": future * scale[:, 1:2] + scale[:, 0:1], "target_scale": scale}


def _plain_config(cfg: TFTConfig) -> dict[str, Any]:
    """The hyper-parameters as plain types: the checkpoint reader refuses classes of installed
    code, this package's included."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.__dict__.items()}


# --- Task metric ---------------------------------------------------------------------------------


def quantile_risk(
    pred: np.ndarray, target: np.ndarray, quantiles: tuple[float, ...] | list[float]
) -> dict[str, float]:
    """Normalised quantile risk per quantile, keyed ``p10``, ``p50``, …; lower is better.

    ``pred`` is ``[N, H, Q]``, ``target`` ``[N, H]``, both un-scaled. As DLE's ``qrisk``:
    ``2 * Σ max(q·(y-ŷ), (q-1)·(y-ŷ)) / Σ |y|`` over every example and horizon step.
    """
    pred = np.asarray(pred, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    q = np.asarray(quantiles, dtype=np.float64)
    if pred.shape != (*target.shape, len(q)):
        raise ValueError(
            f"predictions {pred.shape} do not match targets {target.shape} with {len(q)} quantiles"
        )
    normalizer = np.abs(target).sum()
    if not normalizer > 0:
        raise ValueError("quantile risk is undefined when every target is zero")
    error = target[..., None] - pred
    loss = np.maximum(q * error, (q - 1) * error).reshape(-1, len(q)).sum(axis=0)
    return {f"p{round(qi * 100)}": float(2 * li / normalizer) for qi, li in zip(q, loss)}


# --- Test data ----------------------------------------------------------------------------------

DLE_TEST_FILE = "test.bin"
DLE_SCALERS_FILE = "tgt_scalers.bin"
DLE_DATA_FILE = "DLE data file"  # how messages name test.bin / tgt_scalers.bin
NPZ_TEST_FILE = "test.npz"


class ExampleSource(Protocol):
    """Examples of a test split by index: input groups ``[n, T, width]`` and the target's
    ``[n, 2]`` (mean, std) that un-scales them."""

    @property
    def count(self) -> int: ...

    def take(self, start: int, stop: int) -> tuple[dict[str, np.ndarray], np.ndarray]: ...


def open_test_examples(path: Path, cfg: TFTConfig) -> ExampleSource:
    """The test split at ``path``: DLE's ``test.bin`` directory or the ``.npz`` layout."""
    if path.is_dir() and (path / DLE_TEST_FILE).exists():
        return read_dle_test_split(path, cfg)
    npz = path / NPZ_TEST_FILE if path.is_dir() else path
    if npz.suffix == ".npz" and npz.is_file():
        return read_npz_examples(npz)
    raise InputNotFound(
        f"no TFT test data at {path}: expected DLE's processed directory with "
        f"{DLE_TEST_FILE} and {DLE_SCALERS_FILE}, or a {NPZ_TEST_FILE} file"
    )


@dataclass(frozen=True)
class StoredExamples:
    """Examples already cut to ``example_length`` (the ``.npz`` layout)."""

    groups: dict[str, np.ndarray]
    scale: np.ndarray

    @property
    def count(self) -> int:
        return len(self.scale)

    def take(self, start: int, stop: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        return {k: v[start:stop] for k, v in self.groups.items()}, self.scale[start:stop]


def read_npz_examples(path: Path) -> StoredExamples:
    """A ``.npz`` test split: the layout a converter writes for data DLE's ``test.bin`` reader
    cannot place (other feature sets, or only DLE's ``test.csv`` at hand).

    Arrays: ``target`` and ``id`` plus the groups the model uses among ``s_cat s_cont k_cat
    k_cont o_cat o_cont``, each ``[N, example_length, width]`` in the model's input units
    (categoricals encoded, continuous values and target standardised), and ``target_scale``
    ``[N, 2]``: the target's (mean, std) per example. Absent groups may be left out.
    """
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    if "target_scale" not in arrays or "target" not in arrays:
        raise DataError(f"{path} lacks 'target' or 'target_scale'; holds {sorted(arrays)}")
    scale = arrays.pop("target_scale")
    unknown = sorted(set(arrays) - set(INPUT_GROUPS))
    if unknown:
        raise DataError(f"{path} holds unknown arrays {unknown}; valid: {list(INPUT_GROUPS)}")
    wrong = {k: v.shape for k, v in arrays.items() if v.ndim != 3 or len(v) != len(scale)}
    if scale.shape != (len(scale), 2) or wrong:
        raise DataError(
            f"{path}: target_scale must be [N, 2] and every group [N, T, width]; "
            f"got target_scale {scale.shape}, mismatched {wrong}"
        )
    return StoredExamples({k: v for k, v in arrays.items() if v.shape[-1]}, scale)


@dataclass(frozen=True)
class SeriesWindows:
    """Every ``example_length`` window (stride 1, DLE's ``dataset_stride``) of each series, in
    DLE's order: series by id, then window start."""

    series: list[dict[str, np.ndarray]]  # per series: group → [rows, width]
    scales: np.ndarray  # per series: (mean, std)
    example_length: int

    @cached_property
    def starts(self) -> tuple[np.ndarray, np.ndarray]:
        """(series index, first row) of every example."""
        counts = [len(s["target"]) - self.example_length + 1 for s in self.series]
        index = np.repeat(np.arange(len(counts)), counts)
        first = np.concatenate([np.arange(c) for c in counts]) if counts else np.zeros(0, int)
        return index, first

    @property
    def count(self) -> int:
        return len(self.starts[0])

    def take(self, start: int, stop: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        index, first = (a[start:stop] for a in self.starts)
        t = self.example_length
        groups = {
            name: np.stack([self.series[i][name][r : r + t] for i, r in zip(index, first)])
            for name in self.series[0]
        }
        return groups, self.scales[index]


def dle_bin_columns(cfg: TFTConfig) -> dict[str, list[int]]:
    """Column positions of the input groups in DLE's ``test.bin`` arrays.

    DLE writes the id, then every feature of ``configuration.py`` in its order; for electricity
    and traffic that is time, target, the known continuous inputs, the static categorical. Other
    feature sets need the ``.npz`` layout, since the order is not in the hyper-parameters.
    """
    others = (
        cfg.static_continuous_inp_size
        or cfg.temporal_known_categorical_inp_lens
        or cfg.temporal_observed_categorical_inp_lens
        or cfg.temporal_observed_continuous_inp_size
    )
    if others:
        raise DataError(
            "DLE's test.bin column order is known only for the electricity/traffic features "
            "(id, time, target, known continuous, static categorical); convert to the .npz layout"
        )
    widths = {
        "id": 1,
        "time": 1,
        "target": cfg.temporal_target_size,
        "k_cont": cfg.temporal_known_continuous_inp_size,
        "s_cat": len(cfg.static_categorical_inp_lens),
    }
    bounds = np.cumsum([0, *widths.values()])
    return {name: list(range(bounds[i], bounds[i + 1])) for i, name in enumerate(widths)}


def read_dle_test_split(folder: Path, cfg: TFTConfig) -> SeriesWindows:
    """DLE's ``test.bin`` (a pickled list of per-series ``[rows, columns]`` arrays, float32 bits
    stored as int32) and ``tgt_scalers.bin`` (sklearn StandardScalers: per series id for
    electricity, one under ``''`` for traffic)."""
    grouped = load_pickle_file(folder / DLE_TEST_FILE, DLE_DATA_FILE)
    scalers_path = folder / DLE_SCALERS_FILE
    if not scalers_path.exists():
        raise InputNotFound(f"{scalers_path} is missing; it un-scales the targets")
    scalers = load_pickle_file(scalers_path, DLE_DATA_FILE)
    columns = dle_bin_columns(cfg)
    width = sum(len(c) for c in columns.values())
    series, scales = [], []
    for rows in grouped:
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != width or rows.dtype.itemsize != 4:
            raise DataError(
                f"{folder / DLE_TEST_FILE}: series of shape {rows.shape} ({rows.dtype}); "
                f"these hyper-parameters need {width} 4-byte columns"
            )
        if len(rows) < cfg.example_length:
            continue  # DLE drops series shorter than one example
        values = rows.view(np.float32)
        groups = {name: values[:, cols] for name, cols in columns.items() if name != "time"}
        series.append(groups)
        scales.append(_target_scale(scalers, int(groups["id"][0, 0])))
    return SeriesWindows(
        series, np.array(scales, dtype=np.float64).reshape(-1, 2), cfg.example_length
    )


def _target_scale(scalers: Any, series_id: int) -> tuple[float, float]:
    # Traffic has one scaler for all series (key ''), electricity one per series id.
    scaler = scalers.get("", scalers.get(series_id)) if isinstance(scalers, dict) else None
    mean_std = getattr(scaler, "mean_std", None)
    if mean_std is None:
        raise DataError(f"tgt_scalers.bin has no StandardScaler for series {series_id}")
    return mean_std()
