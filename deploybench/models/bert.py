"""BERT-large for SQuAD v1.1 question answering, as deployed by DeepLearningExamples.

The network is Hugging Face ``transformers``' ``BertForQuestionAnswering``, built from DLE's
``bert_configs/large.json`` values (24 layers, hidden 1024, 16 heads, FFN 4096, vocabulary padded
to a multiple of 8 as DLE's ``triton/model.py`` does). It is the same architecture as DLE's own
``modeling.py``; checkpoints in DLE's names load through ``adapt_state_dict``. The one
difference between DLE releases is the FFN's GELU (hyper-parameter ``gelu``, see ``GELU``).

The Triton interface is DLE's: ``input__0`` token ids, ``input__1`` segment ids, ``input__2``
attention mask (int32, ``[batch, 384]``, cast to int64 inside the model as DLE's
``BertForQuestionAnswering_int32_inputs`` does), and ``output__0``/``output__1`` start/end logits
(float32, ``[batch, 384]``).

The task metric is SQuAD v1.1 F1 / exact match: features are built the way DLE's ``run_squad.py``
builds them (query ≤ 64 tokens, 384-token windows with stride 128, "max context" per token) and
the best span (≤ 30 tokens, from the 20 best starts and ends) is mapped back to the context text
through the tokenizer's character offsets, then scored as the official v1.1 evaluation script does.
"""

from __future__ import annotations

import collections
import contextlib
import json
import re
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..errors import ConfigError, DataError, InputNotFound
from ..tensors import TensorSpec
from .base import Batch, Quantities, TorchFamily, argmax_flip_fraction, check_hparams, check_weights

# BERT-uncased special-token ids (vocab.txt positions of [PAD], [CLS], [SEP]); example inputs use
# them so that synthetic rows look like real ones.
PAD_ID, CLS_ID, SEP_ID = 0, 101, 102
# First id of a real word piece in the uncased vocabulary (1–998 are [unusedN] slots).
FIRST_WORD_ID = 999

SQUAD_FILE = "dev-v1.1.json"
VOCAB_FILE = "vocab.txt"
# Where DLE's ``prepare_datasets.sh`` puts them under its datasets directory.
DLE_SQUAD_FILE = Path("data/squad/v1.1") / SQUAD_FILE
DLE_VOCAB_FILE = Path("data/google_pretrained_weights/uncased_L-24_H-1024_A-16") / VOCAB_FILE


def _gelu_erf(x: Tensor) -> Tensor:
    # DLE's formula as written, its rounded sqrt(2) included, so the activation is bit-exact.
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


def _gelu_tanh(x: Tensor) -> Tensor:
    # DLE's F.gelu(x, approximate=True): NGC PyTorch's flag (pytorch#61439), "tanh" upstream.
    return F.gelu(x, approximate="tanh")


# The GELU of the FFN in DLE's BERT ``modeling.py``, by release (hyper-parameter ``gelu``):
# "erf" from bae6e931 (2019-08) to 482fe9ac (2020-09, last before the change); "tanh" from
# a9e2c1d5 (2022-03, "update LDDL + NVFuser"), which added the seed page's triton/large
# deployment (NGC PyTorch 21.10), to HEAD.
GELU: dict[str, Callable[[Tensor], Tensor]] = {"erf": _gelu_erf, "tanh": _gelu_tanh}


