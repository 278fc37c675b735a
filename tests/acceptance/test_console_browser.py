"""The web console in a real browser: Debian's Chromium driven by Playwright against
``genhook serve`` on loopback (SQLite), one service and one browser for the whole module.

Screenshots of every page land under the module's temporary directory (``screenshots/``).
Set GENHOOK_SKIP_BROWSER_TESTS=1 to skip these tests on a machine without Chromium; without
it a missing or broken Chromium fails them.
"""

from __future__ import annotations

import io
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import LiveService, start_service, stop_service
from tests.support.speech import word_error_rate

if os.environ.get("GENHOOK_SKIP_BROWSER_TESTS") == "1":
    pytest.skip("GENHOOK_SKIP_BROWSER_TESTS=1", allow_module_level=True)

from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright

CHROMIUM = "/usr/bin/chromium"
# Spoken by the text-to-speech model in the playground, then transcribed back.
SPOKEN = "Hello from the console."
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 60_000


class FailingReceiver:
    """A webhook receiver on loopback that answers every delivery with a 500."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(500)
                self.send_header("Content-Length", "6")
                self.end_headers()
                self.wfile.write(b"broken")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console")


@pytest.fixture(scope="module")
def service(workdir: Path) -> Iterator[LiveService]:
    svc = start_service(
        workdir,
        GENHOOK_WORKERS="2",
        GENHOOK_WEBHOOK_RETRY_BASE_SECONDS="30",
        GENHOOK_WEBHOOK_RETRY_MAX_ATTEMPTS="1",
    )
    yield svc
    stop_service(svc)


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """Each launch gets a fresh, temporary user-data-dir from Playwright."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run scripts/ensure-chromium.sh"
    launched = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
    yield launched
    launched.close()


