"""Every shell and Python block of README.md and docs/ runs as written against a live service.

A reader copies these blocks into a terminal next to ``make serve``; a block that fails
there is a bug. Each block marked ``bash``, ``sh``, ``shell``, ``python`` or ``py`` runs, in
its file's order, in one scratch directory per file that holds what a reader has at hand
there: ``photo.jpg``, ``speech.mp3``, the service's ``genhook-data/credentials.json`` and a
``.venv/bin/genhook``. ``http://127.0.0.1:8000`` is the test's service. A shell block sees
the variables the file's earlier shell blocks set (``$KEY``, ``$WORK``, ``$ID``...).

A block that must not run here (it installs packages, starts a service in the foreground,
needs a public host or your own receiver) says so with a comment on the line just before its
fence, with the reason::

    <!-- no-run: installs packages -->
    ```sh
    pip install ...
    ```

Blocks in other languages (``console``, ``json``, ``ts``, none) are not run.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from tests.conftest import LiveService, start_service, stop_service
from tests.support.http import HTTP

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGUAGES = frozenset({"bash", "sh", "shell"})
PYTHON_LANGUAGES = frozenset({"python", "py"})
DOCUMENTED_URL = "http://127.0.0.1:8000"
NO_RUN = re.compile(r"<!--\s*no-run:\s*(?P<reason>[^>]*?)\s*-->")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")
# One block's limit: the README's video task is the longest.
BLOCK_TIMEOUT = 300


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    no_run: str | None  # the reason given, when marked

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, with the ``no-run`` mark before each."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, info = opening["fence"], opening["info"].strip()
        language = info.split()[0].lower() if info else ""
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            body.append(lines[end][len(opening["indent"]) :])
            end += 1
        previous = next((text for text in reversed(lines[:index]) if text.strip()), "")
        mark = NO_RUN.search(previous)
        blocks.append(
            Block(
                path, index + 1, language, "\n".join(body) + "\n", mark["reason"] if mark else None
            )
        )
        index = end + 1
    return blocks


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def runnable(block: Block) -> bool:
    return block.language in SHELL_LANGUAGES | PYTHON_LANGUAGES


def test_every_no_run_mark_gives_a_reason_and_sits_on_a_runnable_block() -> None:
    for path in documents():
        for block in fenced_blocks(path):
            if block.no_run is None:
                continue
            assert block.no_run, f"{block.name}: say why the block does not run"
            assert runnable(block), f"{block.name}: a {block.language or 'plain'} block never runs"


def test_fences_are_parsed_as_a_reader_sees_them(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n<!-- no-run: installs packages -->\n```sh\npip install x\n```\n\n"
        "```python\nprint(1)\n```\n\n````md\n```sh\nnot a block\n```\n````\n"
        "- item:\n\n  ```bash\n  echo indented\n  ```\n"
    )
    blocks = fenced_blocks(page)
    assert [(b.language, b.no_run, b.code) for b in blocks] == [
        ("sh", "installs packages", "pip install x\n"),
        ("python", None, "print(1)\n"),
        ("md", None, "```sh\nnot a block\n```\n"),
        ("bash", None, "echo indented\n"),
    ]


@dataclass
class Reader:
    """What a reader has next to ``make serve``: a directory, a shell, the service."""

    service: LiveService
    home: Path
    env: dict[str, str]


def _photo() -> bytes:
    """A small picture with edges and colour, so every edit has something to work on."""
    image = Image.new("RGB", (640, 480), (90, 140, 200))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 300, 640, 480), fill=(60, 130, 60))
    draw.ellipse((420, 40, 540, 160), fill=(250, 220, 80))
    draw.polygon([(120, 300), (220, 140), (320, 300)], fill=(120, 100, 90))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    """One live service for every block of every page (each page gets its own directory)."""
    base = tmp_path_factory.mktemp("doc-blocks")
    service = start_service(base)
    try:
        tools = base / "bin"
        tools.mkdir()
        python = shlex.quote(sys.executable)
        # `python3` and `genhook` are this checkout's, as in a reader's activated .venv.
        (tools / "python3").write_text(f'#!/bin/sh\nexec {python} "$@"\n')
        (tools / "python").write_text(f'#!/bin/sh\nexec {python} "$@"\n')
        (tools / "genhook").write_text(f'#!/bin/sh\nexec {python} -m genhook.cli "$@"\n')
        for tool in tools.iterdir():
            tool.chmod(0o755)
        env = {
            key: value
            for key, value in service.env.items()
            if not key.startswith("GENHOOK_") or key == "GENHOOK_EXTRA_ENGINES"
        }
        env.update(
            PATH=f"{tools}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
            GENHOOK_BASE_URL=service.base_url,
            COLUMNS="200",
        )
        speech = HTTP.post(
            f"{service.base_url}/api/v1/model/generateAudio",
            json={"model": "genhook/text-to-speech", "prompt": "We will meet on Monday."},
            headers={"Authorization": f"Bearer {service.api_key}", "Prefer": "wait=60"},
            timeout=120,
        ).json()
        assert speech["status"] == "completed", speech
        (base / "speech.mp3").write_bytes(HTTP.get(speech["outputs"][0], timeout=30).content)
        yield Reader(service, base, env)
    finally:
        stop_service(service)


def _page_dir(reader: Reader, path: Path) -> Path:
    directory = reader.home / "pages" / re.sub(r"[^A-Za-z0-9]+", "-", str(path.relative_to(ROOT)))
    if directory.exists():
        return directory
    directory.mkdir(parents=True)
    (directory / "photo.jpg").write_bytes(_photo())
    shutil.copy(reader.home / "speech.mp3", directory / "speech.mp3")
    (directory / "genhook-data").mkdir()
    shutil.copy(reader.service.data_dir / "credentials.json", directory / "genhook-data")
    venv = directory / ".venv" / "bin"
    venv.mkdir(parents=True)
    shutil.copy(reader.home / "bin" / "genhook", venv / "genhook")
    return directory


def run_block(reader: Reader, block: Block, directory: Path) -> subprocess.CompletedProcess[str]:
    """Run one block in the page's directory; a shell block starts from the variables the
    page's earlier shell blocks left (``state.sh``) and leaves its own."""
    code = block.code.replace(DOCUMENTED_URL, reader.service.base_url)
    if block.language in PYTHON_LANGUAGES:
        command = [sys.executable, "-c", code]
    else:
        state = directory / ".state.sh"
        script = (
            "set -a\n"  # every assignment is kept for the next block
            f"if [ -f {shlex.quote(str(state))} ]; then . {shlex.quote(str(state))}; fi\n"
            "set -e\n"
            f"{code}\n"
            f"export -p > {shlex.quote(str(state))}\n"
        )
        command = ["bash", "-c", script]
    # A session of its own, so whatever the block left running is stopped with it.
    process = subprocess.Popen(
        command,
        cwd=directory,
        env=reader.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=BLOCK_TIMEOUT)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "page",
    [p for p in documents() if any(runnable(b) for b in fenced_blocks(p))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_blocks_of_a_page_run_as_written(reader: Reader, page: Path) -> None:
    directory = _page_dir(reader, page)
    for block in fenced_blocks(page):
        if not runnable(block) or block.no_run is not None:
            continue
        done = run_block(reader, block, directory)
        assert done.returncode == 0, (
            f"{block.name} ({block.language}) exited {done.returncode}; mark it "
            f"<!-- no-run: reason --> if it cannot run here.\n--- block\n{block.code}"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        )
