"""Submit an image edit with the genhook SDK, wait for it, and save the outputs.

pip install genhook
export GENHOOK_BASE_URL=http://127.0.0.1:8000 GENHOOK_API_KEY=ghk_...
python examples/submit_edit.py "increase the contrast" photo.jpg
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

from genhook.client import Client, GenhookError


def main(prompt: str, images: list[str]) -> int:
    with Client() as client:
        try:
            task = client.edit(prompt, images, size="1024*1024", output_format="png")
            print(f"submitted {task.id}; polling {task.urls.get('get')}")
            done = client.wait(task.id, timeout=600, on_update=lambda p: print(" ", p.status))
            done.raise_for_failure()
        except GenhookError as exc:
            print(
                f"error: {exc.message}",
                *(f"  {e.field}: {e.message}" for e in exc.errors),
                sep="\n",
            )
            return 1
        auth = {"Authorization": f"Bearer {client.api_key}"}
        for index, url in enumerate(done.outputs):
            target = Path(f"{done.id}-{index}.png")
            target.write_bytes(httpx.get(url, headers=auth, timeout=60).raise_for_status().content)
            print(f"saved {target}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2:]))
