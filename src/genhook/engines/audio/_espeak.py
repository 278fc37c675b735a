"""A ctypes binding to eSpeak NG from the ``espeakng-loader`` wheel (library and voice data).

eSpeak NG keeps global state, so one lock serialises every synthesis in the process.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from genhook.engines.audio._voices import data_path

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_CHARS_UTF8 = 1
_POS_CHARACTER = 1
_PARAM_RATE = 1
_EE_OK = 0
# espeak_TextToPhonemes: phonemes as IPA (UTF-8), as Piper's voices were trained on.
_PHONEMES_IPA = 0x02
# Words per minute at speed 1.0: a calm reading pace Whisper transcribes well.
BASE_RATE_WPM = 150

CLAUSE_MARKS = ".,?!:;"
_CLOSERS = " \t\r\n\"')]}\u00bb\u201d\u2019"

_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


class Espeak:
    """The process's one eSpeak NG instance."""

    _lock = threading.Lock()
    _instance: Espeak | None = None

    def __init__(self) -> None:
        import espeakng_loader

        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_TextToPhonemes.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, str(data_path()).encode(), 0)
        if rate <= 0:
            raise RuntimeError("eSpeak NG failed to initialise")
        self.sample_rate = int(rate)
        self._lib = lib
        self._chunks: list[npt.NDArray[np.int16]] = []
        self._callback = _CALLBACK(self._collect)  # kept alive as long as the library uses it
        lib.espeak_SetSynthCallback(self._callback)

    @classmethod
    def get(cls) -> Espeak:
        with cls._lock:
            if cls._instance is None:
                cls._instance = Espeak()
            return cls._instance

    def _collect(self, wav: Any, count: int, _events: Any) -> int:
        if count > 0 and wav:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
        return 0

    def synthesize(self, text: str, voice: str, speed: float) -> npt.NDArray[np.int16]:
        """Mono 16-bit samples at ``sample_rate`` of ``text`` spoken by ``voice``."""
        data = text.encode("utf-8")
        with self._lock:
            self._chunks = []
            if self._lib.espeak_SetVoiceByName(voice.encode("ascii")) != _EE_OK:
                raise ValueError(f"eSpeak NG has no voice {voice!r}")
            self._lib.espeak_SetParameter(_PARAM_RATE, round(BASE_RATE_WPM * speed), 0)
            status = self._lib.espeak_Synth(
                data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
            )
            self._lib.espeak_Synchronize()
            chunks, self._chunks = self._chunks, []
        if status != _EE_OK:
            raise RuntimeError(f"eSpeak NG synthesis failed with status {status}")
        if not chunks:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(chunks)

    def phonemize(self, text: str, voice: str) -> list[tuple[str, str]]:
        """``text`` as eSpeak NG's IPA phonemes, clause by clause, for a Piper voice.

        Each item is a clause's phonemes and the punctuation that ended it (``.``, ``,``,
        ``?``, ``!``, ``:``, ``;`` or ``""``). The library returns a clause per call and
        moves the text pointer past it, so the punctuation is the last mark before the word
        it read ahead into.
        """
        data = text.encode("utf-8")
        buffer = ctypes.create_string_buffer(data)
        base = ctypes.addressof(buffer)
        pointer = ctypes.c_void_p(base)
        clauses: list[tuple[str, str]] = []
        with self._lock:
            if self._lib.espeak_SetVoiceByName(voice.encode("ascii")) != _EE_OK:
                raise ValueError(f"eSpeak NG has no voice {voice!r}")
            start = 0
            while pointer.value:
                phonemes = self._lib.espeak_TextToPhonemes(
                    ctypes.byref(pointer), _CHARS_UTF8, _PHONEMES_IPA
                )
                end = pointer.value - base if pointer.value else len(data)
                clauses.append(((phonemes or b"").decode("utf-8", "ignore"), ""))
                read = data[start:end].decode("utf-8", "ignore")
                if pointer.value:
                    # The library reads ahead into the next clause's first word.
                    read = read[: max(read.rfind(" "), read.rfind("\n"), 0)]
                read = read.rstrip(_CLOSERS)
                start = end
                if read and read[-1] in CLAUSE_MARKS:
                    clauses[-1] = (clauses[-1][0], read[-1])
        return clauses
