"""A Piper voice on ONNX Runtime, with eSpeak NG's phonemes as Piper defines them.

Piper (MIT code; its ``piper-tts`` package is GPL and not used here) trains VITS voices on
eSpeak NG's IPA phonemes. Each voice's config JSON maps every phoneme (a Unicode code point
after NFD) to ids; a sentence becomes ``^``, then each phoneme followed by the pad ``_``,
then ``$``. The clause's punctuation is a phoneme too (a comma, colon or semicolon is
followed by a space), and ``.``, ``?`` and ``!`` end a sentence. Sentences are synthesised
one by one, each peak-normalised to 16 bits, with a short silence between them.
"""

from __future__ import annotations

import json
import re
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from genhook.engines.audio._espeak import Espeak
from genhook.engines.onnx import cpu_session

if TYPE_CHECKING:
    import onnxruntime

_BOS, _EOS, _PAD = "^", "$", "_"
_SENTENCE_ENDS = frozenset(".?!")
_SPACED_MARKS = frozenset(",:;")
# Pause between sentences, as Piper's default ``sentence_silence``.
SENTENCE_SILENCE_SECONDS = 0.2
# eSpeak NG marks a switch of language inside a text as "(fr)"; Piper drops those marks.
_LANGUAGE_SWITCH = re.compile(r"\([^)]+\)")
_MAX_INT16 = 32767.0


@dataclass(frozen=True, slots=True)
class PiperConfig:
    sample_rate: int
    espeak_voice: str
    noise_scale: float
    length_scale: float
    noise_w: float
    phoneme_ids: dict[str, list[int]]

    @classmethod
    def read(cls, path: Path) -> PiperConfig:
        raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("phoneme_type", "espeak") != "espeak":
            raise ValueError(f"{path}: only eSpeak-phoneme Piper voices are supported")
        inference = raw.get("inference", {})
        return cls(
            sample_rate=int(raw["audio"]["sample_rate"]),
            espeak_voice=str(raw["espeak"]["voice"]),
            noise_scale=float(inference.get("noise_scale", 0.667)),
            length_scale=float(inference.get("length_scale", 1.0)),
            noise_w=float(inference.get("noise_w", 0.8)),
            phoneme_ids={k: [int(i) for i in v] for k, v in raw["phoneme_id_map"].items()},
        )


def sentences(clauses: list[tuple[str, str]]) -> list[str]:
    """Join eSpeak NG's clauses into Piper's sentences, punctuation kept as phonemes.

    A clause with no punctuation is one eSpeak NG cut because it ran long (or the text's
    end): it ends a sentence too, so no inference is fed thousands of phonemes at once.
    """
    done: list[str] = []
    current = ""
    for phonemes, mark in clauses:
        current += _LANGUAGE_SWITCH.sub("", phonemes)
        if mark:
            current += mark + (" " if mark in _SPACED_MARKS else "")
        if (mark in _SENTENCE_ENDS or not mark) and current.strip():
            done.append(current.strip())
            current = ""
    if current.strip():
        done.append(current.strip())
    return done


def phoneme_ids(phonemes: str, id_map: dict[str, list[int]]) -> list[int]:
    """Piper's ids for one sentence: BOS, each known phoneme then the pad, EOS."""
    pad = id_map[_PAD]
    ids = [*id_map[_BOS], *pad]
    for phoneme in unicodedata.normalize("NFD", phonemes):
        known = id_map.get(phoneme)
        if known is not None:
            ids.extend(known)
            ids.extend(pad)
    ids.extend(id_map[_EOS])
    return ids


class PiperVoice:
    """One Piper voice: its config and ONNX session, loaded once per process."""

    _lock = threading.Lock()
    _loaded: ClassVar[dict[Path, PiperVoice]] = {}

    def __init__(self, model: Path, config: Path, threads: int) -> None:
        self.config = PiperConfig.read(config)
        self.sample_rate = self.config.sample_rate
        self._session: onnxruntime.InferenceSession = cpu_session(model, threads)
        names = {i.name for i in self._session.get_inputs()}
        if names != {"input", "input_lengths", "scales"}:
            raise ValueError(f"{model}: not a single-speaker Piper voice (inputs {names})")

    @classmethod
    def get(cls, model: Path, config: Path, threads: int) -> PiperVoice:
        with cls._lock:
            voice = cls._loaded.get(model)
            if voice is None:
                voice = cls._loaded[model] = PiperVoice(model, config, threads)
            return voice

    def synthesize(self, text: str, speed: float) -> npt.NDArray[np.int16]:
        """Mono 16-bit samples at ``sample_rate`` of ``text``; ``speed`` 2.0 is twice as fast."""
        clauses = Espeak.get().phonemize(text, self.config.espeak_voice)
        scales = np.array(
            [self.config.noise_scale, self.config.length_scale / speed, self.config.noise_w],
            dtype=np.float32,
        )
        silence = np.zeros(round(SENTENCE_SILENCE_SECONDS * self.sample_rate), dtype=np.int16)
        parts: list[npt.NDArray[np.int16]] = []
        for sentence in sentences(clauses):
            if not any(ch.isalpha() for ch in sentence):
                continue  # punctuation alone: nothing to say
            ids = phoneme_ids(sentence, self.config.phoneme_ids)
            audio = self._session.run(
                None,
                {
                    "input": np.array([ids], dtype=np.int64),
                    "input_lengths": np.array([len(ids)], dtype=np.int64),
                    "scales": scales,
                },
            )[0]
            samples = np.asarray(audio, dtype=np.float32).reshape(-1)
            peak = max(0.01, float(np.max(np.abs(samples))) if samples.size else 0.0)
            if parts:
                parts.append(silence)
            parts.append(np.clip(samples * (_MAX_INT16 / peak), -32768, 32767).astype(np.int16))
        if not parts:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(parts)
