"""Known sentences, speech made from them, and the word error rate of a transcript.

The round-trip tests and ``benchmarks/audio.py`` speak these with the text-to-speech model
and transcribe them back with the speech-to-text model.
"""

from __future__ import annotations

import io
import re
from typing import Any

import av
import numpy as np

SENTENCES: tuple[str, ...] = (
    "It was a bright cold day in April, and the clocks were striking thirteen.",
    "I would like a cup of coffee with milk and no sugar.",
    "The train to the city leaves at half past seven every morning.",
    "She opened the window and looked at the garden below.",
    "Please call me back when you get home tonight.",
    "We will meet at the library on Monday morning.",
    "The children played in the park until it was dark.",
    "He forgot his keys on the kitchen table again.",
    "Our team finished the project two days before the deadline.",
    "The doctor told him to drink more water and sleep well.",
    "My sister is learning to play the piano this year.",
    "The museum is closed on public holidays.",
    "Could you tell me the way to the nearest station?",
    "The price of bread has gone up again this month.",
    "They moved to a small house near the sea last summer.",
    "Turn left at the second corner and walk straight ahead.",
    "The meeting has been moved to Thursday afternoon.",
    "I read an interesting book about the history of the ocean.",
    "The cat is sleeping on the warm blanket by the fire.",
    "We need to buy eggs, rice and some fresh vegetables.",
    "The new bridge will open to traffic next spring.",
    "Thank you very much for your help with the move.",
)

_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("-", " "))


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edit distance in words, reference word count): the parts of a word error rate."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, ref_word in enumerate(ref, start=1):
        previous, row[0] = row[:], i
        for j, hyp_word in enumerate(hyp, start=1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word))
    return row[len(hyp)], len(ref)


def word_error_rate(reference: str, hypothesis: str) -> float:
    errors, total = word_errors(reference, hypothesis)
    return errors / max(1, total)


def transcode(data: bytes, container: str, codec: str, *, video: bool = False) -> bytes:
    """Re-encode the audio of ``data`` into ``container``/``codec``; with ``video``, add a
    small moving picture track, as a screen recording or phone video would have."""
    out = io.BytesIO()
    with av.open(io.BytesIO(data)) as source, av.open(out, "w", format=container) as sink:
        rate = 48000 if codec in ("libopus", "opus") else 44100
        stream: Any = sink.add_stream(codec, rate=rate, layout="mono")
        picture: Any = None
        if video:
            picture = sink.add_stream("mpeg4", rate=10)
            picture.width, picture.height, picture.pix_fmt = 64, 48, "yuv420p"
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=rate)
        seconds = 0.0
        for frame in source.decode(audio=0):
            seconds += frame.samples / frame.sample_rate
            frame.pts = None
            for chunk in resampler.resample(frame):
                chunk.pts = None
                sink.mux(stream.encode(chunk))
        for chunk in resampler.resample(None):
            chunk.pts = None
            sink.mux(stream.encode(chunk))
        sink.mux(stream.encode(None))
        if picture is not None:
            for index in range(int(seconds * 10)):
                pixels = np.full((48, 64, 3), index * 7 % 255, dtype=np.uint8)
                image = av.VideoFrame.from_ndarray(pixels, format="rgb24")
                image.pts = index
                sink.mux(picture.encode(image))
            sink.mux(picture.encode(None))
    return out.getvalue()
