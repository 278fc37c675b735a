"""A worker's memory while it decodes a task's inputs stays within what docs/security.md
plans for: ``DECODE_BYTES_PER_PIXEL`` bytes per budgeted pixel over its resting size.

Measured in a fresh process (its peak resident size, ``VmHWM``, reset before decoding), for
the format that costs least to write and most to decode (WebP: a 40-megapixel picture in
1.6 KB) and for PNG.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from genhook.media import DECODE_BYTES_PER_PIXEL
from tests.conftest import ROOT

MEASURE = r"""
import gc, io, json, sys
from PIL import Image
from genhook.engines.media.decode import decode_image
from genhook.media import budgeted_pixels, declared_size, sniff_image_format

fmt, side, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
buffer = io.BytesIO()
Image.new("RGB", (side, side), (200, 30, 30)).save(buffer, fmt, lossless=True)
data = buffer.getvalue()
gc.collect()

def status(name):
    with open("/proc/self/status") as lines:
        return next(int(l.split()[1]) * 1024 for l in lines if l.startswith(name))

with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # the peak starts again from here
resting = status("VmRSS")
kept = [decode_image(data, n + 1, max_pixels=10**9) for n in range(count)]
budgeted = count * budgeted_pixels(sniff_image_format(data), declared_size(data))
print(json.dumps({"bytes": len(data), "added": status("VmHWM") - resting, "budgeted": budgeted}))
"""


@pytest.mark.parametrize("fmt", ["WEBP", "PNG"])
def test_decoding_stays_within_the_documented_bytes_per_budgeted_pixel(fmt: str) -> None:
    # Two inputs of 12 megapixels, as the worker decodes them: all kept until the task ends.
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, fmt, "3464", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=True,
    )
    measured = json.loads(done.stdout)
    per_pixel = measured["added"] / measured["budgeted"]
    assert per_pixel <= DECODE_BYTES_PER_PIXEL * 1.05, measured
    # The check measures something: the pictures themselves are 4 bytes a pixel.
    assert per_pixel >= 2.5, measured