@pytest.fixture
def context(browser: Browser, service: LiveService) -> Iterator[BrowserContext]:
    ctx = browser.new_context(base_url=service.base_url, viewport={"width": 412, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)
    # Only this service: any other request (an external asset, a stray fetch) is refused.
    ctx.route(
        lambda url: not url.startswith(service.base_url),
        lambda route: route.abort(),
    )
    yield ctx
    ctx.close()


@pytest.fixture
def shots(workdir: Path, request: pytest.FixtureRequest) -> Path:
    folder = workdir / "screenshots" / request.node.name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sign_in(page: Page, api_key: str) -> None:
    page.goto("/console/login")
    page.get_by_label("API key").fill(api_key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/console/play")


def wait_status(page: Page, status: str) -> None:
    """Until the task page shows ``status``, fully loaded. An ended status is awaited on the
    page as rendered for an ended task: the live page writes the new status, then reloads
    itself, and a check made during that reload would meet a half-loaded document."""
    page.wait_for_function(
        """([status, ended]) => {
             const live = document.getElementById('live');
             return document.readyState === 'complete'
               && document.getElementById('task-status')?.textContent === status
               && (!ended || live?.dataset.terminal === 'yes');
           }""",
        arg=[status, status in ("completed", "failed", "canceled")],
    )


def snap(page: Page, shots: Path, name: str) -> None:
    """Screenshot the page after checking it fits a phone's width and labels every control.
    Once it has loaded: laid out before its stylesheet arrives, a page is as wide as its
    widest table."""
    page.wait_for_load_state("load")
    unlabelled = page.evaluate(
        """() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
                 .filter(el => el.labels.length === 0).map(el => el.name || el.id)"""
    )
    assert unlabelled == [], (name, unlabelled)
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, (name, overflow)
    page.screenshot(path=shots / f"{name}.png", full_page=True)


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (30, 120, 200)).save(buffer, "PNG")
    return buffer.getvalue()


def test_csp_is_sent_and_no_inline_script_runs(context: BrowserContext, shots: Path) -> None:
    page = context.new_page()
    violations: list[str] = []
    page.on("console", lambda msg: violations.append(msg.text))
    response = page.goto("/console/login")
    assert response is not None
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    # The page's own module ran...
    assert page.evaluate("document.documentElement.dataset.enhanced") == "yes"
    # ...but an inline script added to the page does not.
    ran = page.evaluate(
        """() => { const s = document.createElement('script');
                   s.textContent = 'window.inlineRan = true'; document.body.append(s);
                   return window.inlineRan === true; }"""
    )
    assert ran is False
    assert any("Content Security Policy" in text for text in violations), violations
    snap(page, shots, "login")


def test_playground_operator_view_and_sign_out(
    context: BrowserContext, service: LiveService, shots: Path, workdir: Path
) -> None:
    page = context.new_page()
    # The service's bare address leads to the console, which says where a key is found.
    page.goto("/")
    page.wait_for_url("**/console/login")
    where = page.locator("#where-key").inner_text()
    assert "genhook-data/credentials.json" in where and "genhook keys create" in where
    icon = page.request.get(page.locator("link[rel=icon]").get_attribute("href") or "")
    assert icon.ok and icon.headers["content-type"] == "image/vnd.microsoft.icon"
    sign_in(page, service.api_key)
    snap(page, shots, "models")

    # An edit from an uploaded file: it completes and the output renders at its size.
    page.goto("/console/play/genhook/image-edit")
    picture = workdir / "upload.png"
    picture.write_bytes(png(64, 48))
    page.set_input_files("#f-images", str(picture))
    page.locator("#f-prompt").fill("black and white, then teach it to dance")
    # The allowed sizes are a list to choose from.
    sizes = page.locator("#f-size option").all_inner_texts()
    assert "1024*1024" in sizes and "2048*2048" in sizes and len(sizes) == 14
    page.locator("#f-size").select_option("1024*1024")
    snap(page, shots, "play-image-edit")
    # The request shows beside the form, and the chosen file stays chosen for the submit.
    page.get_by_role("button", name="Show the request").click()
    page.locator("#code-curl").wait_for()
    assert "data:image/png;base64," in page.locator("#code-curl").inner_text()
    assert page.locator("#f-images").evaluate("input => input.files.length") == 1
    assert page.locator("#f-size").input_value() == "1024*1024"
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url("**/console/tasks/*")
    wait_status(page, "completed")
    # Ended: the bar is full, not busy; the part of the prompt left out is named.
    assert page.locator("#task-progress").evaluate("bar => bar.position") == 1
    assert page.locator("#ignored li").all_inner_texts() == ["teach it to dance"]
    image = page.locator("img.output").first
    image.wait_for()
    page.wait_for_function("() => document.querySelector('img.output').complete")
    size = image.evaluate("img => [img.naturalWidth, img.naturalHeight]")
    assert size == [1024, 1024]
    assert page.locator("ol.plan li").count() >= 1
    # Beside the input this tab uploaded.
    upload = page.locator("img.input").first
    upload.wait_for()
    assert upload.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [64, 48]
    snap(page, shots, "task-image-edit")

    # The exact request as curl and Python.
    page.goto("/console/play/genhook/text-to-speech")
    page.locator("#f-prompt").fill(SPOKEN)
    page.get_by_role("button", name="Show the request").click()
    curl = page.locator("#code-curl").inner_text()
    assert "/api/v1/model/generateAudio" in curl and SPOKEN in curl
    assert "httpx.post" in page.locator("#code-python").inner_text()

    # Text to speech: the result plays.
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url("**/console/tasks/*")
    wait_status(page, "completed")
    audio = page.locator("audio.output").first
    audio.wait_for()
    audio.evaluate("a => a.play()")
    page.wait_for_function("() => document.querySelector('audio.output').currentTime > 0")
    assert audio.evaluate("a => a.duration") > 0.3
    snap(page, shots, "task-tts")

    # Speech to text on that speech: the transcript's words light up as the input plays.
    speech = workdir / "speech.mp3"
    speech.write_bytes(page.request.get(audio.get_attribute("src") or "").body())
    page.goto("/console/play/genhook/speech-to-text")
    page.set_input_files("#f-audio", str(speech))
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url("**/console/tasks/*")
    wait_status(page, "completed")
    words = page.locator("#transcript span[data-start]")
    words.first.wait_for()
    heard = page.locator("#transcript").inner_text()
    assert word_error_rate(SPOKEN, heard) <= 0.25, heard
    # The input player is filled from this tab's own copy of the upload, after the page.
    player = page.locator("audio.input").first
    player.wait_for()
    player.evaluate("a => a.play()")
    page.wait_for_function("() => document.querySelector('#transcript span.now') !== null")
    snap(page, shots, "task-stt")

    # Cancel a running task from its page.
    page.goto("/console/play/test/fake-edit")
    page.set_input_files("#f-images", str(picture))
    page.locator("#f-prompt").fill("wait=60")
    page.locator("#f-size").select_option("1024*1024")
    page.locator("#f-priority").select_option("high")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url("**/console/tasks/*")
    wait_status(page, "processing")
    page.get_by_role("button", name="Cancel task").click()
    wait_status(page, "canceled")
    assert page.locator("#task-progress").count() == 0  # no bar left busy
    snap(page, shots, "task-canceled")

    # A webhook that fails, then a redelivery from the deliveries page.
    receiver = FailingReceiver()
    try:
        page.goto("/console/play/test/fake-edit")
        page.set_input_files("#f-images", str(picture))
        page.locator("#f-prompt").fill("edit")
        page.locator("#f-size").select_option("1024*1024")
        page.get_by_label("Webhook URL (optional)").fill(receiver.url)
        page.get_by_role("button", name="Submit").click()
        page.wait_for_url("**/console/tasks/*")
        wait_status(page, "completed")
        task_id = page.url.rsplit("/", 1)[-1]
        for _ in range(400):
            page.goto("/console/deliveries")
            if page.locator(f"a[href='/console/tasks/{task_id}']").count():
                break
            page.wait_for_timeout(200)
        delivery = page.locator(".host .delivery").filter(has_text=task_id)
        assert "undeliverable" in delivery.inner_text()
        assert "127.0.0.1" in page.locator(".host h3").first.inner_text()
        snap(page, shots, "deliveries")
        first = len(receiver.bodies)
        assert first == 1
        delivery.get_by_role("button", name="Redeliver").click()
        page.wait_for_url("**/console/deliveries?notice=*")
        assert page.locator("#notice").inner_text() == "Redelivery queued."
        for _ in range(400):
            if len(receiver.bodies) > first:
                break
            page.wait_for_timeout(100)
        assert len(receiver.bodies) == 2
        assert task_id.encode() in receiver.bodies[1]
        # The task page shows the webhook and both attempts.
        for _ in range(200):
            page.goto(f"/console/tasks/{task_id}")
            if page.locator("table.attempts tbody tr").count() == 2:
                break
            page.wait_for_timeout(200)
        assert page.locator("table.attempts tbody tr").count() == 2
        assert task_id in page.locator("pre.webhook-body").inner_text()
        assert "X-Service-Webhook-Signature" in page.locator("table.headers").inner_text()
        snap(page, shots, "task-webhook")

        # Failed again: redeliver everything failed since a time.
        for _ in range(200):
            page.goto("/console/deliveries")
            failed = page.locator(".host .delivery").filter(has_text=task_id)
            if "undeliverable, 2 attempt(s)" in failed.inner_text():
                break
            page.wait_for_timeout(200)
        page.get_by_label("Redeliver all failed since").fill("2000-01-01T00:00:00")
        page.get_by_role("button", name="Redeliver all").click()
        page.wait_for_url("**/console/deliveries?notice=*")
        assert page.locator("#notice").inner_text() == "1 redelivery queued, 0 refused."
        for _ in range(400):
            if len(receiver.bodies) > 2:
                break
            page.wait_for_timeout(100)
        assert len(receiver.bodies) == 3
    finally:
        receiver.close()

    # The operator's pages.
    page.goto("/console/tasks?status=canceled")
    assert page.locator("#task-table tbody tr").count() == 1
    page.goto("/console/tasks")
    assert page.locator("#task-table tbody tr").count() == 5
    snap(page, shots, "tasks")
    assert page.locator("#task-table .priority").first.inner_text() == "(high priority)"
    page.goto("/console/usage")
    assert page.locator("svg.chart rect").count() >= 2
    snap(page, shots, "usage")
    page.get_by_role("link", name="Queue").click()
    assert page.locator("#own-queue td.weight").inner_text() == "1"
    snap(page, shots, "queue")
    page.goto("/console/keys")
    page.locator("#key-name").fill("ci")
    page.locator("#key-max-priority").select_option("normal")
    page.get_by_role("button", name="Create a key").click()
    assert page.locator("#new-key").inner_text().startswith("ghk_")
    assert page.locator("td.max-priority").filter(has_text="normal").count() == 1
    snap(page, shots, "keys")

    # Sign out: the cookie is gone and the console asks to sign in again.
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/console/login")
    assert not [c for c in context.cookies() if c["name"] == "genhook_console"]
    page.goto("/console/tasks")
    assert page.url.endswith("/console/login")


def test_a_second_account_sees_none_of_the_first_accounts_tasks(
    context: BrowserContext, service: LiveService, shots: Path
) -> None:
    created = service.cli("accounts", "create", "second", "--json")
    assert created.returncode == 0, created.stderr
    other = json.loads(created.stdout)["api_key"]
    page = context.new_page()
    sign_in(page, service.api_key)
    page.goto("/console/tasks")
    mine = page.locator("#task-table tbody a").all_inner_texts()
    assert mine
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/console/login")

    sign_in(page, other)
    page.goto("/console/tasks")
    assert page.locator("#task-table tbody a").count() == 0
    snap(page, shots, "tasks-second-account")
    response = page.goto(f"/console/tasks/{mine[0]}")
    assert response is not None and response.status == 404
    page.goto("/console/deliveries")
    assert page.locator(".delivery").count() == 0
