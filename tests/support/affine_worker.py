"""``genhook worker`` that counts ``test/affine`` as loaded (``warm``) or not (``cold``):
``python -m tests.support.affine_worker warm|cold``, settings from the environment."""

from __future__ import annotations

import sys

from genhook.runtime.roles import run_worker
from genhook.tasks import worker
from tests.support.engines import AFFINE

if __name__ == "__main__":
    loaded = frozenset({AFFINE.id}) if sys.argv[1] == "warm" else frozenset()
    worker._resident_models = lambda: loaded
    from genhook.cli._environment import load_settings

    run_worker(load_settings())
