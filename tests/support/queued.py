"""Rows of queued tasks as a submit stores them, inserted straight into the tables: a backlog
built in one statement (for tests of the queue and for benchmarks of a claim)."""

from __future__ import annotations

import secrets
from typing import Any

INPUT = b"\x89PNG\r\n\x1a\n" + bytes(2000)
CHARGE = {
    "tier": "standard",
    "output_pixels": 1048576,
    "input_images": 1,
    "lines": [["image edit, 1024*1024", "0.01"]],
    "total_micros": 10000,
}


def queued_rows(
    account_id: str, model: str, count: int, now: int, webhook_url: str | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``count`` tasks waiting to be claimed, oldest first, each with one input image in the
    ``blobs`` table: the ``tasks`` rows and the ``blobs`` rows. As wide as real ones, since
    the planner's guess of the queue's size depends on the width."""
    tasks, blobs = [], []
    for index in range(count):
        task_id = secrets.token_hex(16)
        key = f"inputs/{task_id}_0.png"
        blobs.append({"key": key, "content_type": "image/png", "data": INPUT, "created_at": now})
        tasks.append(
            {
                "id": task_id,
                "account_id": account_id,
                "model": model,
                "kind": "image",
                "status": "created",
                "params": {"prompt": "black and white, then a red border", "size": "1024*1024"},
                "inputs": [{"blob": key, "format": "png"}],
                "webhook_url": webhook_url,
                "webhook_events": None,
                "created_at": now,
                "updated_at": now,
                "available_at": now + index,  # claimed in insertion order
                "deadline_at": now + 3_600_000,
                "attempts": 0,
                "lease_losses": 0,
                "outputs": [],
                "has_nsfw_contents": [],
                "info": {},
                "charge": CHARGE,
            }
        )
    return tasks, blobs
