"""``genhook worker`` that counts ``test/affine`` as loaded (``warm``) or not (``cold``):
``python -m tests.support.affine_worker warm|cold``, settings from the environment."""

from __future__ import annotations

import sys

from genhook.runtime.roles import run_worker
from tests.support import engines

if __name__ == "__main__":
    loaded = frozenset({engines.AFFINE.id}) if sys.argv[1] == "warm" else frozenset()
    engines.affine_loaded = loaded
    from genhook.cli._environment import load_settings

    run_worker(load_settings())
