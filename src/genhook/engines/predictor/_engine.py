"""The predictor engine: a ``genhook.model.Model`` (or a Cog predictor) behind the contract.

It runs in the worker process, in the worker's engine thread, like the built-in engines: the
class is instantiated and ``setup`` called once per worker process (at its first task or at
``--preload``), then ``predict`` once per task. Inputs reach ``predict`` decoded: pictures
under the worker's pixel limits (``decode_image``), other files as temporary files that are
removed after the call. Outputs become the task's outputs (pictures as PNG, files with their
content type) and its ``info`` (text and JSON-able dicts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import mimetypes
import pathlib
import tempfile
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from genhook.config import Settings
from genhook.engines.base import STOPPED_EARLY, EngineJob, EngineOutput, EngineResult
from genhook.engines.media.decode import check_pixel_budget, decode_image, normalize_mode
from genhook.engines.predictor._config import PredictorModel
from genhook.engines.predictor._signature import Kind, Param, file_format
from genhook.errors import ErrorCode, TaskFailure
from genhook.media import DecodeLimits
from genhook.model import Stopped, _reporter
from genhook.storage.blobs import CONTENT_TYPE_BY_EXTENSION

log = logging.getLogger(__name__)

# The longest part of a predictor's exception shown in the task's error message.
_MESSAGE_CHARS = 500


class PredictorEngine:
    """One predictor class, instantiated and set up once in this process."""

    def __init__(self, model: PredictorModel, settings: Settings) -> None:
        self.model = model
        self._settings = settings
        self.instance: Any = None

    def load(self) -> None:
        instance = self.model.cls()
        with contextlib.suppress(AttributeError):  # a class with __slots__ does without
            instance.device = self.device()
        setup = getattr(instance, "setup", None)
        if callable(setup):
            setup()
        self.instance = instance

    def device(self) -> str:
        """The entry's device; ``auto`` is the worker's ``--device``, else cuda when this
        machine has an NVIDIA device and torch, else cpu (torch is not imported to ask)."""
        device = self.model.entry.device
        if device != "auto":
            return device
        if self._settings.local_models_device != "auto":
            return self._settings.local_models_device
        import importlib.util

        if Path("/dev/nvidiactl").exists() and importlib.util.find_spec("torch") is not None:
            return "cuda"
        return "cpu"

    # --- one task ------------------------------------------------------------------------

    def run(self, job: EngineJob) -> EngineResult:
        job.stop_if_asked()
        with tempfile.TemporaryDirectory(prefix="genhook-predict-") as folder, _Opened() as opened:
            inputs = self.inputs(job, Path(folder), opened)
            with _reporting([job]):
                value = self._call(getattr(self.instance, self.model.method), inputs)
                return self.result(value, [job])

    def _call(self, method: Any, arguments: Any) -> Any:
        try:
            if isinstance(arguments, dict):
                return method(**arguments)
            return method(arguments)
        except (TaskFailure, Stopped):
            raise
        except Exception as exc:
            raise _failure(exc) from exc

    # --- batches -------------------------------------------------------------------------

    def batch_key(self, job: EngineJob) -> Hashable:
        """Any two tasks of the model may share a ``predict_batch`` call."""
        return self.model.id

    def run_batch(self, jobs: Sequence[EngineJob]) -> list[EngineResult | TaskFailure]:
        """One ``predict_batch`` call for the jobs whose inputs decode; a job whose inputs
        do not, or whose item the call answers with an exception, fails alone."""
        entries: list[EngineResult | TaskFailure | None] = [None] * len(jobs)
        with tempfile.TemporaryDirectory(prefix="genhook-predict-") as folder, _Opened() as opened:
            items: list[dict[str, Any]] = []
            ready: list[int] = []
            for index, job in enumerate(jobs):
                try:
                    job.stop_if_asked()
                    items.append(self.inputs(job, Path(folder) / str(index), opened))
                    ready.append(index)
                except TaskFailure as failure:
                    entries[index] = failure
            if ready:
                batch = [jobs[index] for index in ready]
                with _reporting(batch):
                    values = self._call(self.instance.predict_batch, items)
                    if not isinstance(values, Sequence) or len(values) != len(items):
                        raise ValueError(
                            f"predict_batch returned {type(values).__name__} for {len(items)} "
                            "items; it must return one output per item, in order"
                        )
                    for index, value in zip(ready, values, strict=True):
                        if isinstance(value, BaseException):
                            entries[index] = _failure(value)
                            continue
                        try:
                            entries[index] = self.result(value, [jobs[index]])
                        except TaskFailure as failure:
                            entries[index] = failure
        return [entry for entry in entries if entry is not None]

    # --- inputs --------------------------------------------------------------------------

    def inputs(self, job: EngineJob, folder: Path, opened: _Opened) -> dict[str, Any]:
        """``predict``'s arguments: the request's values, and its files (``job.images``, in
        parameter order) decoded or written to ``folder``."""
        params = job.params
        files = iter(job.images)
        arguments: dict[str, Any] = {}
        pictures: list[bytes] = []
        pending: list[tuple[Param, list[tuple[bytes, str]]]] = []
        for param in self.model.params:
            value = params.get(param.name, param.default)
            if not param.kind.is_file or value is None:
                arguments[param.name] = _scalar(param, value)
                continue
            briefs = list(value) if param.many else [value]
            taken = [(next(files), brief) for brief in briefs]
            if param.kind is Kind.IMAGE:
                pictures.extend(data for data, _ in taken)
            pending.append((param, taken))
        check_pixel_budget(pictures, self._settings.max_task_input_pixels)
        folder.mkdir(parents=True, exist_ok=True)
        number = 0
        for param, taken in pending:
            values: list[Any] = []
            for index, (data, brief) in enumerate(taken):
                label = f"{param.name}[{index}]" if param.many else param.name
                if param.kind is Kind.IMAGE:
                    number += 1
                    values.append(self._picture(data, number, label))
                else:
                    path = _write(folder, label, data, brief)
                    cls = param.cls or pathlib.Path
                    values.append(opened.open(path) if param.kind is Kind.OPEN_FILE else cls(path))
            arguments[param.name] = values if param.many else values[0]
        return arguments

    def _picture(self, data: bytes, number: int, label: str) -> Image.Image:
        settings = self._settings
        try:
            decoded = decode_image(
                data,
                number,
                max_pixels=settings.max_input_pixels,
                limits=DecodeLimits(
                    settings.max_input_pixels,
                    max_scans=settings.max_decode_scans,
                    max_chunks=settings.max_decode_chunks,
                ),
            )
        except TaskFailure as failure:
            raise TaskFailure(failure.code, f"{label}: {failure.message}") from None
        return decoded.image

    # --- outputs -------------------------------------------------------------------------

    def result(self, value: Any, jobs: list[EngineJob]) -> EngineResult:
        """The task's outputs and ``info`` from what ``predict`` returned; an iterator is
        collected item by item, each reported as a log line of the task's progress."""
        outputs: list[EngineOutput] = []
        info: dict[str, Any] = {}
        texts: list[str] = []
        if _iterates(value):
            for count, item in enumerate(value, start=1):
                self._collect(item, outputs, info, texts)
                shown = item if isinstance(item, str) else f"output {count}"
                for job in jobs:
                    job.report(log=shown[:200])
                if all(job.given_up() for job in jobs):
                    raise TaskFailure(ErrorCode.ENGINE_ERROR, STOPPED_EARLY)
        else:
            self._collect(value, outputs, info, texts)
        if texts:
            joined = "".join(texts) if self.model.outcome.concatenates else None
            info["output"] = (
                joined if joined is not None else (texts[0] if len(texts) == 1 else texts)
            )
        try:
            json.dumps(info)
        except (TypeError, ValueError) as exc:
            raise TaskFailure(
                ErrorCode.ENGINE_ERROR, f"predict returned a dict that is not JSON: {exc}"
            ) from None
        return EngineResult(outputs=outputs, info=info)

    def _collect(
        self, value: Any, outputs: list[EngineOutput], info: dict[str, Any], texts: list[str]
    ) -> None:
        if value is None:
            return
        if isinstance(value, Image.Image):
            outputs.append(_picture_output(value))
        elif isinstance(value, pathlib.PurePath):
            outputs.append(_file_output(Path(value)))
        elif isinstance(value, bytes | bytearray | memoryview):
            outputs.append(self._bytes_output(bytes(value)))
        elif isinstance(value, io.IOBase):
            with value:
                outputs.append(self._bytes_output(value.read()))
        elif isinstance(value, str):
            texts.append(value)
        elif isinstance(value, dict):
            info.update(value)
        elif isinstance(value, bool | int | float):
            info["output"] = value
        elif isinstance(value, list | tuple) or _iterates(value):
            for item in value:
                self._collect(item, outputs, info, texts)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            info.update(dataclasses.asdict(value))
        elif callable(getattr(value, "model_dump", None)):
            info.update(value.model_dump(mode="json"))
        else:
            raise TaskFailure(
                ErrorCode.ENGINE_ERROR,
                f"predict returned a {type(value).__name__}, which is not an output: return a "
                "PIL image, a Path, bytes, str, a dict, or a list of them",
            )

    def _bytes_output(self, data: bytes) -> EngineOutput:
        """Bytes of the declared type (one the blob stores know), else typed by sniffing."""
        declared = self.model.outcome.content_type
        if declared is not None and declared in CONTENT_TYPE_BY_EXTENSION.values():
            return EngineOutput(data, declared)
        return EngineOutput(data, file_format(data, declared or "")[1])


