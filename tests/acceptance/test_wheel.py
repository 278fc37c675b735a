"""The SDK as docs/sdk.md installs it: a built wheel, in a fresh venv, without server extras."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("fastapi", "sqlalchemy", "pydantic", "numpy", "PIL", "cv2", "onnxruntime")


def runtime_closure(requirements: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions that ``requirements`` need, transitively, no extras."""
    found: dict[str, metadata.Distribution] = {}
    pending = [Requirement(text) for text in requirements]
    while pending:
        requirement = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        found[name] = dist = metadata.distribution(requirement.name)
        pending.extend(Requirement(text) for text in dist.requires or [])
    return found


def link_dependencies(target: Path, dists: dict[str, metadata.Distribution]) -> None:
    """Expose just these distributions (code and metadata) to the fresh venv, offline."""
    target.mkdir()
    for dist in dists.values():
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (target / top).exists() and top != "__pycache__":
                (target / top).symlink_to(source)


def test_wheel_installs_and_imports_in_a_clean_venv(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    # With the test environment's setuptools (pyproject.toml's dev extra): an isolated build
    # would first install it into a fresh environment, most of this test's time.
    built = subprocess.run(
        [
            sys.executable,
            *("-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"),
            *("-w", str(wheels), str(ROOT)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("genhook-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # A shell of its own: nothing of this checkout or of the test run's environment.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    installed = subprocess.run(
        [*pip, "--no-index", str(wheel)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stderr
    requires = metadata.distribution("genhook").requires or []
    base = [r for r in requires if "extra ==" not in r]
    link_dependencies(tmp_path / "deps", runtime_closure(base))
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "sdk-deps.pth").write_text(str(tmp_path / "deps") + "\n")
    probe = (
        "import sys, genhook.client as c, genhook.receiver\n"
        "assert c.__file__.startswith(sys.prefix), c.__file__\n"
        f"loaded = [m for m in {SERVER_ONLY!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "print(c.Client.__name__)\n"
    )
    imported = subprocess.run(
        [str(python), "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "Client"
    # The console script of the bare install runs the client commands.
    helped = subprocess.run(
        [str(venv / "bin" / "genhook"), "submit", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert helped.returncode == 0, helped.stderr
    assert "--prompt" in helped.stdout
    # The server really is absent: its modules do not import here.
    server = subprocess.run(
        [str(python), "-c", "import genhook.api"], env=env, capture_output=True, text=True
    )
    assert server.returncode != 0
