"""ONNX Runtime sessions on the CPU, configured one way for every engine that runs a model,
and the share of the cores a worker process's models compute on (ONNX Runtime, CTranslate2
and torch alike)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime

    from genhook.config import Settings


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (``taskset``, a container's cpuset),
    not every core of the machine."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def shared_threads(settings: Settings) -> int:
    """The usable cores shared among the worker processes ``genhook serve`` runs."""
    return max(1, usable_cores() // max(1, settings.workers))


def cpu_session(path: Path, threads: int) -> onnxruntime.InferenceSession:
    """A CPU session of the model at ``path`` on ``threads`` intra-op threads, quiet. Its
    threads sleep between runs instead of spinning: the cores they would spin on are wanted
    by the process's next computation (a pipeline call) or by the other worker processes."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