def _scalar(param: Param, value: Any) -> Any:
    if value is None:
        return None
    if param.kind is Kind.SECRET and param.cls is not None:
        return [param.cls(v) for v in value] if param.many else param.cls(value)
    if param.kind is Kind.FLOAT:
        return [float(v) for v in value] if param.many else float(value)
    return value


def _write(folder: Path, label: str, data: bytes, brief: str) -> Path:
    """A file input as a temporary file named after its field, with its type's extension
    (from the bytes, the data URL's type, or the URL's path)."""
    declared = brief[5:] if brief.startswith("data:") else (mimetypes.guess_type(brief)[0] or "")
    extension, _ = file_format(data, declared)
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in label)
    path = folder / f"{name}.{extension}"
    path.write_bytes(data)
    return path


def _picture_output(image: Image.Image) -> EngineOutput:
    from genhook.engines.media.output import encode

    if image.mode not in ("RGB", "RGBA", "L"):
        image = normalize_mode(image)
    data, content_type = encode(image, "png", fast=False)
    return EngineOutput(data, content_type)


def _file_output(path: Path) -> EngineOutput:
    """A returned file's bytes, typed by its extension (else its bytes); a file in the
    temporary directory is removed once read, so a long-running worker does not fill it."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TaskFailure(
            ErrorCode.ENGINE_ERROR, f"predict returned {path}, which cannot be read: {exc.strerror}"
        ) from None
    content_type = CONTENT_TYPE_BY_EXTENSION.get(path.suffix.lower()) or file_format(data)[1]
    with contextlib.suppress(OSError, ValueError):
        if path.resolve().is_relative_to(Path(tempfile.gettempdir()).resolve()):
            path.unlink()
    return EngineOutput(data, content_type)


def _iterates(value: Any) -> bool:
    return isinstance(value, Iterator)


def _failure(exc: BaseException) -> TaskFailure:
    if isinstance(exc, TaskFailure):
        return exc
    if isinstance(exc, Stopped):
        return TaskFailure(ErrorCode.ENGINE_ERROR, STOPPED_EARLY)
    log.error("predict raised", exc_info=exc)
    text = f"{type(exc).__name__}: {exc}"
    return TaskFailure(ErrorCode.ENGINE_ERROR, f"predict failed: {text[:_MESSAGE_CHARS]}")


class _Opened(contextlib.ExitStack):
    """Files opened for ``cog.File`` inputs, closed after the call."""

    def open(self, path: Path) -> io.BufferedReader:
        return self.enter_context(path.open("rb"))


@contextlib.contextmanager
def _reporting(jobs: list[EngineJob]) -> Iterator[None]:
    """Route ``Model.progress`` in this thread to ``jobs``; it answers whether all were
    given up. ``Stopped`` raised by it ends the call as a stopped one."""

    def report(fraction: float | None, line: str | None) -> bool:
        if fraction is not None or line is not None:
            value = None if fraction is None else min(1.0, max(0.0, float(fraction)))
            for job in jobs:
                job.report(progress=value, log=line)
        return all(job.given_up() for job in jobs)

    token = _reporter.set(report)
    try:
        yield
    except Stopped:
        raise TaskFailure(ErrorCode.ENGINE_ERROR, STOPPED_EARLY) from None
    finally:
        _reporter.reset(token)
