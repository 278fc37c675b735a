"""The test run's temporary directories, removed when the run ends.

Under pytest-xdist a worker is killed about ten seconds after its session ends, so its
``atexit`` handlers may never run, or be cut off halfway through a PostgreSQL cluster's tens of
thousands of files: every run left gigabytes behind. So the run's first pytest process (the
controller, under xdist) makes one directory for the run, the processes it starts inherit it
through the environment and make theirs inside, and that first process removes it at its own
end. Outside pytest (the benchmarks) a directory is made in the system's and removed at exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

VARIABLE = "PYTEST_GENHOOK_RUN_DIR"


def temporary_directory(prefix: str) -> Path:
    """A new directory in the run's, or in the system's (removed at exit) outside a run."""
    run = os.environ.get(VARIABLE)
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir=run))
    if run is None:
        atexit.register(shutil.rmtree, directory, True)
    return directory


def start_run() -> Path | None:
    """The run's directory, made by the run's first process (None in the others)."""
    if os.environ.get(VARIABLE):
        return None
    run = Path(tempfile.mkdtemp(prefix="genhook-tests-"))
    run.chmod(0o711)  # the PostgreSQL clusters inside belong to the postgres user
    os.environ[VARIABLE] = str(run)
    return run
