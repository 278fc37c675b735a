"""What each long-lived process of ``genhook serve`` imports, pinned: every library a role
holds costs its memory in every copy of that role, so a module-level import of a heavy one
where a lazy one does is a regression.

Each case builds a role's objects the way ``genhook.runtime.roles`` does, in a fresh interpreter,
then lists the top-level packages it loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

BUILD = {
    "bare": "",
    "supervisor": "import genhook.runtime.supervisor",
    "worker": """
import asyncio
from genhook.config import Settings
from genhook.runtime.health import health_port
from genhook.runtime.services import open_services
from genhook.tasks.worker import Worker

async def build():
    state = open_services(Settings())
    Worker.sharing(state, worker_id="test")
    await state.db.dispose()

asyncio.run(build())
""",
    "dispatcher": """
import asyncio
from genhook.config import Settings
from genhook.runtime.roles import DispatcherRole
from genhook.runtime.services import open_services

async def build():
    state = open_services(Settings())
    DispatcherRole(state, owner="test")
    await state.db.dispose()

asyncio.run(build())
""",
    "api": """
import asyncio
import uvicorn
from genhook.config import Settings
from genhook.api.app import build_state, create_app

async def build():
    state = build_state(Settings())
    create_app(state)
    await state.db.dispose()

asyncio.run(build())
""",
}

REPORT = """
import json, sys
print(json.dumps(sorted(sys.modules)))
"""

MEDIA = {"PIL", "cv2", "numpy", "av", "faster_whisper", "ctranslate2", "espeakng_loader"}
# Modules (not packages) a role on SQLite must not load: another dialect, another role's loop.
NEVER_MODULES = {"sqlalchemy.dialects.postgresql"}
FORBIDDEN_MODULES = {
    "worker": NEVER_MODULES,
    "dispatcher": NEVER_MODULES | {"genhook.tasks.worker"},
    "api": NEVER_MODULES | {"genhook.tasks.worker"},
}
# Start-up only (migrations) or another role's.
NEVER = MEDIA | {"alembic", "mako", "typer", "rich", "pygments"}

FORBIDDEN = {
    "worker": NEVER
    | {"fastapi", "starlette", "uvicorn", "click", "aiohttp", "httpx", "cryptography"},
    "dispatcher": NEVER | {"fastapi", "starlette", "uvicorn", "click", "httpx"},
    "api": NEVER | {"aiohttp", "httpx", "jinja2"},
}


def loaded(role: str, tmp_path: Path) -> set[str]:
    """The top-level packages the role's case loaded."""
    return {name.split(".")[0] for name in modules(role, tmp_path)}


def modules(role: str, tmp_path: Path) -> set[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        "GENHOOK_DATA_DIR": str(tmp_path / "data"),
    }
    env.pop("GENHOOK_DATABASE_URL", None)
    env.pop("GENHOOK_EXTRA_ENGINES", None)
    out = subprocess.run(
        [sys.executable, "-c", BUILD[role] + REPORT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.parametrize("role", sorted(FORBIDDEN))
def test_a_role_imports_only_what_it_needs(role: str, tmp_path: Path) -> None:
    names = modules(role, tmp_path)
    found = {name.split(".")[0] for name in names}
    assert "genhook" in found and "sqlalchemy" in found  # the case built the role
    assert not found & FORBIDDEN[role], sorted(found & FORBIDDEN[role])
    assert "sqlalchemy.dialects.sqlite" in names  # the case ran on SQLite
    assert not names & FORBIDDEN_MODULES[role], sorted(names & FORBIDDEN_MODULES[role])


def test_the_supervisor_holds_only_the_standard_library(tmp_path: Path) -> None:
    found = loaded("supervisor", tmp_path) - loaded("bare", tmp_path)
    assert "genhook" in found
    outside = found - set(sys.stdlib_module_names) - {"genhook"}
    assert not outside, sorted(outside)
