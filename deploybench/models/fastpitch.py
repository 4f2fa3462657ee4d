"""FastPitch (Łańcucki, 2021) as deployed by DeepLearningExamples.

Over 600 lines on purpose: one model's network, checkpoint layout and inputs in one module;
its text encoding, data set reading and metrics are deploybench.models.fastpitch_data.

A compact re-implementation of the network DLE's FastPitch 1.0 deploys on Triton
(``PyTorch/SpeechSynthesis/FastPitch``, checkpoint ``nvidia_fastpitch_200518.pt``): symbol
embedding plus sinusoidal positions, a feed-forward transformer (FFT) encoder, duration and
pitch predictors, a pitch embedding added to the encoder output, length regulation, an FFT
decoder and a linear projection to mel channels. Parameter names follow DLE's state dict
(``encoder.word_emb``, ``encoder.layers.N.dec_attn.qkv_net``, ``duration_predictor.layers.N.conv``,
``pitch_emb``, ``proj`` …) so that a DLE checkpoint loads unchanged.

DLE versions (tests/fixtures/dle/fastpitch-*.json list their parameters): FastPitch 1.1
(commit ba8f04bf) adds a training-only aligner (``attention.*``, dropped on reading) and, with
``--energy-conditioning`` (its scripts/train.sh default), an energy predictor and embedding:
hyper-parameter ``energy_conditioning``, default false as the seed's 1.0 checkpoint. 1.0 and
1.1 without energy compute the same inference network.

Triton interface (DLE's ``triton/model.py``, inference mode): one input ``INPUT__0`` (symbol ids,
zero-padded; DLE 1.0 also names an ``INPUT__1`` with the text lengths, which its ``infer``
ignores, so the traced model has none) and four outputs: ``OUTPUT__0`` the mel spectrogram
``[80, frames]``, ``OUTPUT__1`` the number of valid frames, ``OUTPUT__2`` the predicted
durations and ``OUTPUT__3`` the predicted pitch per symbol; with energy conditioning a fifth,
``OUTPUT__4``, the predicted energy per symbol (DLE 1.1's ``triton/model.py`` names five
outputs after ``infer``'s ``energy_pred``). The number of frames depends on the predicted
durations, so ``OUTPUT__0`` is padded to the longest example of the batch.

Length regulation is built from tensor operations only (cumulative sums, a comparison and a
gather), so one ``torch.jit.trace`` or ONNX export serves any batch size, text length and set of
durations.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import CheckpointError, ConfigError, DataError
from ..tensors import TensorSpec
from .base import Batch, Quantities, TorchFamily, check_hparams
from .fastpitch_data import (
    CHARACTERS,
    N_ARPABET,
    duration_quantities,
    find_filelist,
    load_mel,
    mel_errors,
    pad_ids,
    pad_mels,
    read_filelist,
    text_to_ids,
    tile_ids,
)

# Parameter name prefixes of FastPitch 1.1's energy conditioning.
ENERGY_PREFIXES = ("energy_predictor.", "energy_emb.")


@dataclass(frozen=True)
class FastPitchConfig:
    """Hyper-parameters, named as DLE's ``fastpitch/arg_parser.py`` (defaults = DLE's)."""

    n_mel_channels: int = 80
    n_symbols: int = len(CHARACTERS) + N_ARPABET  # 148 for english_basic
    padding_idx: int = 0
    symbols_embedding_dim: int = 384
    in_fft_n_layers: int = 6
    in_fft_n_heads: int = 1
    in_fft_d_head: int = 64
    in_fft_conv1d_kernel_size: int = 3
    in_fft_conv1d_filter_size: int = 1536
    in_fft_output_size: int = 384
    p_in_fft_dropout: float = 0.1
    p_in_fft_dropatt: float = 0.1
    p_in_fft_dropemb: float = 0.0
    out_fft_n_layers: int = 6
    out_fft_n_heads: int = 1
    out_fft_d_head: int = 64
    out_fft_conv1d_kernel_size: int = 3
    out_fft_conv1d_filter_size: int = 1536
    out_fft_output_size: int = 384
    p_out_fft_dropout: float = 0.1
    p_out_fft_dropatt: float = 0.1
    p_out_fft_dropemb: float = 0.0
    dur_predictor_kernel_size: int = 3
    dur_predictor_filter_size: int = 256
    p_dur_predictor_dropout: float = 0.1
    dur_predictor_n_layers: int = 2
    pitch_predictor_kernel_size: int = 3
    pitch_predictor_filter_size: int = 256
    p_pitch_predictor_dropout: float = 0.1
    pitch_predictor_n_layers: int = 2
    pitch_embedding_kernel_size: int = 3
    # FastPitch 1.1's energy conditioning (DLE's --energy-conditioning; train.sh sets it by
    # default): an energy predictor and embedding, and a fifth output. Off for FastPitch 1.0.
    energy_conditioning: bool = False
    energy_predictor_kernel_size: int = 3
    energy_predictor_filter_size: int = 256
    p_energy_predictor_dropout: float = 0.1
    energy_predictor_n_layers: int = 2
    energy_embedding_kernel_size: int = 3
    # Inference settings of DLE's ``infer``: durations are clamped to [0, max_duration] frames
    # and divided by pace.
    max_duration: float = 75.0
    pace: float = 1.0
    # Not DLE's: the symbols per request (the seed's SEQUENCE_LENGTH) and a cap on the frames
    # per utterance, which bounds memory (attention is quadratic in frames). LJSpeech's longest
    # mel has 870 frames; longer outputs are cut, as DLE's ``regulate_len(mel_max_len=…)`` does.
    text_length: int = 128
    max_mel_frames: int = 2048
    # Not DLE's: the seeded initialisation predicts about this many frames per symbol (a trained
    # model's LJSpeech average is ~6). A default-initialised duration head predicts ~1, which
    # would make the decoder, most of the compute, run on unrealistically short spectrograms.
    init_frames_per_symbol: float = 6.0

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> FastPitchConfig:
        check_hparams(cls, values, "FastPitch")
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if not isinstance(self.energy_conditioning, bool):
            raise TypeError(
                f"energy_conditioning must be true or false, got {self.energy_conditioning!r}"
            )
        d = self.symbols_embedding_dim
        if self.in_fft_output_size != d or self.out_fft_output_size != d:
            raise ConfigError(
                "in_fft_output_size and out_fft_output_size must equal symbols_embedding_dim "
                f"({d}): the FFT blocks are residual"
            )
        if d % 2:
            raise ConfigError(f"symbols_embedding_dim must be even (sin/cos halves), got {d}")
        kernels = {
            k: getattr(self, k) for k in self.__dataclass_fields__ if k.endswith("kernel_size")
        }
        even = sorted(k for k, v in kernels.items() if v % 2 == 0)
        if even:
            raise ConfigError(f"kernel sizes must be odd to keep the length: {even}")
        if self.n_symbols <= self.padding_idx:
            raise ConfigError("padding_idx must be a valid symbol id")


# --- building blocks ---------------------------------------------------------------------------


def count_up(like: Tensor, n: int) -> Tensor:
    """0, 1, ..., n-1 in ``like``'s dtype and on its device. Not ``torch.arange``: a trace
    records the device arange makes its tensor on as a constant (a trace made on a CPU then
    fails on a GPU); ``new_ones`` takes it from ``like`` when the trace runs, and needs no cast
    (an fp16 ONNX file's casts are what onnxconverter-common mistypes)."""
    return like.new_ones(n).cumsum(0) - 1


class PositionalEmbedding(nn.Module):
    """Sinusoidal positions: sines then cosines of ``position * inv_freq``."""

    inv_freq: Tensor

    def __init__(self, d_model: int) -> None:
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0.0, d_model, 2.0) / d_model))
        self.register_buffer("inv_freq", inv_freq)  # in DLE's state dict

    def forward(self, length_like: Tensor) -> Tensor:
        """``[1, T, d_model]`` for the ``T = length_like.size(1)`` positions."""
        positions = count_up(self.inv_freq, length_like.size(1))
        angles = positions.unsqueeze(1) * self.inv_freq.unsqueeze(0)
        return torch.cat([angles.sin(), angles.cos()], dim=1).unsqueeze(0)


