"""Which errors are the service's own infrastructure faults (503, requeue) and which are not."""

from __future__ import annotations

import errno

import asyncpg
import pytest
from sqlalchemy import exc

from genhook.faults import is_infrastructure_error


class _DriverAdapterError(Exception):
    """Stands where SQLAlchemy's asyncpg adapter puts its own error class."""


def _wrapped(inner: BaseException) -> exc.DBAPIError:
    try:
        try:
            raise inner
        except Exception as error:
            raise _DriverAdapterError("adapted") from error
    except _DriverAdapterError as adapted:
        return exc.DBAPIError("INSERT ...", {}, adapted)


@pytest.mark.parametrize(
    "error",
    [
        _wrapped(asyncpg.exceptions.CannotConnectNowError("the database system is shutting down")),
        _wrapped(asyncpg.exceptions.AdminShutdownError("terminating connection")),
        exc.TimeoutError("QueuePool limit reached"),
        OSError(errno.ENOSPC, "No space left on device"),
        ConnectionResetError(),
    ],
)
def test_infrastructure_faults(error: BaseException) -> None:
    assert is_infrastructure_error(error)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("a bug"),
        _wrapped(asyncpg.exceptions.UniqueViolationError("duplicate key")),
        _wrapped(ValueError("a bug below the driver")),
    ],
)
def test_other_errors_are_not(error: BaseException) -> None:
    assert not is_infrastructure_error(error)
