"""Blobs in an S3-compatible bucket (AWS S3, MinIO, Ceph, R2 ...), through aiobotocore.

API and worker processes on different machines then share no disk: inputs and outputs live
in the bucket. Credentials come from the standard AWS chain (``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, the shared config files, instance roles).

Every failure of the bucket itself (unreachable, timing out, a 5xx, refused credentials) is
raised as ``StorageUnavailable``, which the service treats as its own infrastructure fault:
503 with ``Retry-After`` on requests, retry then requeue in workers. A missing object is
``None``, as for every blob store.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from genhook.config import Settings
from genhook.faults import StorageUnavailable
from genhook.storage.blobs import BlobInfo, content_type_of, valid_key

# Bytes read from the bucket per chunk of a streamed output.
STREAM_CHUNK_BYTES = 256 * 1024
_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})


@dataclass(frozen=True, slots=True)
class S3Location:
    bucket: str
    prefix: str

    def object_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key


def parse_s3_url(url: str) -> S3Location:
    """``s3://bucket/prefix`` into its parts; ValueError names what is wrong."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"expected s3://bucket/prefix, got {url!r}")
    return S3Location(parts.netloc, parts.path.strip("/"))


def _missing(error: ClientError) -> bool:
    return str(error.response.get("Error", {}).get("Code", "")) in _MISSING


@contextlib.contextmanager
def _bucket_faults(what: str) -> Iterator[None]:
    """Turn the bucket's own failures into ``StorageUnavailable``."""
    try:
        yield
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        message = f"blob store: {what}: {code or 'error'} (HTTP {status})"
        raise StorageUnavailable(message) from error
    except (TimeoutError, BotoCoreError, aiohttp.ClientError, OSError) as error:
        raise StorageUnavailable(f"blob store: {what}: {error}") from error


class S3BlobStore:
    """One aiobotocore client per event loop, opened on first use and kept for its pool."""

    # Input images go to the bucket too, not to the database (storage/inputs.py).
    keeps_inputs = True

    def __init__(self, settings: Settings, location: S3Location) -> None:
        self.location = location
        self.presign_seconds = settings.output_presign_seconds
        self._client_args: dict[str, Any] = {
            "endpoint_url": settings.s3_endpoint_url,
            "region_name": settings.s3_region,
            "config": AioConfig(
                s3={"addressing_style": settings.s3_addressing_style},
                signature_version="s3v4",
                retries={"mode": "standard", "max_attempts": 2},
                connect_timeout=5,
                read_timeout=30,
                max_pool_connections=64,
            ),
        }
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Lock | None = None

    async def _s3(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is not None and self._loop is loop:
            return self._client
        if self._loop is not loop:  # a new loop (tests run several): a new client, one lock
            self._client, self._stack, self._loop = None, None, loop
            self._opening = asyncio.Lock()
        assert self._opening is not None
        async with self._opening:
            if self._client is None:
                stack = contextlib.AsyncExitStack()
                with _bucket_faults("opening the client"):
                    self._client = await stack.enter_async_context(
                        get_session().create_client("s3", **self._client_args)
                    )
                self._stack = stack
        return self._client

    async def aclose(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            with contextlib.suppress(Exception):
                await stack.aclose()

    def _key(self, key: str) -> str:
        if not valid_key(key):
            raise ValueError(f"invalid blob key {key!r}")
        return self.location.object_key(key)

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        if content_type_of(key) != content_type:
            raise ValueError(f"blob key {key!r} does not end in the extension of {content_type}")
        name = self._key(key)
        if not isinstance(data, bytes | bytearray):
            # Decoded input data arrives as a view of a memory map; the SDK wants bytes.
            view = data
            data = await asyncio.to_thread(bytes, view) if len(view) > 1 << 20 else bytes(view)
        s3 = await self._s3()
        with _bucket_faults(f"storing {key}"):
            await s3.put_object(
                Bucket=self.location.bucket, Key=name, Body=data, ContentType=content_type
            )

    async def get(self, key: str) -> tuple[bytes, str] | None:
        if not valid_key(key):
            return None
        s3 = await self._s3()
        with _bucket_faults(f"reading {key}"):
            try:
                response = await s3.get_object(Bucket=self.location.bucket, Key=self._key(key))
            except ClientError as error:
                if _missing(error):
                    return None
                raise
            async with response["Body"] as body:
                data: bytes = await body.read()
        return data, content_type_of(key) or "application/octet-stream"

    async def delete(self, key: str) -> None:
        if not valid_key(key):
            return
        s3 = await self._s3()
        with _bucket_faults(f"deleting {key}"):
            await s3.delete_object(Bucket=self.location.bucket, Key=self._key(key))

    async def info(self, key: str) -> BlobInfo | None:
        """Size and type without the bytes; None when there is no such object."""
        if not valid_key(key):
            return None
        s3 = await self._s3()
        with _bucket_faults(f"looking up {key}"):
            try:
                head = await s3.head_object(Bucket=self.location.bucket, Key=self._key(key))
            except ClientError as error:
                if _missing(error):
                    return None
                raise
        return BlobInfo(
            int(head["ContentLength"]), content_type_of(key) or "application/octet-stream"
        )

    async def open_range(self, key: str, first: int, last: int) -> AsyncIterator[bytes]:
        """Bytes ``first`` to ``last`` (inclusive) of an object, as they arrive: a video is
        never held in memory whole. The request is made before the first chunk is asked
        for, so a fault surfaces here, before a response has started."""
        s3 = await self._s3()
        with _bucket_faults(f"reading {key}"):
            response = await s3.get_object(
                Bucket=self.location.bucket, Key=self._key(key), Range=f"bytes={first}-{last}"
            )
        return self._chunks(key, response["Body"])

    async def _chunks(self, key: str, body: Any) -> AsyncIterator[bytes]:
        async with body:
            with _bucket_faults(f"streaming {key}"):
                async for chunk in body.iter_chunks(STREAM_CHUNK_BYTES):
                    yield chunk

    async def presigned_url(self, key: str) -> str:
        """A GET URL for one object that expires after ``output_presign_seconds``."""
        s3 = await self._s3()
        with _bucket_faults(f"presigning {key}"):
            url: str = await s3.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.location.bucket, "Key": self._key(key)},
                ExpiresIn=self.presign_seconds,
            )
        return url