@dataclass(frozen=True)
class BertQAConfig:
    """Network hyper-parameters (DLE's large.json) and the SQuAD feature/decoding settings
    (DLE's run_squad.py defaults used by its Triton data loader)."""

    vocab_size: int = 30528
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best_size: int = 20
    do_lower_case: bool = True
    gelu: str = "tanh"

    def __post_init__(self) -> None:
        if self.gelu not in GELU:
            raise ConfigError(f"gelu {self.gelu!r} is not a DLE BERT GELU; valid: {sorted(GELU)}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.max_seq_length > self.max_position_embeddings:
            raise ConfigError(
                f"max_seq_length {self.max_seq_length} exceeds "
                f"max_position_embeddings {self.max_position_embeddings}"
            )
        if self.vocab_size <= SEP_ID:
            raise ConfigError(f"vocab_size {self.vocab_size} must hold BERT's special tokens")
        # [CLS] question [SEP] at least one context token [SEP]
        if self.max_seq_length < self.max_query_length + 4:
            raise ConfigError(
                f"max_seq_length {self.max_seq_length} leaves no room for context after a "
                f"{self.max_query_length}-token question"
            )

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> BertQAConfig:
        check_hparams(cls, values, "BERT")
        return cls(**values)

    @property
    def padded_vocab_size(self) -> int:
        """DLE pads the vocabulary to a multiple of 8 (tensor-core friendly embedding)."""
        return -(-self.vocab_size // 8) * 8


# --------------------------------------------------------------------------------------------
# Network


def _hf_config(cfg: BertQAConfig) -> Any:
    from transformers import BertConfig

    config = BertConfig(
        vocab_size=cfg.padded_vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        type_vocab_size=cfg.type_vocab_size,
        layer_norm_eps=cfg.layer_norm_eps,
        initializer_range=cfg.initializer_range,
        hidden_act="gelu",  # replaced by DLE's own GELU in build_network
    )
    config.torchscript = True  # tuple outputs, as tracing needs
    return config


def build_network(cfg: BertQAConfig, *, initialise: bool = True) -> nn.Module:
    """``BertForQuestionAnswering`` with eager attention (traceable and ONNX-exportable at
    opset 13). ``initialise=False`` leaves the weights as untouched allocations, for a network
    whose weights are about to be replaced by a checkpoint."""
    from transformers import BertForQuestionAnswering
    from transformers.initialization import no_init_weights

    with contextlib.nullcontext() if initialise else no_init_weights():
        model = BertForQuestionAnswering._from_config(_hf_config(cfg), attn_implementation="eager")
    # The span loss is never computed here; naming it keeps tracing's walk over every
    # (sub)model's attributes from logging "loss_type=None … unrecognized".
    for module in model.modules():
        if hasattr(module, "loss_type"):
            module.loss_type = "ForQuestionAnswering"
    for layer in model.bert.encoder.layer:
        layer.intermediate.intermediate_act_fn = DLEGelu(cfg.gelu)
    return model


class DLEGelu(nn.Module):
    """The FFN activation of DLE's ``modeling.py`` of a release (``GELU``)."""

    def __init__(self, variant: str) -> None:
        super().__init__()
        self.variant = variant
        self.fn = GELU[variant]

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return self.variant


class BertQAServing(nn.Module):
    """DLE's Triton signature: three int32 ``[batch, seq]`` tensors in, start and end logits
    out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: Tensor, segment_ids: Tensor, attention_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        # DLE's extended mask (modeling.py, BertModel.forward: in the weights' dtype, masked keys
        # -10000), built here: given a 2-D mask, transformers moves it ``.to(device=...)``,
        # which a trace records as a constant device (a trace made on a CPU fails on a GPU).
        # Made with where() on the weights' own zero and -10000, not a Cast to their dtype:
        # onnxconverter-common's fp16 pass leaves such a Cast at float32 while typing its output
        # float16, and onnxruntime then refuses the file.
        weights: Tensor = self.model.get_parameter("bert.embeddings.word_embeddings.weight")
        masked = weights.new_full((), -10000.0)
        keep = attention_mask.unsqueeze(1).unsqueeze(2) > 0
        start, end = self.model(
            input_ids=input_ids.long(),
            attention_mask=torch.where(keep, masked * 0, masked),
            token_type_ids=segment_ids.long(),
            return_dict=False,
        )
        return start, end


def dle_to_hf_names(state: dict[str, Any]) -> dict[str, Any]:
    """A DLE ``modeling.py`` state dict in ``transformers`` names.

    DLE fuses bias and activation in ``LinearActivation`` modules named ``dense_act`` (HF:
    ``dense``); its QA model carries a pooler that the QA head never reads (HF's QA model has
    none), so it is dropped. TF-style ``gamma``/``beta`` (which DLE's own loader also accepts)
    are normalised too; DDP's ``module.`` prefix is the checkpoint reader's.
    """
    out: dict[str, Any] = {}
    for name, value in state.items():
        if name.startswith("bert.pooler."):
            continue
        name = name.replace(".dense_act.", ".dense.")
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
        name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
        out[name] = value
    return out


# --------------------------------------------------------------------------------------------
# SQuAD v1.1: examples, features, span decoding, official metric


@dataclass(frozen=True)
class SquadExample:
    qas_id: str
    question: str
    context: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class SquadFeature:
    """The label of one window: what turns its start/end logits back into answer text."""

    example: SquadExample
    context_start: int  # sequence position of the window's first context token
    spans: np.ndarray  # int32 [tokens, 2]: character span in the context of each window token
    max_context: np.ndarray  # bool [tokens]: this window gives the token its widest context


def read_squad(path: Path, limit: int | None = None) -> list[SquadExample]:
    """Questions of a SQuAD v1.1 json in file order (the first ``limit`` ones)."""
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    examples: list[SquadExample] = []
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                if limit is not None and len(examples) >= limit:
                    return examples
                answers = tuple(a["text"] for a in qa.get("answers", []))
                examples.append(
                    SquadExample(qa["id"], qa["question"], paragraph["context"], answers)
                )
    return examples


def sliding_windows(num_tokens: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of DLE's sliding windows over a context of ``num_tokens`` tokens: each
    window holds up to ``max_tokens``; the next one starts ``stride`` tokens later."""
    windows = []
    start = 0
    while True:
        length = min(num_tokens - start, max_tokens)
        windows.append((start, length))
        if start + length >= num_tokens:
            return windows
        start += min(length, stride)


def max_context_flags(windows: list[tuple[int, int]], num_tokens: int) -> list[np.ndarray]:
    """Per window, whether it is the one giving each of its tokens the most context: the
    largest min(left, right) context, +0.01·length to break ties, first window on equality."""
    best_score = np.full(num_tokens, -np.inf)
    best_window = np.zeros(num_tokens, dtype=np.int64)
    for index, (start, length) in enumerate(windows):
        positions = np.arange(start, start + length)
        score = np.minimum(positions - start, start + length - 1 - positions) + 0.01 * length
        better = score > best_score[positions]
        best_score[positions[better]] = score[better]
        best_window[positions[better]] = index
    return [best_window[start : start + length] == i for i, (start, length) in enumerate(windows)]


def read_vocab(path: Path) -> dict[str, int]:
    """A BERT ``vocab.txt``: one word piece per line, its id the line number."""
    # split on newlines only: word pieces may be characters ``splitlines`` breaks on (U+0085)
    tokens = [t.rstrip("\r") for t in path.read_text(encoding="utf-8").rstrip("\n").split("\n")]
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise DataError(f"{path}: repeated word pieces; not a BERT vocabulary")
    return vocab


class SquadFeaturizer:
    """Question/context pairs → fixed-length BERT input rows, as DLE's run_squad.py makes them."""

    def __init__(self, vocab_file: Path, cfg: BertQAConfig) -> None:
        from transformers import BertTokenizer

        self.cfg = cfg
        vocab = read_vocab(vocab_file)
        if len(vocab) > cfg.padded_vocab_size:
            raise DataError(
                f"{vocab_file} has {len(vocab)} tokens but the network's vocabulary has "
                f"{cfg.padded_vocab_size} (hparams vocab_size)"
            )
        # transformers 5's BertTokenizer is the fast (Rust) one: character offsets come with it.
        # The vocabulary goes in as a dict: its ``vocab_file`` keyword is silently ignored.
        self.tokenizer = BertTokenizer(vocab=vocab, do_lower_case=cfg.do_lower_case)
        self._contexts: dict[str, tuple[list[int], np.ndarray]] = {}

    def _context_tokens(self, context: str) -> tuple[list[int], np.ndarray]:
        """Token ids and character spans of a context; cached, since questions share them."""
        if context not in self._contexts:
            self._contexts.clear()  # SQuAD lists a paragraph's questions together
            enc = self.tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)
            spans = np.asarray(enc["offset_mapping"], dtype=np.int32).reshape(-1, 2)
            self._contexts[context] = (enc["input_ids"], spans)
        return self._contexts[context]

    def features(self, example: SquadExample) -> Iterator[tuple[np.ndarray, SquadFeature]]:
        """(input rows [3, seq]: ids, segments, mask; label) per window of the example."""
        cfg, tok = self.cfg, self.tokenizer
        question = tok(example.question, add_special_tokens=False)["input_ids"]
        question = question[: cfg.max_query_length]
        context, spans = self._context_tokens(example.context)
        max_tokens = cfg.max_seq_length - len(question) - 3
        windows = sliding_windows(len(context), max_tokens, cfg.doc_stride)
        for (start, length), flags in zip(
            windows, max_context_flags(windows, len(context)), strict=True
        ):
            ids = [
                tok.cls_token_id,
                *question,
                tok.sep_token_id,
                *context[start : start + length],
                tok.sep_token_id,
            ]
            rows = np.zeros((3, cfg.max_seq_length), dtype=np.int32)
            rows[0, : len(ids)] = ids
            rows[0, len(ids) :] = tok.pad_token_id
            rows[1, len(question) + 2 : len(ids)] = 1
            rows[2, : len(ids)] = 1
            label = SquadFeature(example, len(question) + 2, spans[start : start + length], flags)
            yield rows, label


def best_span(
    start_logits: np.ndarray, end_logits: np.ndarray, feature: SquadFeature, cfg: BertQAConfig
) -> tuple[float, int, int] | None:
    """(score, first, last context token) of the best valid span of one window, or None.

    As DLE's run_squad: candidates pair the ``n_best_size`` highest start and end logits; a
    span must lie in the context, start at a token this window gives its widest context, end
    at or after its start and hold at most ``max_answer_length`` tokens; score = start + end.
    """
    inside = len(feature.spans)
    if inside == 0:
        return None
    n = cfg.n_best_size
    starts = np.argsort(-start_logits, kind="stable")[:n]  # sequence positions
    ends = np.argsort(-end_logits, kind="stable")[:n]
    s = starts[:, None] - feature.context_start  # context token indices
    e = ends[None, :] - feature.context_start
    valid = (
        (s >= 0)
        & (s < inside)
        & (e >= s)
        & (e < inside)
        & (e - s + 1 <= cfg.max_answer_length)
        & feature.max_context[np.clip(s, 0, inside - 1)]
    )
    if not valid.any():
        return None
    scores = np.where(valid, start_logits[starts][:, None] + end_logits[ends][None, :], -np.inf)
    i, j = np.unravel_index(np.argmax(scores), scores.shape)  # row-major: DLE's order on ties
    first, last = int(s[i, 0]), int(e[0, j])
    return float(scores[i, j]), first, last


def predict_answers(
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    features: Sequence[SquadFeature],
    cfg: BertQAConfig,
) -> dict[str, str]:
    """The answer text per question id: the best span over all windows of the question ("" when
    no window has a valid span)."""
    best: dict[str, tuple[float, str]] = {}
    for starts, ends, feature in zip(start_logits, end_logits, features, strict=True):
        qas_id = feature.example.qas_id
        span = best_span(np.asarray(starts), np.asarray(ends), feature, cfg)
        if span is None:
            best.setdefault(qas_id, (-np.inf, ""))
            continue
        score, first, last = span
        if qas_id not in best or score > best[qas_id][0]:
            text = feature.example.context[feature.spans[first, 0] : feature.spans[last, 1]]
            best[qas_id] = (score, text)
    return {qas_id: text for qas_id, (_, text) in best.items()}


_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """The official SQuAD v1.1 normalisation: lower case, no punctuation, no articles, single
    spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def f1_score(prediction: str, truth: str) -> float:
    predicted = normalize_answer(prediction).split()
    expected = normalize_answer(truth).split()
    common = collections.Counter(predicted) & collections.Counter(expected)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def exact_match_score(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def squad_scores(predictions: dict[str, str], examples: Sequence[SquadExample]) -> dict[str, float]:
    """Official v1.1 F1 and exact match in percent, each the max over a question's ground
    truths; a question without prediction scores 0."""
    f1 = em = 0.0
    for ex in examples:
        prediction = predictions.get(ex.qas_id)
        if prediction is None or not ex.answers:
            continue
        f1 += max(f1_score(prediction, truth) for truth in ex.answers)
        em += max(exact_match_score(prediction, truth) for truth in ex.answers)
    total = max(len(examples), 1)
    return {"f1": 100.0 * f1 / total, "exact_match": 100.0 * em / total}


def resolve_squad_dir(path: str | Path) -> tuple[Path, Path]:
    """(dev json, vocab) from a directory holding both, or DLE's datasets directory."""
    root = Path(path)
    for squad, vocab in ((SQUAD_FILE, VOCAB_FILE), (DLE_SQUAD_FILE, DLE_VOCAB_FILE)):
        if (root / squad).is_file() and (root / vocab).is_file():
            return root / squad, root / vocab
    raise InputNotFound(
        f"SQuAD data not found in {str(path)!r}: expected {SQUAD_FILE} and {VOCAB_FILE} there, "
        f"or DLE's layout {DLE_SQUAD_FILE} and {DLE_VOCAB_FILE}"
    )


# --------------------------------------------------------------------------------------------
# Family


class BertFamily(TorchFamily):
    """The workflow's view of BERT-large SQuAD: build, checkpoint, serving module, data, metric."""

    name = "BERT"
    metric_name = "f1"
    higher_is_better = True

    def __init__(self, hparams: dict[str, Any]) -> None:
        self.cfg = BertQAConfig.from_mapping(hparams)
        seq = (self.cfg.max_seq_length,)
        self.inputs = [
            TensorSpec("input__0", "int32", seq),  # token ids
            TensorSpec("input__1", "int32", seq),  # segment ids: 0 question, 1 context
            TensorSpec("input__2", "int32", seq),  # attention mask: 1 tokens, 0 padding
        ]
        self.outputs = [
            TensorSpec("output__0", "float32", seq),  # start logits
            TensorSpec("output__1", "float32", seq),  # end logits
        ]

    def build(self) -> nn.Module:
        return build_network(self.cfg)

    def wrap(self, model: nn.Module) -> nn.Module:
        return BertQAServing(model)

    def adapt_state_dict(self, state: dict[str, Any]) -> dict[str, Any]:
        """DLE's names → ``transformers``' names, float32 (DLE's AMP checkpoints may be fp16;
        the export is fp32 and lower precisions come from the convert step)."""
        return {
            k: v.float() if torch.is_floating_point(v) else v
            for k, v in dle_to_hf_names(state).items()
        }

    def serving_module(self, checkpoint: dict[str, Any]) -> nn.Module:
        """The serving module, its parameters *being* the checkpoint's tensors.

        BERT-large holds 1.34 GB of weights: initialising a network only to copy a checkpoint
        over it would cost that twice (and the random init ~10 s). The network is allocated
        without initialisation and takes the checkpoint's tensors by assignment, so the process
        holds one copy of the weights.
        """
        weights = checkpoint["model"]
        model = build_network(self.cfg, initialise=False)
        check_weights(self, model.state_dict(), weights)
        model.load_state_dict(weights, strict=True, assign=True)
        model.requires_grad_(False)  # exporters trace it; no autograd graph to keep
        return self.wrap(model).eval()

    def example_inputs(self, batch: int, seed: int) -> dict[str, np.ndarray]:
        """Deterministic rows shaped like SQuAD features: [CLS] question [SEP] context [SEP]
        then padding, with random word-piece ids, segment 0/1 and a 1…1 0…0 mask; rows differ
        in question and context length."""
        rng = np.random.default_rng(seed)
        seq = self.cfg.max_seq_length
        vocab = self.cfg.vocab_size
        low = FIRST_WORD_ID if vocab > 2 * FIRST_WORD_ID else SEP_ID + 1
        ids = np.full((batch, seq), PAD_ID, dtype=np.int32)
        segments = np.zeros((batch, seq), dtype=np.int32)
        mask = np.zeros((batch, seq), dtype=np.int32)
        max_question = min(self.cfg.max_query_length, seq - 4)
        for row in range(batch):
            q_len = int(rng.integers(min(4, max_question), max_question + 1))
            c_len = int(rng.integers(1, seq - q_len - 3 + 1))
            used = q_len + c_len + 3
            ids[row, :used] = rng.integers(low, vocab, size=used)
            ids[row, 0] = CLS_ID
            ids[row, q_len + 1] = SEP_ID
            ids[row, used - 1] = SEP_ID
            segments[row, q_len + 2 : used] = 1
            mask[row, :used] = 1
        return {"input__0": ids, "input__1": segments, "input__2": mask}

    def accuracy_quantities(
        self, reference: dict[str, np.ndarray], actual: dict[str, np.ndarray]
    ) -> Quantities:
        """Per sample, whether the most likely answer start (``output__0``) and end
        (``output__1``) moved: the share of samples whose arg-max token differs."""
        return {
            name: {"argmax_flip_fraction": argmax_flip_fraction(reference[name], actual[name])}
            for name in ("output__0", "output__1")
            if name in reference and name in actual
        }

    def dataset_batches(
        self, path: str | Path, batch_size: int, limit: int | None
    ) -> Iterator[Batch]:
        """SQuAD v1.1 dev features in batches of ``batch_size`` windows.

        ``path``: a directory holding ``dev-v1.1.json`` and the uncased BERT ``vocab.txt``
        (or DLE's datasets directory, see ``resolve_squad_dir``). ``limit``: the number of
        questions to read (all of a question's windows are kept). Labels: one ``SquadFeature``
        per row; the last batch may be smaller.
        """
        squad_file, vocab_file = resolve_squad_dir(path)
        featurizer = SquadFeaturizer(vocab_file, self.cfg)
        rows: list[np.ndarray] = []
        labels: list[SquadFeature] = []
        for example in read_squad(squad_file, limit):
            for row, label in featurizer.features(example):
                rows.append(row)
                labels.append(label)
                if len(rows) == batch_size:
                    yield self._batch(rows), labels
                    rows, labels = [], []
        if rows:
            yield self._batch(rows), labels

    @staticmethod
    def _batch(rows: list[np.ndarray]) -> dict[str, np.ndarray]:
        stacked = np.stack(rows, axis=1)  # [3, batch, seq]
        return {f"input__{i}": np.ascontiguousarray(stacked[i]) for i in range(3)}

    def task_metric(
        self, outputs: list[dict[str, np.ndarray]], labels: list[Any]
    ) -> dict[str, float]:
        """SQuAD v1.1 F1 and exact match (percent) over the questions in ``labels``."""
        starts = [row for batch in outputs for row in batch["output__0"]]
        ends = [row for batch in outputs for row in batch["output__1"]]
        features = [f for batch in labels for f in batch]
        predictions = predict_answers(starts, ends, features, self.cfg)
        examples = list({f.example.qas_id: f.example for f in features}.values())
        return squad_scores(predictions, examples)
