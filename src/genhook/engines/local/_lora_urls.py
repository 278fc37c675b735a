"""LoRA adapters given by URL in a request (``GENHOOK_LOCAL_MODELS_LORA_URLS``, off unless set).

A file is fetched like an input image (the target-address policy, redirects checked hop by
hop, a byte cap while streaming), must be safetensors (its header is read; a pickle is never
loaded), and is kept in ``<data_dir>/loras`` under its SHA-256: one file however many URLs
name it, the least recently used removed past the byte budget. A worker process fetches a URL
once and reuses the file while it is there.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import tempfile
import threading
from pathlib import Path

from genhook.config import Settings
from genhook.engines.local._config import read_header
from genhook.errors import ErrorCode, TaskFailure
from genhook.net import AddressPolicy

log = logging.getLogger(__name__)

_MIB = 1 << 20


class LoraCache:
    """The adapter files fetched by URL, on disk by content hash, within a byte budget."""

    def __init__(self, settings: Settings, policy: AddressPolicy | None = None) -> None:
        self.directory = settings.data_dir / "loras"
        self.budget = int(settings.local_models_lora_cache_mb * _MIB)
        self.max_bytes = int(settings.local_models_lora_url_max_mb * _MIB)
        self.timeout = settings.input_fetch_timeout_seconds
        self.policy = policy or AddressPolicy(allow_private=settings.webhook_allow_private_targets)
        self._urls: dict[str, Path] = {}
        self._lock = threading.Lock()

    def file(self, url: str) -> Path:
        """The adapter file at ``url``, fetched unless this process has it already;
        ``TaskFailure`` (an ``INPUT_*`` code) when it cannot be fetched or is not
        safetensors."""
        with self._lock:
            known = self._urls.get(url)
            if known is not None and known.is_file():
                os.utime(known)  # recently used: the last the budget removes
                return known
        data = asyncio.run(self._fetch(url))
        path = self.directory / f"{hashlib.sha256(data).hexdigest()}.safetensors"
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            if path.is_file():
                os.utime(path)
            else:
                self._store(data, path)
            self._trim(keep=path)
            self._urls[url] = path
        return path

    async def _fetch(self, url: str) -> bytes:
        from genhook.net import fetch_input_image  # aiohttp, on the first adapter by URL

        return await fetch_input_image(
            url,
            policy=self.policy,
            max_bytes=self.max_bytes,
            timeout=self.timeout,
            accept="application/octet-stream",
        )

    def _store(self, data: bytes, path: Path) -> None:
        """Written whole under a temporary name, checked as safetensors, then renamed."""
        handle, temporary = tempfile.mkstemp(dir=self.directory, suffix=".part")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            try:
                read_header(Path(temporary))
            except ValueError:
                raise TaskFailure(
                    ErrorCode.INPUT_UNSUPPORTED_FORMAT,
                    "the LoRA adapter at the URL is not a safetensors file (the only format "
                    "loaded)",
                ) from None
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)

    def _trim(self, keep: Path) -> None:
        """Remove the least recently used files until the rest fit the budget."""
        files = []
        for path in self.directory.glob("*.safetensors"):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            files.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.budget:
                break
            if path == keep:
                continue
            log.info("removing LoRA adapter %s from the cache (budget)", path.name)
            path.unlink(missing_ok=True)
            total -= size
        for url, path in list(self._urls.items()):
            if not path.is_file():
                del self._urls[url]
