"""Benchmark of the two audio models on the CPU.

- Text-to-speech real-time factor: seconds of speech produced per second of CPU, for the
  known sentences spoken as one text and encoded to MP3 (synthesis and encoding included),
  for the Piper voice (``joe``, the default, its ONNX session on one thread) and eSpeak NG
  (``en-us``) side by side.
- Speech-to-text real-time factor on 30 s of speech (WAV, decoding included), with the
  default model: seconds of audio transcribed per second of wall time, by 1 and by 2 worker
  processes (multiprocessing, spawn, one model per process and the cores shared among them,
  as ``genhook serve`` runs it), and per second of CPU; greedy (the default) and 5 beams.
- Round-trip word error rate: every known sentence spoken, then transcribed back, alone and
  all together; the known sentences and 32 more with numbers, names and punctuation
  (``ROUND_TRIP_SENTENCES``), for each voice side by side.

    .venv/bin/python benchmarks/audio.py                 # everything
    .venv/bin/python benchmarks/audio.py --reps 4 --json out.json
    .venv/bin/python benchmarks/audio.py --skip-stt --beams 1   # the voices only
    .venv/bin/python benchmarks/audio.py --detection --reps 5  # language detection's cost

- Language detection (``--detection``): an English clip (one sentence, and the 30 s one)
  transcribed with ``language`` ``en`` (tiny.en alone, as before detection existed) and
  ``auto`` (Whisper base detects the language, then tiny.en), alternately in one process
  with both models loaded; wall and CPU seconds, median of ``--reps``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.speech import ROUND_TRIP_SENTENCES, SENTENCES, word_errors

from genhook.config import Settings
from genhook.engines.audio._stt import SpeechToTextEngine
from genhook.engines.audio._tts import TextToSpeechEngine
from genhook.engines.base import EngineJob

TARGET_SECONDS = 30.0
VOICES = ("joe", "en-us")  # Piper, eSpeak NG


def speak(
    engine: TextToSpeechEngine, text: str, fmt: str = "wav", voice: str = "joe"
) -> tuple[bytes, float]:
    params = {
        "prompt": text,
        "voice": voice,
        "output_format": fmt,
        "sample_rate": 16000 if fmt == "wav" else 24000,
    }
    result = engine.run(EngineJob("bench", "genhook/text-to-speech", params, []))
    return result.outputs[0].data, float(result.info["duration_seconds"])


def thirty_seconds(engine: TextToSpeechEngine) -> tuple[bytes, float]:
    """About 30 s of speech (eSpeak NG, as in earlier runs): as many sentences as fit."""
    chosen: list[str] = []
    for sentence in SENTENCES * 2:
        trial = " ".join([*chosen, sentence])
        if speak(engine, trial, voice="en-us")[1] > TARGET_SECONDS:
            break
        chosen.append(sentence)
    return speak(engine, " ".join(chosen), voice="en-us")


def bench_tts(engine: TextToSpeechEngine, reps: int, voice: str) -> dict[str, Any]:
    text = " ".join(SENTENCES)
    speak(engine, text, "mp3", voice)  # warm-up
    audio = cpu = wall = 0.0
    for _ in range(reps):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        _, seconds = speak(engine, text, "mp3", voice)
        cpu += time.process_time() - cpu0
        wall += time.perf_counter() - wall0
        audio += seconds
    return {
        "voice": voice,
        "audio_seconds": audio,
        "cpu_seconds": cpu,
        "rtf_cpu": audio / cpu,
        "rtf_wall": audio / wall,
    }


def _stt_worker(
    workers: int, beam: int, data: bytes, reps: int, start: Any, out: Queue[Any]
) -> None:
    engine = SpeechToTextEngine(Settings(workers=workers, stt_beam_size=beam))
    engine.load()
    start.wait()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    audio = 0.0
    for _ in range(reps):
        result = engine.run(
            EngineJob("bench", "genhook/speech-to-text", {"language": "en"}, [data])
        )
        assert result.stt_result is not None
        audio += result.stt_result["duration"]
    out.put((audio, time.process_time() - cpu0, time.perf_counter() - wall0))


def bench_stt(data: bytes, workers: int, beam: int, reps: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    out: Queue[Any] = ctx.Queue()
    procs = [
        ctx.Process(target=_stt_worker, args=(workers, beam, data, reps, start, out))
        for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    try:
        time.sleep(0.5)
        results = []
        start.set()
        for _ in procs:
            results.append(out.get(timeout=600))
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    audio = sum(r[0] for r in results)
    cpu = sum(r[1] for r in results)
    wall = max(r[2] for r in results)
    return {
        "workers": workers,
        "beam": beam,
        "audio_seconds": audio,
        "wall_seconds": wall,
        "rtf_wall": audio / wall,
        "rtf_cpu": audio / cpu,
    }


def bench_wer(
    tts: TextToSpeechEngine, stt: SpeechToTextEngine, voice: str, sentences: tuple[str, ...]
) -> dict[str, Any]:
    errors = total = 0
    worst: list[tuple[float, str, str]] = []
    for sentence in sentences:
        data, _ = speak(tts, sentence, voice=voice)
        result = stt.run(EngineJob("bench", "genhook/speech-to-text", {"language": "en"}, [data]))
        assert result.stt_result is not None
        e, n = word_errors(sentence, result.stt_result["text"])
        errors, total = errors + e, total + n
        worst.append((e / n, sentence, result.stt_result["text"]))
    text = " ".join(sentences)
    data, _ = speak(tts, text, voice=voice)
    joined = stt.run(EngineJob("bench", "genhook/speech-to-text", {"language": "en"}, [data]))
    assert joined.stt_result is not None
    je, jn = word_errors(text, joined.stt_result["text"])
    worst.sort(reverse=True)
    return {
        "voice": voice,
        "sentences": len(sentences),
        "words": total,
        "wer_each": errors / total,
        "wer_joined": je / jn,
        "worst": [{"said": s, "heard": h} for _, s, h in worst[:3]],
    }


def round_trips(tts: TextToSpeechEngine, beam: int) -> list[dict[str, Any]]:
    stt = SpeechToTextEngine(Settings(workers=1, stt_beam_size=beam, stt_max_duration_seconds=600))
    stt.load()
    rows = []
    for name, sentences in (("plain", SENTENCES), ("numbers, names", ROUND_TRIP_SENTENCES)):
        for voice in VOICES:
            row = {"set": name, "beam": beam, **bench_wer(tts, stt, voice, sentences)}
            print("round trip:", json.dumps(row), flush=True)
            rows.append(row)
    return rows


def bench_detection(tts: TextToSpeechEngine, reps: int) -> list[dict[str, Any]]:
    """The latency ``language: auto`` adds to English speech: the same clip with ``en`` and
    with ``auto``, alternately, after one warm-up of each (which loads both models)."""
    import statistics
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as data_dir:
        stt = SpeechToTextEngine(Settings(workers=1, data_dir=Path(data_dir)))
        stt.load()
        short = speak(tts, SENTENCES[5], voice="en-us")[0]
        clips = [("one sentence", short), ("30 s", thirty_seconds(tts)[0])]
        for name, clip in clips:
            times: dict[str, list[tuple[float, float]]] = {"en": [], "auto": []}
            for rep in range(reps + 1):
                for language in ("en", "auto"):
                    wall, cpu = time.perf_counter(), time.process_time()
                    result = stt.run(
                        EngineJob("b", "genhook/speech-to-text", {"language": language}, [clip])
                    )
                    spent = (time.perf_counter() - wall, time.process_time() - cpu)
                    assert result.info["model"] == "tiny.en", result.info
                    if rep:  # the first round loads the models
                        times[language].append(spent)
            row: dict[str, Any] = {"clip": name, "seconds": result.info["duration_seconds"]}
            for language, spent_list in times.items():
                row[f"{language}_wall_s"] = round(statistics.median(w for w, _ in spent_list), 3)
                row[f"{language}_cpu_s"] = round(statistics.median(c for _, c in spent_list), 3)
            row["added_wall_s"] = round(row["auto_wall_s"] - row["en_wall_s"], 3)
            row["added_cpu_s"] = round(row["auto_cpu_s"] - row["en_cpu_s"], 3)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--reps", type=int, default=2, help="transcriptions of the 30 s clip per worker"
    )
    parser.add_argument("--beams", default="1,5", help="GENHOOK_STT_BEAM_SIZE values to run")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--skip-stt", action="store_true", help="leave out the speech-to-text speed figures"
    )
    parser.add_argument(
        "--detection", action="store_true", help="only the cost of detecting the language"
    )
    args = parser.parse_args()
    print(f"cpu cores: {os.cpu_count()}, load average: {os.getloadavg()}")
    if args.detection:
        voice = TextToSpeechEngine(Settings(workers=1))
        voice.load()
        for row in bench_detection(voice, args.reps):
            print("detection:", json.dumps(row), flush=True)
        print(f"load average after: {os.getloadavg()}")
        return
    # One ONNX Runtime thread for the Piper voice: its real-time factor per core.
    tts = TextToSpeechEngine(Settings(workers=os.cpu_count() or 1))
    tts.load()
    figures: dict[str, Any] = {"tts": [bench_tts(tts, max(3, args.reps), v) for v in VOICES]}
    for row in figures["tts"]:
        print("text-to-speech:", json.dumps(row), flush=True)
    beams = [int(b) for b in args.beams.split(",")]
    if not args.skip_stt:
        clip, seconds = thirty_seconds(tts)
        print(f"speech-to-text clip: {seconds:.1f} s of speech")
        figures["stt"] = [
            bench_stt(clip, workers, beam, args.reps) for beam in beams for workers in (1, 2)
        ]
        for row in figures["stt"]:
            print("speech-to-text:", json.dumps(row))
    figures["round_trip"] = [row for beam in beams for row in round_trips(tts, beam)]
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
