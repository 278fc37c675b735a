"""Logging: one line per event, plain text or JSON (``GENHOOK_LOG_FORMAT``).

A JSON line carries the time, level, logger, message, the process's role and pid, and the
task, delivery and account it concerns when known: a worker binds them while it works on a
task and a dispatcher's sender while it sends an attempt (context variables, so every line
logged meanwhile, in any module, carries them), and ``extra=`` fields are added as they
are. A traceback is one field, so a log collector never splits an event across lines.
uvicorn's loggers go through the same handler.

A fault of the service's own infrastructure (a full disk, a database restart) is expected
and retried: a warning or error about one is logged as one line naming the cause, without
a traceback, and repeats of it are folded, one line per cause every ``FOLD_SECONDS`` with a
count of those left out (``FaultFolding``), so an outage cannot flood the disk it is on.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genhook.config import Settings
    from genhook.sender.queue import Outgoing as Attempt

# (task id, delivery id, account id) of the work in hand, or None where there is none.
_Ids = tuple[str | None, str | None, str | None]
_CONTEXT: ContextVar[_Ids | None] = ContextVar("genhook_log_context", default=None)
_FIELDS = ("task_id", "delivery_id", "account_id")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s%(ids)s"

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "ids", "role", "fold", *_FIELDS}
)


def bind_task(task_id: str, account_id: str | None = None) -> Token[_Ids | None]:
    """Tag what is logged from here on (and in tasks and threads started from here) with a
    task; give the token to ``unbind`` when the work ends."""
    return _CONTEXT.set((task_id, None, account_id))


def bind_delivery(attempt: Attempt) -> Token[_Ids | None]:
    return _CONTEXT.set((attempt.task_id, attempt.id, attempt.account_id or None))


def unbind(token: Token[_Ids | None]) -> None:
    _CONTEXT.reset(token)


class _ContextFilter(logging.Filter):
    """Puts the bound ids on each record, unless ``extra=`` already named them."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = self.role
        ids = _CONTEXT.get()
        for name, value in zip(_FIELDS, ids or (None, None, None), strict=True):
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


# Seconds between two lines about the same infrastructure fault.
FOLD_SECONDS = 5.0
# ``extra=`` of a warning repeated for as long as a condition lasts (a readiness probe that
# keeps failing): folded like a fault's, whatever its arguments.
FOLD = {"fold": True}


def _fault_of(record: logging.LogRecord) -> BaseException | str | None:
    """The infrastructure error a record is about (its exception, or one of its arguments),
    or ``fold`` for a record logged with ``extra=FOLD``."""
    if getattr(record, "fold", False):
        return "fold"
    candidates: list[Any] = []
    if record.exc_info and record.exc_info[1] is not None:
        candidates.append(record.exc_info[1])
    args = record.args if isinstance(record.args, tuple) else ()
    candidates += [arg for arg in args if isinstance(arg, BaseException)]
    if not candidates:
        return None
    from genhook.faults import is_infrastructure_error  # not for the supervisor's own lines

    return next((error for error in candidates if is_infrastructure_error(error)), None)


class FaultFolding(logging.Filter):
    """One line per infrastructure fault cause every ``interval`` seconds, without its
    traceback; the next line says how many like it were left out meanwhile."""

    def __init__(self, interval: float = FOLD_SECONDS) -> None:
        super().__init__()
        self.interval = interval
        self._last: dict[tuple[str, str, str], float] = {}
        self._folded: dict[tuple[str, str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        error = _fault_of(record)
        if error is None:
            return True
        from genhook.faults import describe

        cause = error if isinstance(error, str) else describe(error)
        key = (record.name, str(record.msg), cause)
        now = time.monotonic()
        if now - self._last.get(key, -self.interval) < self.interval:
            self._folded[key] = self._folded.get(key, 0) + 1
            return False
        self._last[key] = now
        if record.exc_info:  # an expected fault: its cause, not its traceback
            record.msg = f"{record.msg} ({cause})"
            record.exc_info = None
            record.exc_text = None
        elif isinstance(record.args, tuple):  # the cause in one line, not SQLAlchemy's text
            record.args = tuple(cause if arg is error else arg for arg in record.args)
        folded = self._folded.pop(key, 0)
        if folded:
            record.msg = f"{record.msg} ({folded} more like this in the last {self.interval:g} s)"
        return True


class TextFormatter(logging.Formatter):
    """The plain format, with the ids of the work in hand appended when known."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        known = [f"{name}={getattr(record, name)}" for name in _FIELDS if _get(record, name)]
        record.ids = f" [{' '.join(known)}]" if known else ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "role": getattr(record, "role", None),
            "pid": record.process,
            "process": record.processName,
        }
        for name in _FIELDS:
            value = _get(record, name)
            if value is not None:
                line[name] = value
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _get(record: logging.LogRecord, name: str) -> Any:
    return getattr(record, name, None)


def configure_logging(settings: Settings, role: str = "serve") -> None:
    """Send every logger's lines, uvicorn's included, to standard error in the configured
    format, tagged with ``role``; replaces whatever handlers were set before."""
    handler = logging.StreamHandler(sys.stderr)
    json_lines = settings.log_format == "json"
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    handler.addFilter(_ContextFilter(role))
    handler.addFilter(FaultFolding())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(settings.log_level.upper())
    logging.captureWarnings(True)  # a library's warning is a log line too
    # uvicorn installs handlers of its own unless started with ``log_config=None``; either
    # way its records reach this one.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True
        # An earlier server or dictConfig in this process may have left a level or switched
        # it off; the root's level and handler decide from here.
        logger.setLevel(logging.NOTSET)
        logger.disabled = False
