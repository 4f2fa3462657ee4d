"""FastPitch's data, as DeepLearningExamples reads and scores it: DLE's ``english_basic`` symbol
set and its text encoding (letters, ``english_cleaners``' abbreviations), LJSpeech filelists and
reference mels, the mel error its task metric sums, and how far fp16 moved the predicted
durations (the family, deploybench.models.fastpitch, serves and measures with them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..checkpoint_io import torch_load
from ..errors import DataError, InputNotFound
from .base import Quantities

# DLE's ``english_basic`` symbol set: pad, special, punctuation, letters, then 84 ARPAbet
# symbols ("@AA" …) that only a CMUdict lookup produces; this reader never emits them.
PAD, SPECIAL, PUNCTUATION = "_", "-", "!'(),.:;? "
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CHARACTERS = PAD + SPECIAL + PUNCTUATION + LETTERS
SYMBOL_ID = {c: i for i, c in enumerate(CHARACTERS)}
N_ARPABET = 84

# DLE's accuracy check (triton/metrics.py): a mel value outside this range marks an utterance
# as broken (LJSpeech's log-mels span about -11.5 … 2.1).
MEL_MIN, MEL_MAX = -15.0, 3.0


# DLE's english_cleaners abbreviations, in its order (afe00719
# common/text/abbreviations.py ``_abbreviations``: ``\b<abbr>\.``, case-insensitive).
ABBREVIATIONS = [
    (re.compile(rf"\b{abbreviation}\.", re.IGNORECASE), word)
    for abbreviation, word in (
        ("mrs", "misess"),
        ("ms", "miss"),
        ("mr", "mister"),
        ("dr", "doctor"),
        ("st", "saint"),
        ("co", "company"),
        ("jr", "junior"),
        ("maj", "major"),
        ("gen", "general"),
        ("drs", "doctors"),
        ("rev", "reverend"),
        ("lt", "lieutenant"),
        ("hon", "honorable"),
        ("sgt", "sergeant"),
        ("capt", "captain"),
        ("esq", "esquire"),
        ("ltd", "limited"),
        ("col", "colonel"),
        ("ft", "fort"),
        ("sen", "senator"),
    )
]


def text_to_ids(text: str) -> list[int]:
    """English text → ``english_basic`` symbol ids as DLE's FastPitch 1.0 loader encodes
    letters (afe00719: ``TextProcessing('english_basic', ['english_cleaners'])``, no
    ARPAbet): lowercase, expand the abbreviations (``ABBREVIATIONS``, "Mrs." → "misess"),
    collapse whitespace, drop characters outside the set. For ASCII text without digits, ``%``
    or braces this is DLE's sequence (LJ045-0096 included). Not done: ``english_cleaners``'
    transliteration to ASCII (unidecode), its number and currency expansion (inflect) and
    ``%`` → "percent"; DLE's ``{…}`` ARPAbet and a literal ``_`` (the pad, dropped here)."""
    cleaned = " ".join(text.lower().split())
    for pattern, word in ABBREVIATIONS:
        cleaned = pattern.sub(word, cleaned)
    return [SYMBOL_ID[c] for c in cleaned if c in SYMBOL_ID and c != PAD]


def pad_ids(sequences: list[list[int]], length: int) -> np.ndarray:
    """Symbol id lists → ``[N, length]`` int64, zero-padded and cut at ``length``."""
    out = np.zeros((len(sequences), length), dtype=np.int64)
    for row, ids in enumerate(sequences):
        ids = ids[:length]
        out[row, : len(ids)] = ids
    return out


def tile_ids(ids: list[int], length: int) -> np.ndarray:
    """One utterance's symbol ids repeated back to back to fill ``length`` (cut at ``length``
    when longer): ``[length]`` int64 without padding, as DLE's ``triton/prepare_input_data.py``
    makes FastPitch's perf data (``np.tile`` to SEQUENCE_LENGTH, then cut)."""
    if not ids:
        raise DataError("an utterance with no english_basic symbols cannot fill a perf input")
    return np.resize(np.asarray(ids, dtype=np.int64), length)


@dataclass(frozen=True)
class Utterance:
    mel_path: Path
    text: str


def find_filelist(path: Path) -> Path:
    """The filelist for ``path``: the file itself, ``<dir>/filelist.txt``, or the only
    ``<dir>/filelists/*.txt``."""
    if path.is_file():
        return path
    if (path / "filelist.txt").is_file():
        return path / "filelist.txt"
    candidates = sorted((path / "filelists").glob("*.txt"))
    if len(candidates) != 1:
        found = ", ".join(c.name for c in candidates) or "none"
        raise InputNotFound(
            f"{path}: expected a filelist file, {path}/filelist.txt or exactly one "
            f"{path}/filelists/*.txt (found: {found})"
        )
    return candidates[0]


def read_filelist(filelist: Path) -> list[Utterance]:
    """DLE filelist lines ``<mel or wav path>|…|<text>``; paths relative to the data-set root
    (the filelist's folder, or its parent when the folder is ``filelists``). A ``wavs/X.wav``
    entry means ``mels/X.pt``, where DLE's ``prepare_dataset.py --extract-mels`` writes it."""
    root = filelist.parent.parent if filelist.parent.name == "filelists" else filelist.parent
    utterances = []
    for line in filelist.read_text(encoding="utf-8").splitlines():
        fields = line.split("|")
        if len(fields) < 2 or not fields[0].strip():
            continue
        first = Path(fields[0].strip())
        if first.suffix == ".wav":
            first = Path("mels") / f"{first.stem}.pt"
        elif first.suffix not in (".pt", ".npy"):
            continue  # a header such as "mels|pitch|text"
        utterances.append(Utterance(root / first, fields[-1].strip()))
    return utterances


