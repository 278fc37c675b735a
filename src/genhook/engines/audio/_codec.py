"""Encoding speech with PyAV (its wheel carries the codecs) and decoding input audio under caps.

The decoder never trusts a header: it refuses absurd sample rates and channel counts before
decoding, and counts decoded samples as it goes, so a small file that would expand into hours
of audio (a decoder bomb) is refused after at most the duration cap's worth of work.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import av
import av.error
import numpy as np
import numpy.typing as npt

from genhook.errors import ErrorCode, TaskFailure

# output_format -> (container, codec, sample format, content type)
ENCODINGS: dict[str, tuple[str, str, str, str]] = {
    "mp3": ("mp3", "libmp3lame", "s16p", "audio/mpeg"),
    "wav": ("wav", "pcm_s16le", "s16", "audio/wav"),
    "ogg": ("ogg", "libopus", "s16", "audio/ogg"),
    "flac": ("flac", "flac", "s16", "audio/flac"),
}

STT_SAMPLE_RATE = 16_000
MAX_INPUT_SAMPLE_RATE = 384_000
MAX_INPUT_CHANNELS = 32
# A stream that declares this much more than it decodes was cut short.
_TRUNCATION_SLACK = 0.9


def encode(samples: npt.NDArray[np.int16], rate: int, fmt: str, out_rate: int) -> bytes:
    """Mono 16-bit ``samples`` at ``rate`` as a complete ``fmt`` file at ``out_rate``."""
    container_name, codec, sample_format, _ = ENCODINGS[fmt]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_name) as container:
        stream = container.add_stream(codec, rate=out_rate, layout="mono")
        assert isinstance(stream, av.AudioStream)
        stream.format = sample_format
        resampler = av.AudioResampler(format=sample_format, layout="mono", rate=out_rate)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        frame.pts = None
        for chunk in [*resampler.resample(frame), *resampler.resample(None)]:
            chunk.pts = None
            for packet in stream.encode(chunk):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


@dataclass(frozen=True, slots=True)
class DecodedAudio:
    samples: npt.NDArray[np.float32]  # mono, STT_SAMPLE_RATE
    source_format: str
    source_sample_rate: int
    source_channels: int

    @property
    def duration(self) -> float:
        return len(self.samples) / STT_SAMPLE_RATE


def decode_for_speech(data: bytes, max_seconds: float) -> DecodedAudio:
    """Decode the first audio track of ``data`` to 16 kHz mono float samples.

    Raises ``TaskFailure`` for input that is not audio, is corrupt or truncated, has
    absurd parameters, or is longer than ``max_seconds``.
    """
    if _wav_cut_short(data):
        raise TaskFailure(
            ErrorCode.INPUT_CORRUPT, "audio: the file is truncated (its data chunk is cut short)"
        )
    try:
        container = av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except (av.error.FFmpegError, UnicodeDecodeError, ValueError):
        raise TaskFailure(
            ErrorCode.INPUT_UNSUPPORTED_FORMAT,
            "audio: the file is not audio or video in a format the service reads",
        ) from None
    with container:
        streams = container.streams.audio
        if not streams:
            raise TaskFailure(
                ErrorCode.INPUT_UNSUPPORTED_FORMAT, "audio: the file has no audio track"
            )
        stream = streams[0]
        rate = stream.codec_context.sample_rate or 0
        channels = stream.codec_context.channels or 0
        if not 0 < rate <= MAX_INPUT_SAMPLE_RATE or not 0 < channels <= MAX_INPUT_CHANNELS:
            raise TaskFailure(
                ErrorCode.INPUT_CORRUPT,
                f"audio: the track declares {rate} Hz and {channels} channel(s); the service "
                f"reads up to {MAX_INPUT_SAMPLE_RATE} Hz and {MAX_INPUT_CHANNELS} channels",
            )
        declared = _declared_seconds(container, stream)
        if declared is not None and declared > max_seconds:
            raise _too_long(max_seconds, declared)
        limit = int(max_seconds * STT_SAMPLE_RATE)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=STT_SAMPLE_RATE)
        parts: list[npt.NDArray[np.float32]] = []
        total = 0
        try:
            for frame in container.decode(stream):
                if frame.sample_rate > MAX_INPUT_SAMPLE_RATE or frame.samples > rate * 60:
                    raise TaskFailure(
                        ErrorCode.INPUT_CORRUPT, "audio: a frame has impossible parameters"
                    )
                frame.pts = None
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().reshape(-1).astype(np.float32, copy=False)
                    parts.append(chunk)
                    total += len(chunk)
                if total > limit:
                    raise _too_long(max_seconds, None)
            for out in resampler.resample(None):
                parts.append(out.to_ndarray().reshape(-1).astype(np.float32, copy=False))
        except av.error.FFmpegError:
            raise TaskFailure(
                ErrorCode.INPUT_CORRUPT, "audio: the file is truncated or cannot be decoded"
            ) from None
        source_format = container.format.name
    samples = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    if len(samples) > limit:
        raise _too_long(max_seconds, None)
    if len(samples) == 0:
        raise TaskFailure(ErrorCode.INPUT_CORRUPT, "audio: the file holds no decodable audio")
    decoded = len(samples) / STT_SAMPLE_RATE
    if declared is not None and declared > 1.0 and decoded < declared * _TRUNCATION_SLACK:
        raise TaskFailure(
            ErrorCode.INPUT_CORRUPT,
            f"audio: the file is truncated ({decoded:.1f} s of the {declared:.1f} s it declares)",
        )
    if not np.all(np.isfinite(samples)):
        raise TaskFailure(ErrorCode.INPUT_CORRUPT, "audio: the track decodes to invalid samples")
    return DecodedAudio(samples, source_format, rate, channels)


def declared_seconds(data: bytes) -> float | None:
    """How long the recording ``data`` says it is, from its container's header alone (no
    decoding), or None when it does not say or is not audio the service reads."""
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            streams = container.streams.audio
            return _declared_seconds(container, streams[0]) if streams else None
    except (av.error.FFmpegError, UnicodeDecodeError, ValueError):
        return None


def _wav_cut_short(data: bytes) -> bool:
    """True when a WAV file's data chunk declares more bytes than the file holds.

    FFmpeg estimates a WAV's duration from the file size, so a cut-off file would otherwise
    decode as a shorter, complete recording.
    """
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return False
    offset = 12
    while offset + 8 <= len(data):
        chunk, size = (
            data[offset : offset + 4],
            int.from_bytes(data[offset + 4 : offset + 8], "little"),
        )
        if chunk == b"data":
            # 0 and 0xFFFFFFFF mark a streamed WAV of unknown length.
            return size not in (0, 0xFFFFFFFF) and offset + 8 + size > len(data)
        offset += 8 + size + (size & 1)
    return False


def _declared_seconds(
    container: av.container.InputContainer, stream: av.AudioStream
) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return None


def _too_long(max_seconds: float, declared: float | None) -> TaskFailure:
    length = f" ({declared:.1f} s)" if declared is not None else ""
    return TaskFailure(
        ErrorCode.INPUT_AUDIO_TOO_LONG,
        f"audio: the recording is longer{length} than the {max_seconds:g}-second limit",
    )