class MultiHeadAttn(nn.Module):
    """Self-attention over unpadded keys, residual and post-layer-norm (DLE's layout:
    one fused q/k/v projection, output projection without bias)."""

    def __init__(
        self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float
    ) -> None:
        super().__init__()
        self.n_head, self.d_head = n_head, d_head
        self.scale = d_head**-0.5
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head)
        self.drop = nn.Dropout(dropout)
        self.dropatt = nn.Dropout(dropatt)
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, padding: Tensor) -> Tensor:
        """``x`` ``[B, T, d_model]``; ``padding`` ``[B, T]`` True where there is no symbol."""
        b, t, _ = x.shape
        # q, k and v are consecutive blocks of the projection, each [heads, d_head].
        qkv = self.qkv_net(x).view(b, t, 3, self.n_head, self.d_head).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        scores = scores.masked_fill(padding[:, None, None, :], float("-inf"))
        probs = self.dropatt(F.softmax(scores, dim=-1))
        heads = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, self.n_head * self.d_head)
        return self.layer_norm(x + self.drop(self.o_net(heads)))


class PositionwiseConvFF(nn.Module):
    """Two 1-D convolutions along time with a ReLU between; residual, post-layer-norm."""

    def __init__(self, d_model: int, d_inner: int, kernel_size: int, dropout: float) -> None:
        super().__init__()
        self.CoreNet = nn.Sequential(  # DLE's name, kept for its state dict
            nn.Conv1d(d_model, d_inner, kernel_size, padding=kernel_size // 2),
            nn.ReLU(),
            nn.Conv1d(d_inner, d_model, kernel_size, padding=kernel_size // 2),
            nn.Dropout(dropout),
        )
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer_norm(x + self.CoreNet(x.transpose(1, 2)).transpose(1, 2))


class TransformerLayer(nn.Module):
    """One FFT block. Padded positions are zeroed after each sub-layer (``masked_fill`` rather
    than DLE's multiplication: an all-padding row then yields zeros instead of NaN)."""

    def __init__(
        self,
        n_head: int,
        d_model: int,
        d_head: int,
        d_inner: int,
        kernel_size: int,
        dropout: float,
        dropatt: float,
    ) -> None:
        super().__init__()
        self.dec_attn = MultiHeadAttn(n_head, d_model, d_head, dropout, dropatt)
        self.pos_ff = PositionwiseConvFF(d_model, d_inner, kernel_size, dropout)

    def forward(self, x: Tensor, padding: Tensor) -> Tensor:
        pad = padding.unsqueeze(2)
        x = self.dec_attn(x, padding).masked_fill(pad, 0.0)
        return self.pos_ff(x).masked_fill(pad, 0.0)


class FFTransformer(nn.Module):
    """A stack of FFT blocks over embedded symbols (encoder) or regulated frames (decoder)."""

    def __init__(self, cfg: FastPitchConfig, prefix: str, n_embed: int | None = None) -> None:
        super().__init__()

        def hp(name: str) -> Any:
            return getattr(cfg, name.format(prefix))

        d_model = cfg.symbols_embedding_dim
        self.word_emb = (
            nn.Embedding(n_embed, d_model, padding_idx=cfg.padding_idx) if n_embed else None
        )
        self.padding_idx = cfg.padding_idx
        self.pos_emb = PositionalEmbedding(d_model)
        self.drop = nn.Dropout(hp("p_{}_fft_dropemb"))
        self.layers = nn.ModuleList(
            TransformerLayer(
                hp("{}_fft_n_heads"),
                d_model,
                hp("{}_fft_d_head"),
                hp("{}_fft_conv1d_filter_size"),
                hp("{}_fft_conv1d_kernel_size"),
                hp("p_{}_fft_dropout"),
                hp("p_{}_fft_dropatt"),
            )
            for _ in range(hp("{}_fft_n_layers"))
        )

    def forward(self, x: Tensor, padding: Tensor) -> Tensor:
        """``x``: embedded inputs ``[B, T, d_model]``; ``padding`` ``[B, T]``."""
        pos = self.pos_emb(x).masked_fill(padding.unsqueeze(2), 0.0)
        out = self.drop(x + pos)
        for layer in self.layers:
            out = layer(out, padding)
        return out

    def embed(self, symbols: Tensor) -> tuple[Tensor, Tensor]:
        """Symbol ids ``[B, L]`` → embeddings and the padding mask (id == padding_idx)."""
        if self.word_emb is None:
            raise RuntimeError("this FFTransformer has no symbol embedding")
        return self.word_emb(symbols), symbols == self.padding_idx


class ConvReLUNorm(nn.Module):
    """Conv1d → ReLU → LayerNorm over channels → dropout, on ``[B, C, T]``."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, dropout: float
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.norm = nn.LayerNorm(out_channels)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.conv(x))
        return self.dropout(self.norm(out.transpose(1, 2)).transpose(1, 2))


class TemporalPredictor(nn.Module):
    """One value per symbol (log-duration, normalised pitch or log-energy) from the encoder
    output."""

    def __init__(
        self, input_size: int, filter_size: int, kernel_size: int, dropout: float, n_layers: int
    ) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            *(
                ConvReLUNorm(
                    input_size if i == 0 else filter_size, filter_size, kernel_size, dropout
                )
                for i in range(n_layers)
            )
        )
        self.fc = nn.Linear(filter_size, 1)

    def forward(self, x: Tensor, padding: Tensor) -> Tensor:
        """``[B, L, C]`` → ``[B, L]``, zero at padding."""
        pad = padding.unsqueeze(2)
        out = self.layers(x.masked_fill(pad, 0.0).transpose(1, 2)).transpose(1, 2)
        return self.fc(out).masked_fill(pad, 0.0).squeeze(2)


def predictor(cfg: FastPitchConfig, quantity: str) -> TemporalPredictor:
    """The predictor of ``quantity`` (``dur``, ``pitch``, ``energy``) over the encoder output,
    sized by the hyper-parameters DLE names ``<quantity>_predictor_*``."""

    def hp(name: str) -> Any:
        return getattr(cfg, name.format(quantity))

    return TemporalPredictor(
        cfg.in_fft_output_size,
        hp("{}_predictor_filter_size"),
        hp("{}_predictor_kernel_size"),
        hp("p_{}_predictor_dropout"),
        hp("{}_predictor_n_layers"),
    )


def conditioning_embedding(cfg: FastPitchConfig, quantity: str) -> nn.Conv1d:
    """The convolution that embeds one predicted value per symbol (``pitch``, ``energy``) into
    the encoder's width (DLE's ``<quantity>_emb``)."""
    k = getattr(cfg, f"{quantity}_embedding_kernel_size")
    return nn.Conv1d(1, cfg.symbols_embedding_dim, k, padding=k // 2)


def regulate_length(
    encoded: Tensor, durations: Tensor, pace: float, max_frames: int
) -> tuple[Tensor, Tensor]:
    """Repeat each symbol's encoding for its rounded duration: ``[B, L, C]`` → ``[B, T, C]``
    with ``T`` the longest utterance of the batch (at least 1, at most ``max_frames``); frames
    past an utterance's end are zero. Returns the frames and the valid frame counts ``[B]``.

    Each frame looks up the symbol whose cumulative duration first exceeds it; frames past the
    end find index ``L``, a zero row appended to the encodings. Only tensor operations, so a
    trace stays valid for other durations and sizes (no loop over values).
    """
    repeats = torch.round(durations.float() / pace).long()
    ends = repeats.cumsum(dim=1)  # [B, L]: first frame after each symbol
    lengths = ends[:, -1].clamp(max=max_frames)
    # A tensor end (not a Python int) keeps the frame count dynamic in a trace and in ONNX.
    n_frames = lengths.max().clamp(min=1)
    frames = count_up(ends, max_frames)[:n_frames]  # a tensor bound: sliced as traced
    symbol = (ends.unsqueeze(1) <= frames.view(1, -1, 1)).sum(dim=2)  # [B, T] in 0..L
    padded = F.pad(encoded, (0, 0, 0, 1))  # [B, L + 1, C], last row zero
    index = symbol.unsqueeze(2).expand(-1, -1, encoded.size(2))
    return padded.gather(1, index), lengths


# --- the network -------------------------------------------------------------------------------


class FastPitch(nn.Module):
    """FastPitch in inference mode: symbol ids → mel, lengths, durations, pitch (and energy
    with ``energy_conditioning``)."""

    def __init__(self, cfg: FastPitchConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = FFTransformer(cfg, "in", n_embed=cfg.n_symbols)
        self.duration_predictor = predictor(cfg, "dur")
        self.decoder = FFTransformer(cfg, "out")
        self.pitch_predictor = predictor(cfg, "pitch")
        self.pitch_emb = conditioning_embedding(cfg, "pitch")
        # Training-set pitch statistics, stored in DLE's checkpoints; inference does not use them.
        self.register_buffer("pitch_mean", torch.zeros(1))
        self.register_buffer("pitch_std", torch.zeros(1))
        # After the pitch modules and before proj, as in DLE's model.py.
        self.energy_predictor: TemporalPredictor | None = None
        self.energy_emb: nn.Conv1d | None = None
        if cfg.energy_conditioning:
            self.energy_predictor = predictor(cfg, "energy")
            self.energy_emb = conditioning_embedding(cfg, "energy")
        self.proj = nn.Linear(cfg.out_fft_output_size, cfg.n_mel_channels)
        with torch.no_grad():
            self.duration_predictor.fc.bias.fill_(math.log1p(cfg.init_frames_per_symbol))

    def forward(self, symbols: Tensor) -> tuple[Tensor, ...]:
        """``symbols`` ``[B, L]`` int64 → mel ``[B, n_mel, T]``, frames ``[B]`` (int64),
        durations ``[B, L]``, pitch ``[B, L]`` and, with energy conditioning, energy ``[B, L]``
        (DLE's ``infer`` outputs, in its order)."""
        cfg = self.cfg
        embedded, text_padding = self.encoder.embed(symbols)
        encoded = self.encoder(embedded, text_padding)

        log_durations = self.duration_predictor(encoded, text_padding)
        durations = torch.clamp(torch.exp(log_durations) - 1.0, 0.0, cfg.max_duration)
        pitch = self.pitch_predictor(encoded, text_padding)
        encoded = encoded + self.pitch_emb(pitch.unsqueeze(1)).transpose(1, 2)
        outputs: tuple[Tensor, ...] = (durations, pitch)
        if self.energy_predictor is not None and self.energy_emb is not None:
            # As DLE's infer: predicted from the pitch-conditioned encoding, in the training
            # target's space, log(1 + energy), and embedded as it is.
            energy = self.energy_predictor(encoded, text_padding)
            encoded = encoded + self.energy_emb(energy.unsqueeze(1)).transpose(1, 2)
            outputs = (*outputs, energy)

        frames, lengths = regulate_length(encoded, durations, cfg.pace, cfg.max_mel_frames)
        positions = count_up(lengths, frames.size(1))
        frame_padding = positions.unsqueeze(0) >= lengths.unsqueeze(1)
        decoded = self.decoder(frames, frame_padding)
        mel = self.proj(decoded).transpose(1, 2)
        return (mel, lengths, *outputs)


class FastPitchServing(nn.Module):
    """DLE's Triton outputs; the frame count as ``[B, 1]``, since a batched Triton tensor needs
    at least one dimension per example."""

    def __init__(self, model: FastPitch) -> None:
        super().__init__()
        self.model = model

    def forward(self, symbols: Tensor) -> tuple[Tensor, ...]:
        mel, lengths, *per_symbol = self.model(symbols)
        return (mel, lengths.unsqueeze(1), *per_symbol)


# --- the family --------------------------------------------------------------------------------


class FastPitchFamily(TorchFamily):
    """The workflow's view of FastPitch: build, checkpoint, serving module, data and metric."""

    name = "FastPitch"
    metric_name = "mel_mae"
    higher_is_better = False

    def __init__(self, hparams: dict[str, Any]) -> None:
        self.cfg = FastPitchConfig.from_mapping(hparams)
        c = self.cfg
        self.inputs = [TensorSpec("INPUT__0", "int64", (c.text_length,))]
        self.outputs = [
            TensorSpec("OUTPUT__0", "float32", (c.n_mel_channels, -1)),
            TensorSpec("OUTPUT__1", "int64", (1,)),
            TensorSpec("OUTPUT__2", "float32", (c.text_length,)),
            TensorSpec("OUTPUT__3", "float32", (c.text_length,)),
        ]
        if c.energy_conditioning:
            self.outputs.append(TensorSpec("OUTPUT__4", "float32", (c.text_length,)))

    def build(self) -> nn.Module:
        return FastPitch(self.cfg)

    def wrap(self, model: nn.Module) -> nn.Module:
        if not isinstance(model, FastPitch):
            raise TypeError(f"expected a FastPitch module, got {type(model).__name__}")
        return FastPitchServing(model)

    def init_state(self, seed: int) -> dict[str, Any]:
        state = super().init_state(seed)
        return {**state, "config": dict(self.cfg.__dict__)}

    def adapt_state_dict(self, state: dict[str, Any]) -> dict[str, Any]:
        """DLE's names without the alignment module of FastPitch 1.1 (``attention.*``), which
        only training uses (the reader has already stripped DDP's ``module.``)."""
        return {k: v for k, v in state.items() if not k.startswith("attention.")}

    def serving_module(self, checkpoint: dict[str, Any]) -> nn.Module:
        self.check_energy(checkpoint["model"])
        return super().serving_module(checkpoint)

    def check_energy(self, state: dict[str, Any]) -> None:
        """The checkpoint's energy conditioning (FastPitch 1.1's ``energy_predictor.*`` and
        ``energy_emb.*``) must match ``energy_conditioning``: say which setting fits."""
        energy = sorted(k for k in state if k.startswith(ENERGY_PREFIXES))
        on = self.cfg.energy_conditioning
        if on and not energy:
            with torch.device("meta"):  # names only: no memory, no initialisation
                names = self.build().state_dict()
            expected = sorted(k for k in names if k.startswith(ENERGY_PREFIXES))
            raise CheckpointError(
                "checkpoint has no energy predictor or embedding (FastPitch 1.0, or 1.1 trained "
                "without --energy-conditioning) but hparams energy_conditioning is true; missing "
                f"({len(expected)}): {', '.join(expected)}. Set energy_conditioning: false"
            )
        if energy and not on:
            raise CheckpointError(
                "checkpoint has FastPitch 1.1's energy conditioning (trained with "
                "--energy-conditioning) but hparams energy_conditioning is false; unexpected "
                f"({len(energy)}): {', '.join(energy)}. Set energy_conditioning: true"
            )

    def example_inputs(
        self, batch: int, seed: int, *, full_length: bool = False
    ) -> dict[str, np.ndarray]:
        """Deterministic text-like ids: lowercase letters, spaces and punctuation of
        ``english_basic``, a random length in [length/4, length] per row, zero-padded.
        ``full_length``: every row fills all ``text_length`` symbols, as DLE's perf data does
        (``prepare_input_data.py`` tiles one utterance to SEQUENCE_LENGTH, with no padding)."""
        length = self.cfg.text_length
        rng = np.random.default_rng(seed)
        alphabet = np.array(text_to_ids("abcdefghijklmnopqrstuvwxyz     ,.?"), dtype=np.int64)
        lengths = (
            np.full(batch, length)
            if full_length
            else rng.integers(max(1, length // 4), length + 1, size=batch)
        )
        ids = np.zeros((batch, length), dtype=np.int64)
        for row, n in enumerate(lengths):
            ids[row, :n] = rng.choice(alphabet, size=n)
        return {"INPUT__0": ids}

    def perf_inputs(self, seed: int, dataset: str | Path | None = None) -> dict[str, np.ndarray]:
        """All ``text_length`` symbols, no padding (padding yields no frames, and the decoder's
        cost grows with the frames), as DLE's perf data: ``triton/prepare_input_data.py`` tiles
        the first utterance its data loader reads (LJSpeech's test filelist) to SEQUENCE_LENGTH.
        ``dataset``: its filelist's first utterance, repeated to fill (cut when longer); without
        one, seeded symbols that fill the row."""
        if not dataset:
            return self.example_inputs(1, seed, full_length=True)
        filelist = find_filelist(Path(dataset))
        utterances = read_filelist(filelist)
        if not utterances:
            raise DataError(f"{filelist}: no utterances to make the perf input of")
        text = utterances[0].text
        ids = text_to_ids(text)
        if not ids:
            raise DataError(
                f"{filelist}: its first utterance {text!r} has no english_basic symbols"
            )
        return {"INPUT__0": tile_ids(ids, self.cfg.text_length)[np.newaxis]}

    def perf_input_source(self, seed: int, dataset: str | Path | None = None) -> str:
        length = self.cfg.text_length
        if not dataset:
            return (
                f"seeded letters, spaces and punctuation filling {length} symbols (seed {seed}); "
                "DLE sent LJ045-0096 as letters (english_cleaners) tiled to 128"
            )
        return (
            f"the first utterance of {find_filelist(Path(dataset))} as letters (english_basic, "
            f"english_cleaners' abbreviations, no number expansion), tiled to {length} symbols, "
            "as DLE's FastPitch 1.0 perf input (LJ045-0096)"
        )

    def accuracy_quantities(
        self, reference: dict[str, np.ndarray], actual: dict[str, np.ndarray]
    ) -> Quantities:
        """How the utterances' timing moved (see :func:`duration_quantities`)."""
        return duration_quantities(reference, actual, self.cfg.pace)

    def dataset_batches(
        self, path: str | Path, batch_size: int, limit: int | None
    ) -> Iterator[Batch]:
        """LJSpeech as DLE prepares it: a filelist (``mels/X.pt|…|text`` or
        ``wavs/X.wav|pitch/X.pt|text``) and reference mels (``.pt``, or ``.npy``). Texts are
        cut at ``text_length`` symbols. Labels: ``{"mel": [B, n_mel, T], "mel_lengths": [B]}``."""
        utterances = read_filelist(find_filelist(Path(path)))
        if limit is not None:
            utterances = utterances[: limit * batch_size]
        for start in range(0, len(utterances), batch_size):
            chunk = utterances[start : start + batch_size]
            ids = pad_ids([text_to_ids(u.text) for u in chunk], self.cfg.text_length)
            mel, lengths = pad_mels([load_mel(u.mel_path) for u in chunk])
            yield {"INPUT__0": ids}, {"mel": mel, "mel_lengths": lengths}

    def task_metric(
        self, outputs: list[dict[str, np.ndarray]], labels: list[Any]
    ) -> dict[str, float]:
        """Mel error against the references over the frames both have: ``mel_mae`` and
        ``mel_mse`` per mel value, ``mel_length_mae`` in frames per utterance, and the fraction
        of utterances failing DLE's value-range check (``mel_out_of_range_fraction``)."""
        totals: dict[str, float] = {}
        for out, label in zip(outputs, labels, strict=True):
            sums = mel_errors(
                out["OUTPUT__0"], out["OUTPUT__1"], label["mel"], label["mel_lengths"]
            )
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + value

        def ratio(key: str, per: str) -> float:
            return totals[key] / totals[per] if totals.get(per) else float("nan")

        return {
            "mel_mae": ratio("abs", "count"),
            "mel_mse": ratio("sq", "count"),
            "mel_length_mae": ratio("length_abs", "utterances"),
            "mel_out_of_range_fraction": ratio("out_of_range", "utterances"),
        }
