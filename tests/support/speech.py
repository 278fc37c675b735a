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

# The round trip of ``benchmarks/audio.py``: numbers, names and punctuation, as real text has.
ROUND_TRIP_SENTENCES: tuple[str, ...] = (
    "Dr. Smith will see you at 10 o'clock on Tuesday.",
    "Maria, could you send the report to Peter before Friday?",
    "The package weighs 12 kilograms and costs 45 dollars.",
    "Flight 815 to London leaves from gate 22.",
    "Wait! Did you really drive 300 miles yesterday?",
    "John and Sarah moved to Chicago in 2019.",
    "Our office is on the 4th floor, next to the elevator.",
    "Please read chapters 3, 4 and 5 before the exam.",
    "Emma said: the train was late again this morning.",
    "The temperature dropped to minus 5 degrees last night.",
    "Call me at home; I will be there after 6.",
    "Professor Lee teaches physics at the university in Boston.",
    "We sold 250 tickets for the concert on Saturday.",
    "Is this the road to Madrid, or did we take a wrong turn?",
    "Thomas bought 3 apples, 2 pears and a melon.",
    "The bank opens at 9 and closes at 5.",
    "Anna's birthday party is on the 14th of July.",
    "Hello, my name is David, and I work in sales.",
    "The museum in Paris has more than 35 thousand paintings.",
    "Turn off the lights, lock the door, and go to sleep.",
    "Mr. Brown paid 20 dollars for a taxi to the airport.",
    "Sophie, are you coming to the meeting at noon?",
    "The river is 400 kilometers long and very deep.",
    "Michael plays the guitar in a band called The Rivers.",
    "Yes, the store on Main Street is open until 10.",
    "Our team won the game 3 to 1 in the final minute!",
    "Kate flew from Tokyo to Sydney with her brother Sam.",
    "Add 2 cups of flour, 1 egg and a little milk.",
    "The library will be closed from Monday to Wednesday.",
    "Robert works at a hospital in Seattle as a nurse.",
    "There are 7 days in a week and 12 months in a year.",
    "Lucy asked: where did you park the car, Tom?",
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
