"""The console over ASGI on SQLite and PostgreSQL: its session cookie and CSRF checks, that it
shows one account nothing of another's, the form built from a request schema, and the
account-scoped key endpoints it manages keys through."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from starlette.datastructures import FormData

from genhook.accounts import create_account, create_key, revoke_key
from genhook.console.routes import build_body, form_fields, snippets
from genhook.console.session import COOKIE
from genhook.engines.audio._requests import TextToSpeechRequest
from genhook.engines.edit_request import ALLOWED_SIZES, EditRequest
from genhook.sender.keys import ensure_signing_key, rotate_signing_key
from tests.conftest import Harness, make_harness, make_settings
from tests.support.images import data_url, image_bytes


async def signed_in(harness: Harness, api_key: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(transport=harness.client._transport, base_url="http://testserver")
    response = await client.post("/console/login", data={"api_key": api_key})
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/console/play"
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    return client


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match is not None
    return match.group(1)


async def test_a_wrong_key_is_refused_and_pages_ask_to_sign_in(harness: Harness) -> None:
    client = harness.client
    response = await client.post("/console/login", data={"api_key": "ghk_wrong"})
    assert response.status_code == 401
    assert "invalid or revoked API key" in response.text
    assert "set-cookie" not in response.headers
    for path in ("/console/play", "/console/tasks", "/console/deliveries", "/console/keys"):
        response = await client.get(path)
        assert response.status_code == 303
        assert response.headers["location"] == "/console/login"
    # A cookie the server never issued is no session, nor is the key itself as a cookie.
    for forged in ("A" * 43, harness.account.api_key):
        response = await client.get("/console/tasks", headers={"Cookie": f"{COOKIE}={forged}"})
        assert response.headers["location"] == "/console/login"
    response = await client.get("/console/tasks", headers={"Cookie": f"{COOKIE}={forged}"})
    assert response.headers["location"] == "/console/login"


async def test_posts_need_the_session_csrf_token_and_the_same_origin(harness: Harness) -> None:
    client = await signed_in(harness, harness.account.api_key)
    page = (await client.get("/console/keys")).text
    token = csrf_of(page)
    refused = await client.post("/console/keys", data={"name": "x"})
    assert refused.status_code == 403
    refused = await client.post(
        "/console/keys", data={"name": "x", "csrf": token}, headers={"Origin": "http://evil"}
    )
    assert refused.status_code == 403
    keys = await harness.client.get("/api/v1/keys", headers=harness.headers)
    assert len(keys.json()["keys"]) == 1
    name = "<img src=x onerror=alert(1)>"
    created = await client.post("/console/keys", data={"name": name, "csrf": token})
    assert created.status_code == 200
    assert re.search(r'<pre id="new-key">ghk_', created.text)
    assert "&lt;img src=x onerror=alert(1)&gt;" in created.text and name not in created.text
    signed_out = await client.post("/console/logout", data={"csrf": token})
    assert signed_out.status_code == 303
    assert f'{COOKIE}=""' in signed_out.headers["set-cookie"]


async def test_the_console_shows_one_account_nothing_of_another(harness: Harness) -> None:
    response = await harness.submit(
        {"model": "test/fake-edit", "prompt": "<b>edit</b>", "images": [data_url()]}
    )
    task_id = response.json()["id"]
    await harness.run_all()
    other = await create_account(harness.state.db, "other")
    mine = await signed_in(harness, harness.account.api_key)
    theirs = await signed_in(harness, other.api_key)

    page = await mine.get(f"/console/tasks/{task_id}")
    assert page.status_code == 200
    assert "Content-Security-Policy" in page.headers
    assert task_id in (await mine.get("/console/tasks")).text

    assert task_id not in (await theirs.get("/console/tasks")).text
    assert (await theirs.get(f"/console/tasks/{task_id}")).status_code == 404
    assert (await theirs.get(f"/console/tasks/{task_id}/events")).status_code == 404
    token = csrf_of((await theirs.get("/console/tasks")).text)
    cancel = await theirs.post(f"/console/tasks/{task_id}/cancel", data={"csrf": token})
    assert cancel.status_code == 404
    # Their key page lists only their key; revoking one of ours is a 404.
    ours = (await harness.client.get("/api/v1/keys", headers=harness.headers)).json()["keys"]
    revoke = await theirs.post(f"/console/keys/{ours[0]['id']}/revoke", data={"csrf": token})
    assert revoke.status_code == 404
    assert ours[0]["id"] not in (await theirs.get("/console/keys")).text


async def test_the_event_stream_of_a_finished_task_ends_with_its_result(harness: Harness) -> None:
    response = await harness.submit(
        {"model": "test/fake-edit", "prompt": "edit", "images": [data_url()]}
    )
    task_id = response.json()["id"]
    await harness.run_all()
    client = await signed_in(harness, harness.account.api_key)
    stream = await client.get(f"/console/tasks/{task_id}/events")
    assert stream.status_code == 200
    assert stream.text.startswith("id: completed:")
    assert "event: completed" in stream.text


def test_the_form_follows_the_request_schema() -> None:
    edit = {f["name"]: f for f in form_fields(EditRequest.model_json_schema())}
    assert edit["images"]["control"] == "file" and edit["images"]["multiple"] is True
    assert edit["output_format"]["control"] == "select"
    assert edit["output_format"]["options"] == ["jpeg", "png"]
    # The allowed sizes are choices, the default among them.
    assert edit["size"]["control"] == "select"
    assert edit["size"]["options"] == list(ALLOWED_SIZES)
    assert edit["size"]["default"] == "2048*2048"
    assert edit["prompt"]["control"] == "textarea" and edit["prompt"]["required"]
    assert edit["enable_base64_output"]["control"] == "checkbox"
    assert "webhook_url" not in edit and "model" not in edit
    tts = {f["name"]: f for f in form_fields(TextToSpeechRequest.model_json_schema())}
    assert tts["speed"]["control"] == "range"
    assert (tts["speed"]["min"], tts["speed"]["max"]) == (0.5, 2.0)
    assert tts["sample_rate"]["control"] == "number"


async def test_the_body_is_typed_and_the_snippets_carry_it() -> None:
    model = {
        "id": "genhook/text-to-speech",
        "request_schema": TextToSpeechRequest.model_json_schema(),
    }
    form = httpx.QueryParams(
        {"prompt": "Hi 'there'", "speed": "1.5", "sample_rate": "16000", "output_format": "wav"}
    )
    body = await build_body(model, FormData(form.multi_items()))
    assert body == {
        "model": "genhook/text-to-speech",
        "prompt": "Hi 'there'",
        "speed": 1.5,
        "sample_rate": 16000,
        "output_format": "wav",
        "enable_base64_output": False,
    }
    code = snippets("http://127.0.0.1:8000", "/api/v1/model/generateAudio", body)
    assert "http://127.0.0.1:8000/api/v1/model/generateAudio" in code["curl"]
    assert "Hi '\"'\"'there'\"'\"'" in code["curl"]  # shell-quoted
    compiled = compile(code["python"], "<snippet>", "exec")
    assert compiled is not None


async def test_an_admin_key_sees_every_account_and_others_get_403(
    tmp_path: Path, database_url: str
) -> None:
    settings = make_settings(tmp_path, database_url)
    harness = await make_harness(settings)
    try:
        other = await create_account(harness.state.db, "other")
        harness.state.settings.admin_accounts.append(harness.account.account_id)
        theirs = {"Authorization": f"Bearer {other.api_key}"}
        body = {"model": "test/fake-edit", "prompt": "edit", "images": [data_url()]}
        submitted = await harness.client.post(
            "/api/v1/model/generateImage", json=body, headers=theirs
        )
        task_id = submitted.json()["id"]

        refused = await harness.client.get("/api/v1/admin/results", headers=theirs)
        assert refused.status_code == 403
        assert "GENHOOK_ADMIN_ACCOUNTS" in refused.json()["message"]
        assert (
            await harness.client.get("/api/v1/admin/deliveries", headers=theirs)
        ).status_code == 403

        listed = await harness.client.get("/api/v1/admin/results", headers=harness.headers)
        assert [(t["id"], t["account_id"]) for t in listed.json()["items"]] == [
            (task_id, other.account_id)
        ]
        only = await harness.client.get(
            "/api/v1/admin/results",
            params={"account": harness.account.account_id},
            headers=harness.headers,
        )
        assert only.json()["items"] == []

        admin = await signed_in(harness, harness.account.api_key)
        assert task_id not in (await admin.get("/console/tasks")).text
        assert task_id in (await admin.get("/console/tasks?scope=all")).text
        plain = await signed_in(harness, other.api_key)
        page = await plain.get("/console/tasks?scope=all")
        assert "admin accounts" in page.text and task_id not in page.text
    finally:
        await harness.client.aclose()
        await harness.state.db.dispose()


async def test_a_delivery_message_shows_the_body_and_headers_to_its_account_only(
    harness: Harness,
) -> None:
    body = {
        "model": "test/fake-edit",
        "prompt": "edit",
        "images": [data_url()],
        "webhook_url": "http://127.0.0.1:9/hook",
    }
    task_id = (await harness.submit(body)).json()["id"]
    await harness.run_all()
    listed = await harness.client.get(
        "/api/v1/webhooks/deliveries", params={"session_id": task_id}, headers=harness.headers
    )
    delivery = listed.json()["data"][0]
    message = await harness.client.get(
        f"/api/v1/webhooks/deliveries/{delivery['id']}/message", headers=harness.headers
    )
    assert message.status_code == 200
    assert message.json()["headers"]["X-Service-Webhook-Id"] == task_id
    assert task_id in json.dumps(message.json()["body"])
    other = await create_account(harness.state.db, "other")
    refused = await harness.client.get(
        f"/api/v1/webhooks/deliveries/{delivery['id']}/message",
        headers={"Authorization": f"Bearer {other.api_key}"},
    )
    assert refused.status_code == 404
    client = await signed_in(harness, harness.account.api_key)
    page = await client.get(f"/console/tasks/{task_id}")
    assert "X-Service-Webhook-Signature" in page.text and 'class="webhook-body"' in page.text


async def test_the_timeline_counts_runs_and_shows_on_the_task_page(harness: Harness) -> None:
    body = {"model": "test/fake-edit", "prompt": "edit", "images": [data_url()]}
    task_id = (await harness.submit(body)).json()["id"]
    waiting = await harness.client.get(
        f"/api/v1/model/result/{task_id}/timeline", headers=harness.headers
    )
    assert waiting.json()["started_at"] is None and waiting.json()["attempts"] == 0
    await harness.run_all()
    ended = (
        await harness.client.get(
            f"/api/v1/model/result/{task_id}/timeline", headers=harness.headers
        )
    ).json()
    assert ended["status"] == "completed" and ended["attempts"] == 1
    assert ended["lease_losses"] == 0 and ended["ended_at"] >= ended["started_at"]
    other = await create_account(harness.state.db, "other")
    refused = await harness.client.get(
        f"/api/v1/model/result/{task_id}/timeline",
        headers={"Authorization": f"Bearer {other.api_key}"},
    )
    assert refused.status_code == 404
    client = await signed_in(harness, harness.account.api_key)
    page = (await client.get(f"/console/tasks/{task_id}")).text
    assert f"Started {ended['started_at']} (run 1)" in page
    assert f"Ended (completed) {ended['ended_at']}" in page


async def test_the_signing_key_rotation_state_is_listed_and_shown(harness: Harness) -> None:
    settings, db = harness.state.settings, harness.state.db
    await ensure_signing_key(db, settings)
    first = await harness.client.get("/api/v1/webhooks/signing-keys", headers=harness.headers)
    assert first.status_code == 200
    [old] = first.json()["keys"]
    assert (old["status"], old["published"], old["retire_at"]) == ("active", True, None)
    new_kid = await rotate_signing_key(db, settings)
    state = (
        await harness.client.get("/api/v1/webhooks/signing-keys", headers=harness.headers)
    ).json()
    assert state["mode"] == settings.webhook_signing
    by_kid = {k["kid"]: k for k in state["keys"]}
    assert by_kid[new_kid]["status"] == "active"
    assert by_kid[old["kid"]]["status"] == "rotated" and by_kid[old["kid"]]["published"]
    assert by_kid[old["kid"]]["retire_at"] is not None
    assert "private" not in json.dumps(state)
    client = await signed_in(harness, harness.account.api_key)
    page = (await client.get("/console/keys")).text
    assert new_kid in page and old["kid"] in page and "rotated" in page


async def test_a_key_created_in_the_console_can_be_revoked_there(harness: Harness) -> None:
    client = await signed_in(harness, harness.account.api_key)
    token = csrf_of((await client.get("/console/keys")).text)
    created = await client.post("/console/keys", data={"name": "ci", "csrf": token})
    new_key = re.search(r'<pre id="new-key">(ghk_[^<]+)</pre>', created.text)
    assert new_key is not None
    auth = {"Authorization": f"Bearer {new_key.group(1)}"}
    assert (await harness.client.get("/api/v1/keys", headers=auth)).status_code == 200
    listed = (await harness.client.get("/api/v1/keys", headers=harness.headers)).json()["keys"]
    key_id = next(k["id"] for k in listed if k["name"] == "ci")
    revoked = await client.post(f"/console/keys/{key_id}/revoke", data={"csrf": token})
    assert revoked.status_code == 303
    assert (await harness.client.get("/api/v1/keys", headers=auth)).status_code == 401
    page = (await client.get("/console/keys")).text
    assert page.count("/revoke") == 1  # only the signed-in key is left to revoke


async def test_sign_out_and_revocation_end_a_session_even_for_a_copied_cookie(
    harness: Harness,
) -> None:
    client = await signed_in(harness, harness.account.api_key)
    cookie = client.cookies[COOKIE]
    assert harness.account.api_key not in cookie
    copied = {"Cookie": f"{COOKIE}={cookie}"}
    assert (await harness.client.get("/console/tasks", headers=copied)).status_code == 200
    token = csrf_of((await client.get("/console/keys")).text)
    assert (await client.post("/console/logout", data={"csrf": token})).status_code == 303
    # The cookie copied before sign-out no longer signs anyone in.
    after = await harness.client.get("/console/tasks", headers=copied)
    assert after.status_code == 303 and after.headers["location"] == "/console/login"
    # Revoking a key ends the sessions signed in with it, at once.
    second = await create_key(harness.state.db, harness.account.account_id, "second")
    other = await signed_in(harness, second.api_key)
    assert (await other.get("/console/tasks")).status_code == 200
    await revoke_key(harness.state.db, second.key_id)
    revoked = await other.get("/console/tasks")
    assert revoked.status_code == 303 and revoked.headers["location"] == "/console/login"


def _client_from(
    app: object, address: str, headers: dict[str, str] | None = None
) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 40000))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://testserver", headers=headers)


async def test_sign_in_is_throttled_per_client_key_and_per_account(harness: Harness) -> None:
    app = harness.client._transport.app  # type: ignore[attr-defined]
    key = {"api_key": harness.account.api_key}
    # A stranger's wrong keys behind the users' own (proxy or NAT) address.
    shared = _client_from(app, "10.0.0.1")
    for _ in range(10):
        response = await shared.post("/console/login", data={"api_key": "ghk_wrongkey"})
        assert response.status_code == 401
    refused = await shared.post("/console/login", data={"api_key": "ghk_wrongkey"})
    assert refused.status_code == 429
    assert 0 < int(refused.headers["retry-after"]) <= 300
    # The same address with another key is not held back by them.
    assert (await shared.post("/console/login", data=key)).status_code == 303
    # The account is, past 10 new sessions, from any address.
    for number in range(2, 11):
        response = await _client_from(app, f"10.0.0.{number}").post("/console/login", data=key)
        assert response.status_code == 303, response.text
    refused = await _client_from(app, "10.0.0.99").post("/console/login", data=key)
    assert refused.status_code == 429


async def test_forwarded_addresses_count_only_from_a_trusted_proxy(tmp_path: Path) -> None:
    async def throttled_after_ten(app: object, spoofed: bool) -> bool:
        """Ten failures, each claiming another forwarded address, from one connection."""
        for number in range(11):
            forwarded = {"X-Forwarded-For": f"203.0.113.{number if spoofed else 7}"}
            client = _client_from(app, "10.0.0.1", forwarded)
            response = await client.post("/console/login", data={"api_key": "ghk_wrongkey"})
            if response.status_code == 429:
                return True
        return False

    for trusted, expected in (([], True), (["10.0.0.0/8"], False)):
        settings = make_settings(
            tmp_path / str(bool(trusted)),
            f"sqlite+aiosqlite:///{tmp_path}/{bool(trusted)}.db",
            trusted_proxies=trusted,
        )
        harness = await make_harness(settings)
        try:
            app = harness.client._transport.app  # type: ignore[attr-defined]
            # Untrusted, the header is ignored: all eleven tries are the connection's.
            # Trusted, each forwarded client is counted on its own.
            assert await throttled_after_ten(app, spoofed=True) is expected
            if trusted:
                assert await throttled_after_ten(app, spoofed=False) is True
        finally:
            await harness.client.aclose()
            await harness.state.db.dispose()


async def test_the_root_leads_to_the_console_and_the_site_has_an_icon(
    harness: Harness, tmp_path: Path
) -> None:
    response = await harness.client.get("/")
    assert response.status_code == 307 and response.headers["location"] == "/console"
    icon = await harness.client.get("/favicon.ico")
    assert icon.status_code == 200
    assert icon.headers["content-type"] == "image/vnd.microsoft.icon"
    # An ICO directory of one 32x32 image, a PNG inside.
    assert icon.content[:6] == b"\x00\x00\x01\x00\x01\x00" and icon.content[6:8] == b"\x20\x20"
    assert icon.content[22:30] == b"\x89PNG\r\n\x1a\n"
    # With the console off, the root leads to the API reference instead.
    settings = make_settings(
        tmp_path / "off", f"sqlite+aiosqlite:///{tmp_path / 'off.db'}", console_enabled=False
    )
    off = await make_harness(settings)
    try:
        response = await off.client.get("/")
        assert response.status_code == 307 and response.headers["location"] == "/docs"
        assert (await off.client.get(response.headers["location"])).status_code == 200
    finally:
        await off.client.aclose()
        await off.state.db.dispose()


async def test_the_task_page_reads_the_plan_and_shows_the_apis_own_answer(
    harness: Harness,
) -> None:
    body = {
        "model": "genhook/image-edit",
        "prompt": "black and white, then add a red border",
        "images": [data_url(size=64)],
        "size": "1024*1024",
    }
    task_id = (await harness.submit(body)).json()["id"]
    await harness.run_all()
    answered = (
        await harness.client.get(f"/api/v1/model/result/{task_id}", headers=harness.headers)
    ).json()
    assert answered["status"] == "completed", answered
    plan = answered["info"]["plan"]
    assert all(isinstance(step, dict) and "op" in step for step in plan), plan
    client = await signed_in(harness, harness.account.api_key)
    page = (await client.get(f"/console/tasks/{task_id}")).text
    listed = page.split('<ol class="plan">')[1].split("</ol>")[0]
    # Each step in words (the operation, then its settings), never a raw dict.
    assert "{" not in listed and "&#34;" not in listed and "&quot;" not in listed, listed
    for step in plan:
        assert f"<strong>{step['op'].replace('_', ' ')}</strong>" in listed
    # The JSON shown is the API's answer: absolute output URLs, as a client receives them.
    shown = page.split("The result as the API returns it</h2>")[1]
    assert answered["outputs"] and answered["outputs"][0].startswith("http")
    for url in answered["outputs"]:
        assert json.dumps(url) in shown.replace("&#34;", '"').replace("&quot;", '"')
    # The task list shows each task's model, prompt, state and cost beside its id.
    usage = (await harness.client.get("/api/v1/usage", headers=harness.headers)).json()
    [charged] = [item for item in usage["items"] if item["task_id"] == task_id]
    listing = (await client.get("/console/tasks")).text
    row = next(line for line in listing.splitlines() if f"<code>{task_id}</code>" in line)
    assert "genhook/image-edit" in row and "completed" in row
    assert f'<td class="cost">{charged["amount_usd"]}</td>' in row
    assert ">black and white, then add a red border</td>" in row


async def test_the_play_form_offers_priority_and_a_key_bound_is_shown_there(
    harness: Harness,
) -> None:
    bounded = await create_key(harness.state.db, harness.account.account_id, max_priority=0)
    client = await signed_in(harness, bounded.api_key)
    page = (await client.get("/console/play/test/fake-edit")).text
    assert '<select id="f-priority" name="priority">' in page
    assert '<option value="normal" selected>normal</option>' in page
    token = csrf_of(page)
    png = ("a.png", image_bytes(), "image/png")
    form = {"csrf": token, "prompt": "edit", "size": "1024*1024", "action": "submit"}
    refused = await client.post(
        "/console/play/test/fake-edit",
        data={**form, "priority": "high"},
        files={"images": png},
    )
    assert refused.status_code == 403
    assert "may ask for normal or lower" in refused.text
    made = await client.post(
        "/console/play/test/fake-edit", data={**form, "priority": "low"}, files={"images": png}
    )
    assert made.status_code == 303
    task_id = made.headers["location"].rsplit("/", 1)[1]
    assert (await harness.result(task_id))["priority"] == "low"
    listing = (await client.get("/console/tasks")).text
    assert "(low priority)" in listing


async def test_a_key_made_in_the_console_may_be_bounded(harness: Harness) -> None:
    client = await signed_in(harness, harness.account.api_key)
    token = csrf_of((await client.get("/console/keys")).text)
    created = await client.post(
        "/console/keys", data={"name": "batch", "max_priority": "low", "csrf": token}
    )
    assert created.status_code == 200
    assert '<td class="max-priority">low</td>' in created.text
    assert '<td class="max-priority">any</td>' in created.text


async def test_the_queue_page_shows_the_weight_and_who_holds_the_workers(
    tmp_path: Path, database_url: str
) -> None:
    harness = await make_harness(make_settings(tmp_path, database_url))
    try:
        other = await create_account(harness.state.db, "other")
        theirs = {"Authorization": f"Bearer {other.api_key}"}
        body = {"model": "test/fake-edit", "prompt": "edit", "images": [data_url()]}
        for _ in range(2):
            await harness.client.post("/api/v1/model/generateImage", json=body, headers=theirs)
        plain = await signed_in(harness, harness.account.api_key)
        page = (await plain.get("/console/queue")).text
        assert '<td class="weight">1</td><td class="waiting">0</td>' in page
        assert "Every account" not in page and other.account_id not in page
        harness.state.settings.admin_accounts.append(harness.account.account_id)
        admin = (await plain.get("/console/queue")).text
        assert 'id="queue-table"' in admin
        assert f"<code>{other.account_id}</code></a></td><td>1</td><td>2</td><td>0</td>" in admin
        mine = await signed_in(harness, other.api_key)
        own = (await mine.get("/console/queue")).text
        assert '<td class="waiting">2</td>' in own and "Every account" not in own
    finally:
        await harness.client.aclose()
        await harness.state.db.dispose()