def load_mel(path: Path) -> np.ndarray:
    """A reference mel ``[n_mel, frames]`` float32: DLE's ``.pt`` tensor, or a ``.npy`` array
    (also looked up beside a missing ``.pt`` of the same name)."""
    npy = path.with_suffix(".npy")
    if path.suffix == ".pt" and not path.exists() and npy.exists():
        path = npy
    if path.suffix == ".npy":
        mel = np.load(path)
    else:
        mel = torch_load(path, what="mel spectrogram").numpy()
    mel = np.asarray(mel, dtype=np.float32)
    if mel.ndim != 2:
        raise DataError(f"{path}: expected a [n_mel, frames] mel spectrogram, got {mel.shape}")
    return mel


def pad_mels(mels: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Mels ``[n_mel, T_i]`` → ``[N, n_mel, max T]`` zero-padded, and the lengths ``[N]``."""
    lengths = np.array([m.shape[1] for m in mels], dtype=np.int64)
    out = np.zeros((len(mels), mels[0].shape[0], int(lengths.max())), dtype=np.float32)
    for row, mel in enumerate(mels):
        out[row, :, : mel.shape[1]] = mel
    return out, lengths


def mel_errors(
    predicted: np.ndarray,
    predicted_lengths: np.ndarray,
    reference: np.ndarray,
    reference_lengths: np.ndarray,
) -> dict[str, float]:
    """Sums over a batch for the task metric, over the frames both mels have (the shorter
    length): absolute and squared error, element count, length error, range violations."""
    abs_sum = sq_sum = 0.0
    count = 0
    out_of_range = 0
    for row in range(predicted.shape[0]):
        n_pred = int(np.asarray(predicted_lengths[row]).reshape(-1)[0])
        n_ref = int(reference_lengths[row])
        n = min(n_pred, n_ref)
        diff = predicted[row, :, :n].astype(np.float64) - reference[row, :, :n]
        abs_sum += float(np.abs(diff).sum())
        sq_sum += float(np.square(diff).sum())
        count += diff.size
        valid = predicted[row, :, :n_pred]
        valid = valid[~np.isnan(valid)]
        out_of_range += bool(valid.size and (valid.min() < MEL_MIN or valid.max() > MEL_MAX))
    length_error = np.abs(
        np.asarray(predicted_lengths).reshape(-1) - np.asarray(reference_lengths).reshape(-1)
    )
    return {
        "abs": abs_sum,
        "sq": sq_sum,
        "count": float(count),
        "utterances": float(predicted.shape[0]),
        "length_abs": float(length_error.sum()),
        "out_of_range": float(out_of_range),
    }


def duration_quantities(
    reference: dict[str, np.ndarray], actual: dict[str, np.ndarray], pace: float
) -> Quantities:
    """How far ``actual`` FastPitch outputs moved in time from ``reference``, in frames.

    * ``OUTPUT__2`` (durations): ``max_frames_diff``, the largest change of a symbol's frame
      count (its duration rounded as ``fastpitch.regulate_length`` rounds it), and
      ``frames_flip_fraction``, the share of symbols (duration > 0 in either) whose frame count
      changed;
    * ``OUTPUT__1`` (frames per utterance): ``max_length_diff_frames`` and
      ``length_differs_fraction``, the share of utterances whose length changed;
    * ``OUTPUT__0`` (mel): ``aligned_fraction``, the share of utterances whose every symbol kept
      its frame count, and ``aligned_max_abs_err``, the largest mel error over their frames
      (elsewhere a moved frame shifts the rest of the utterance, and the mel error measures
      the shift, not the arithmetic; 0 when no utterance is aligned).
    """
    out: Quantities = {}
    ref_d, act_d = reference.get("OUTPUT__2"), actual.get("OUTPUT__2")
    aligned: np.ndarray | None = None
    if ref_d is not None and act_d is not None and ref_d.shape == act_d.shape:
        ref_f, act_f = np.round(ref_d / pace), np.round(act_d / pace)
        spoken = (ref_d > 0) | (act_d > 0)
        moved = (ref_f != act_f) & spoken
        aligned = ~moved.any(axis=1)
        out["OUTPUT__2"] = {
            "max_frames_diff": float(np.abs(ref_f - act_f).max()) if ref_f.size else 0.0,
            "frames_flip_fraction": float(moved.sum() / spoken.sum()) if spoken.any() else 0.0,
        }
    ref_n, act_n = reference.get("OUTPUT__1"), actual.get("OUTPUT__1")
    if ref_n is not None and act_n is not None and ref_n.shape == act_n.shape:
        diff = np.abs(ref_n.astype(np.int64) - act_n.astype(np.int64)).reshape(len(ref_n), -1)
        out["OUTPUT__1"] = {
            "max_length_diff_frames": float(diff.max()) if diff.size else 0.0,
            "length_differs_fraction": float(np.mean(diff.max(axis=1) > 0)) if diff.size else 0.0,
        }
        lengths = ref_n.reshape(len(ref_n), -1)[:, 0]
        same_length = diff.max(axis=1) == 0
        aligned = same_length if aligned is None else aligned & same_length
        ref_m, act_m = reference.get("OUTPUT__0"), actual.get("OUTPUT__0")
        if ref_m is not None and act_m is not None and len(ref_m) == len(act_m):
            errors = [
                float(np.abs(ref_m[i, :, :n] - act_m[i, :, :n]).max()) if n else 0.0
                for i, n in enumerate(lengths)
                if aligned[i]
            ]
            out["OUTPUT__0"] = {
                "aligned_fraction": float(np.mean(aligned)) if aligned.size else 0.0,
                "aligned_max_abs_err": max(errors, default=0.0),
            }
    return out
