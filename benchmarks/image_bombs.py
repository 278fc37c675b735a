"""What hostile pictures cost a worker: peak memory per pixel while decoding, and the size
of a composite of the worst shapes still accepted.

Each figure is measured in a fresh process (peak resident size, ``VmHWM``, reset before the
work). Decoding: two inputs of ``--megapixels`` each per format, against what the task's
pixel budget counts them as (``genhook.media.budgeted_pixels``; docs/security.md plans
with ``DECODE_BYTES_PER_PIXEL``). Composite: a 1:32 and two 32:1 pictures side by side, as
a local edit model and the image-edit engine put them, and the strips refused outright.

    .venv/bin/python benchmarks/image_bombs.py [--megapixels 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DECODE = r"""
import gc, io, json, sys
from PIL import Image
from genhook.engines.media.decode import decode_image
from genhook.media import budgeted_pixels, declared_size, sniff_image_format

fmt, side = sys.argv[1], int(sys.argv[2])
buffer = io.BytesIO()
Image.new("RGB", (side, side), (200, 30, 30)).save(buffer, fmt, lossless=True)
data = buffer.getvalue()
gc.collect()

def status(name):
    with open("/proc/self/status") as lines:
        return next(int(l.split()[1]) * 1024 for l in lines if l.startswith(name))

open("/proc/self/clear_refs", "w").write("5")
resting = status("VmRSS")
kept = [decode_image(data, n + 1, max_pixels=10**9) for n in range(2)]
added = status("VmHWM") - resting
print(json.dumps({"bytes": len(data), "added": added, "declared": 2 * side * side,
                  "budgeted": 2 * budgeted_pixels(sniff_image_format(data), declared_size(data))}))
"""

COMPOSE = r"""
import json
from PIL import Image
from genhook.engines.image_edit._compose import row
from genhook.engines.local._engine import COMPOSITE_SIDE
from genhook.engines.media.compose import side_by_side
from genhook.media import MAX_ASPECT_RATIO, aspect_problem

def status(name):
    with open("/proc/self/status") as lines:
        return next(int(l.split()[1]) * 1024 for l in lines if l.startswith(name))

short = 128
tall = Image.new("RGB", (short, short * MAX_ASPECT_RATIO))
wide = Image.new("RGB", (short * MAX_ASPECT_RATIO, short))
open("/proc/self/clear_refs", "w").write("5")
resting = status("VmRSS")
local = side_by_side([tall, wide, wide], COMPOSITE_SIDE)
edit = row([tall.resize((32, 1024)), wide.resize((1024, 32))], 1024, False)
print(json.dumps({
    "local": local.size, "edit": edit.size, "added": status("VmHWM") - resting,
    "unbounded_local": [sum(w * tall.height // h for w, h in (tall.size, wide.size, wide.size)),
                        tall.height],
    "strip": aspect_problem((1000, 1)),
}))
"""


def run(script: str, *args: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megapixels", type=float, default=40.0)
    args = parser.parse_args()
    side = int((args.megapixels * 1_000_000) ** 0.5)
    with open("/proc/loadavg") as load:
        print(f"load average: {' '.join(load.read().split()[:3])} ({os.cpu_count()} CPUs)")
    print(f"decoding two {side}x{side} inputs:")
    for fmt in ("WEBP", "PNG", "JPEG"):
        m = run(DECODE, fmt, str(side))
        added, declared, budgeted = (int(m[k]) for k in ("added", "declared", "budgeted"))
        print(
            f"  {fmt:<5} body {m['bytes']:>9,} bytes: +{added / 1e6:,.0f} MB, "
            f"{added / declared:.2f} bytes per declared pixel, "
            f"{added / budgeted:.2f} per budgeted pixel"
        )
    c = run(COMPOSE)
    print(
        f"composite of 1:32, 32:1, 32:1 (128 px short side): local model {c['local']}, "
        f"image-edit row {c['edit']}, +{int(c['added']) / 1e6:,.0f} MB "
        f"(at the first one's height it was {c['unbounded_local']})"
    )
    print(f"a 1000x1 input: {c['strip']}")


if __name__ == "__main__":
    main()
