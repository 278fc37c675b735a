"""The web console at ``/console``: a playground and an operator's view.

Every page acts through the public API with the signed-in key, over an in-process HTTP
client, so the console shows and does exactly what that key may through the API and nothing
more. Pages are server-rendered; a small ES module adds live task updates, drag-and-drop,
copy buttons and the transcript highlight.
"""

from __future__ import annotations

import base64
import functools
import json
import shlex
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import FormData, UploadFile

from genhook.accounts import authenticate, key_prefix
from genhook.api.deps import AppState
from genhook.api.routes_watch import event_response
from genhook.console.session import (
    COOKIE,
    SignInThrottle,
    check_csrf,
    clear_session,
    close_session,
    csrf_token,
    open_session,
    same_origin,
    session_key,
    set_session,
)
from genhook.errors import NotFound
from genhook.statuses import DeliveryStatus
from genhook.task_states import POLLED_STATUSES, is_terminal
from genhook.tasks.store.reads import owned_task, task_prompts

if TYPE_CHECKING:
    # Imported where used: httpx pulls its command line (rich, click, pygments) along,
    # tens of MB an API process would hold for a console nobody may open.
    import httpx
    from fastapi.templating import Jinja2Templates

HERE = Path(__file__).parent
router = APIRouter(prefix="/console", include_in_schema=False)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "media-src 'self' data: blob:; connect-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
# What a task list may filter on: the states polling shows.
STATUSES = list(POLLED_STATUSES)


class Console:
    def __init__(self, state: AppState) -> None:
        self.state = state
        self.throttle = SignInThrottle()


def _console(request: Request) -> Console:
    console: Console = request.app.state.genhook_console
    return console


async def _key(request: Request) -> str | None:
    """The signed-in session's API key, or None."""
    return await session_key(_console(request).state.db, request.cookies.get(COOKIE))


async def _api(
    request: Request,
    method: str,
    path: str,
    key: str,
    *,
    json_body: Any = None,
    params: dict[str, str] | None = None,
) -> httpx.Response:
    """One call of the public API as the signed-in key, through the app's own routes."""
    import httpx

    transport = httpx.ASGITransport(app=request.app)
    base = f"{request.url.scheme}://{request.url.netloc}"
    async with httpx.AsyncClient(transport=transport, base_url=base) as client:
        return await client.request(
            method,
            path,
            headers={"Authorization": f"Bearer {key}"},
            json=json_body,
            params=params,
        )


def _local(request: Request, url: str) -> str:
    """Output URLs under this service become same-origin paths, which the CSP allows."""
    base = _console(request).state.settings.resolved_public_base_url
    if url.startswith(base + "/"):
        return url[len(base) :]
    parts = urlsplit(url)
    if parts.path.startswith("/api/v1/outputs/"):
        return parts.path
    return url


@functools.cache
def _templates() -> Jinja2Templates:
    """Loaded on the first page: an API process whose console nobody opens holds no Jinja."""
    from fastapi.templating import Jinja2Templates

    return Jinja2Templates(directory=str(HERE / "templates"))


def _page(request: Request, name: str, key: str | None, status: int = 200, **ctx: Any) -> Response:
    context = {
        "signed_in": key is not None,
        "csrf": csrf_token(request.cookies.get(COOKIE, "")) if key else "",
        "path": request.url.path,
        **ctx,
    }
    return _templates().TemplateResponse(
        request, name, context, status_code=status, headers=PAGE_HEADERS
    )


def _to_login() -> Response:
    return RedirectResponse("/console/login", status_code=303)


async def _form(request: Request) -> tuple[str, FormData] | Response:
    """The signed-in key and the form of a state-changing post, after the CSRF checks."""
    key = await _key(request)
    if key is None:
        return _to_login()
    form = await request.form()
    token = form.get("csrf")
    if not same_origin(request) or not check_csrf(
        request.cookies.get(COOKIE, ""), token if isinstance(token, str) else None
    ):
        return Response("cross-site request refused", status_code=403, headers=PAGE_HEADERS)
    return key, form


def _error_text(response: httpx.Response) -> tuple[str, list[dict[str, Any]]]:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}", []
    return str(body.get("message", response.status_code)), list(body.get("errors") or [])


# Sign in and out.


@router.get("/login")
async def login_page(request: Request) -> Response:
    return _page(request, "login.html", None, error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    if not same_origin(request):
        return Response("cross-site request refused", status_code=403, headers=PAGE_HEADERS)
    console = _console(request)
    form = await request.form()
    key = str(form.get("api_key") or "").strip()
    if not key:
        return _page(request, "login.html", None, 422, error="Enter an API key.")
    address = request.client.host if request.client else ""
    client = f"client:{address} {key_prefix(key)}"
    wait = console.throttle.wait_seconds(client)
    if wait:
        return _too_many_sign_ins(request, wait)
    response = await _api(request, "GET", "/api/v1/models", key)
    if response.status_code != 200:
        console.throttle.count(client)
        message, _ = _error_text(response)
        return _page(request, "login.html", None, 401, error=message)
    account = "account:" + (await authenticate(console.state.db, f"Bearer {key}")).id
    wait = console.throttle.wait_seconds(account)
    if wait:
        return _too_many_sign_ins(request, wait)
    token = await open_session(console.state.db, key)
    if token is None:  # revoked between the two looks
        return _page(request, "login.html", None, 401, error="invalid or revoked API key")
    console.throttle.count(account)
    redirect = RedirectResponse("/console/play", status_code=303)
    set_session(redirect, request, token)
    return redirect


def _too_many_sign_ins(request: Request, wait: int) -> Response:
    response = _page(
        request,
        "login.html",
        None,
        429,
        error=f"Too many sign-in attempts; try again in {wait} seconds.",
    )
    response.headers["Retry-After"] = str(wait)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    checked = await _form(request)
    if isinstance(checked, Response):
        return checked
    await close_session(_console(request).state.db, request.cookies.get(COOKIE))
    redirect = RedirectResponse("/console/login", status_code=303)
    clear_session(redirect, request)
    return redirect


@router.get("")
async def home(request: Request) -> Response:
    return RedirectResponse("/console/play" if await _key(request) else "/console/login", 303)


# Playground.


async def _models(request: Request, key: str) -> list[dict[str, Any]] | None:
    response = await _api(request, "GET", "/api/v1/models", key)
    if response.status_code != 200:
        return None
    models: list[dict[str, Any]] = response.json()["models"]
    return models


@router.get("/play")
async def play_index(request: Request) -> Response:
    key = await _key(request)
    if key is None:
        return _to_login()
    models = await _models(request, key)
    if models is None:
        return _to_login()
    return _page(request, "models.html", key, models=models)


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """Follows ``$ref`` and folds an ``anyOf`` with null (an optional field) into its type."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return {
            **schema.get("$defs", {}).get(name, {}),
            **{k: v for k, v in node.items() if k != "$ref"},
        }
    if "anyOf" in node:
        kinds = [n for n in node["anyOf"] if n.get("type") != "null"]
        if len(kinds) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            return {**_resolve(schema, kinds[0]), **rest}
    return node


MEDIA_WORDS = ("image", "audio")


def form_fields(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The request schema as form controls: enums as selects, bounded numbers as sliders,
    image and audio inputs (and fields whose schema gives a ``contentMediaType``) as file
    pickers with URL fields, objects as JSON text."""
    required = set(schema.get("required", []))
    fields: list[dict[str, Any]] = []
    for name, raw in schema.get("properties", {}).items():
        if name in {"model", "webhook_url"}:
            continue
        node = _resolve(schema, raw)
        kind = node.get("type")
        items = _resolve(schema, node.get("items", {})) if kind == "array" else {}
        field: dict[str, Any] = {
            "name": name,
            "label": node.get("title") or name.replace("_", " ").capitalize(),
            "help": node.get("description", ""),
            "required": name in required,
            "default": node.get("default"),
        }
        media = next((f"{w}/*" for w in MEDIA_WORDS if w in name), None)
        # A schema may say a field is a file (a predictor's inputs): its contentMediaType.
        declared = node.get("contentMediaType") or items.get("contentMediaType")
        if declared:
            media = "*/*" if declared == "application/octet-stream" else declared
        adapters = _resolve(schema, items.get("properties", {}).get("name", {}))
        if kind == "array" and "enum" in adapters:
            # Named choices with a scale each (a local model's LoRA adapters): one number per
            # name, left blank for a choice not used.
            scale = _resolve(schema, items.get("properties", {}).get("scale", {}))
            field.update(
                control="scales",
                options=adapters["enum"],
                min=scale.get("minimum"),
                max=scale.get("maximum"),
                max_items=node.get("maxItems"),
            )
        elif media and (kind == "string" or items.get("type") == "string"):
            field.update(
                control="file",
                accept="" if media == "*/*" else media,
                multiple=kind == "array",
                max_items=node.get("maxItems"),
            )
        elif "enum" in node or "enum" in items:
            field.update(control="select", options=node.get("enum") or items.get("enum"))
        elif kind == "boolean":
            field.update(control="checkbox")
        elif kind in {"integer", "number"}:
            low = node.get("minimum", node.get("exclusiveMinimum"))
            high = node.get("maximum", node.get("exclusiveMaximum"))
            step = 1 if kind == "integer" else "any"
            if low is not None and high is not None:
                field.update(control="range", min=low, max=high, step=step)
            else:
                field.update(control="number", min=low, max=high, step=step)
        elif kind == "string":
            long_text = name in {"prompt", "text", "negative_prompt"}
            field.update(control="textarea" if long_text else "text", max=node.get("maxLength"))
        else:
            field.update(control="json")
        fields.append(field)
    return fields


async def _data_url(upload: UploadFile) -> str | None:
    content = await upload.read()
    if not content:
        return None
    mime = upload.content_type or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(content).decode('ascii')}"


async def build_body(model: dict[str, Any], form: FormData) -> dict[str, Any]:
    """The JSON request the form describes; values the API validates are passed on as typed."""
    body: dict[str, Any] = {"model": model["id"]}
    for field in form_fields(model["request_schema"]):
        name = field["name"]
        control = field["control"]
        if control == "file":
            values: list[str] = []
            for upload in form.getlist(name):
                if isinstance(upload, UploadFile) and (url := await _data_url(upload)):
                    values.append(url)
            typed = str(form.get(name + "__urls") or "")
            values += [line.strip() for line in typed.splitlines() if line.strip()]
            if values:
                body[name] = values if field["multiple"] else values[0]
            continue
        if control == "scales":
            chosen: list[dict[str, Any]] = []
            for option in field["options"]:
                typed = str(form.get(f"{name}__{option}") or "").strip()
                if typed:
                    try:
                        chosen.append({"name": option, "scale": float(typed)})
                    except ValueError:
                        chosen.append({"name": option, "scale": typed})  # the API names it
            if chosen:
                body[name] = chosen
            continue
        value = form.get(name)
        if control == "checkbox":
            if field["default"] is not None or value is not None:
                body[name] = value is not None
            continue
        if not isinstance(value, str) or value == "":
            continue
        if control in {"range", "number"}:
            try:
                body[name] = float(value) if "." in value or "e" in value else int(value)
            except ValueError:
                body[name] = value  # the API names the field in its 422
        elif control == "json":
            try:
                body[name] = json.loads(value)
            except ValueError:
                body[name] = value
        else:
            body[name] = value
    webhook = str(form.get("webhook_url") or "").strip()
    if webhook:
        body["webhook_url"] = webhook
    return body


def snippets(base: str, path: str, body: dict[str, Any]) -> dict[str, str]:
    """The exact request as curl and as Python with the SDK-free httpx client."""
    text = json.dumps(body, indent=2)
    curl = (
        f"curl -s {shlex.quote(base + path)} \\\n"
        "  -H \"Authorization: Bearer $GENHOOK_API_KEY\" -H 'Content-Type: application/json' \\\n"
        f"  --data-binary {shlex.quote(text)}"
    )
    python = (
        "import os\n\nimport httpx\n\n"
        f"body = {text}\n"
        f"response = httpx.post(\n    {base + path!r},\n    json=body,\n"
        '    headers={"Authorization": f"Bearer {os.environ[\'GENHOOK_API_KEY\']}"},\n'
        "    timeout=120,\n)\nprint(response.json())\n"
    )
    return {"curl": curl, "python": python}


async def _model(request: Request, key: str, model_id: str) -> dict[str, Any] | None:
    response = await _api(request, "GET", f"/api/v1/models/{model_id}", key)
    if response.status_code != 200:
        return None
    model: dict[str, Any] = response.json()
    return model


@router.get("/play/{model_id:path}")
async def play(request: Request, model_id: str) -> Response:
    key = await _key(request)
    if key is None:
        return _to_login()
    model = await _model(request, key, model_id)
    if model is None:
        return _page(request, "error.html", key, 404, message=f"no model {model_id!r}")
    return _page(
        request,
        "play.html",
        key,
        model=model,
        fields=form_fields(model["request_schema"]),
        values={},
        errors=[],
        message=None,
        code=None,
    )


@router.post("/play/{model_id:path}")
async def submit(request: Request, model_id: str) -> Response:
    checked = await _form(request)
    if isinstance(checked, Response):
        return checked
    key, form = checked
    model = await _model(request, key, model_id)
    if model is None:
        return _page(request, "error.html", key, 404, message=f"no model {model_id!r}")
    body = await build_body(model, form)
    path = model["submit_paths"][0]
    fields = form_fields(model["request_schema"])
    values = {k: v for k, v in form.items() if isinstance(v, str)}
    if form.get("action") == "preview":
        base = f"{request.url.scheme}://{request.url.netloc}"
        return _page(
            request,
            "play.html",
            key,
            model=model,
            fields=fields,
            values=values,
            errors=[],
            message=None,
            code=snippets(base, path, body),
        )
    response = await _api(request, "POST", path, key, json_body=body)
    if response.status_code != 200:
        message, errors = _error_text(response)
        return _page(
            request,
            "play.html",
            key,
            response.status_code,
            model=model,
            fields=fields,
            values=values,
            errors=errors,
            message=message,
            code=None,
        )
    return RedirectResponse(f"/console/tasks/{response.json()['id']}", status_code=303)


# Tasks.


@router.get("/tasks")
async def tasks(request: Request) -> Response:
    key = await _key(request)
    if key is None:
        return _to_login()
    query = request.query_params
    params = {
        name: query[name] for name in ("status", "model", "since", "cursor") if query.get(name)
    }
    params["limit"] = "50"
    every = query.get("scope") == "all"
    if every and query.get("account"):
        params["account"] = query["account"]
    path = "/api/v1/admin/results" if every else "/api/v1/model/results"
    response = await _api(request, "GET", path, key, params=params)
    if response.status_code == 401:
        return _to_login()
    error = None if response.status_code == 200 else _error_text(response)[0]
    page = response.json() if response.status_code == 200 else {"items": [], "next_cursor": None}
    models = await _models(request, key) or []
    state = _console(request).state
    account = await authenticate(state.db, f"Bearer {key}", state.auth_cache)
    # What each task was asked for: the listing (the API's result shape) carries no input.
    prompts = await task_prompts(
        state.db, [item["id"] for item in page["items"]], account_id=None if every else account.id
    )
    # What each task cost, from the account's usage (the listing itself carries no money).
    usage = await _api(request, "GET", "/api/v1/usage", key, params={"limit": "1000"})
    costs = (
        {item["task_id"]: item["amount_usd"] for item in usage.json()["items"]}
        if usage.status_code == 200 and not every
        else {}
    )
    return _page(
        request,
        "tasks.html",
        key,
        items=page["items"],
        costs=costs,
        prompts=prompts,
        next_cursor=page["next_cursor"],
        filters=params,
        every=every,
        statuses=STATUSES,
        models=[m["id"] for m in models],
        error=error,
    )


@router.get("/tasks/{task_id}")
async def task_page(request: Request, task_id: str) -> Response:
    key = await _key(request)
    if key is None:
        return _to_login()
    response = await _api(
        request, "GET", f"/api/v1/model/result/{task_id}", key, params={"logs": "true"}
    )
    if response.status_code == 401:
        return _to_login()
    if response.status_code != 200:
        return _page(
            request, "error.html", key, response.status_code, message=_error_text(response)[0]
        )
    answered = response.json()
    # The players load outputs from this origin; the JSON shown stays the API's own answer.
    task = {**answered, "outputs": [_local(request, url) for url in answered.get("outputs", [])]}
    deliveries = await _api(
        request, "GET", "/api/v1/webhooks/deliveries", key, params={"session_id": task_id}
    )
    usage = await _usage_lines(request, key, task_id)
    timeline = (await _api(request, "GET", f"/api/v1/model/result/{task_id}/timeline", key)).json()
    sent = deliveries.json()["data"] if deliveries.status_code == 200 else []
    for delivery in sent:
        message = await _api(
            request, "GET", f"/api/v1/webhooks/deliveries/{delivery['id']}/message", key
        )
        if message.status_code == 200:
            delivery["message"] = message.json()
    kind = (await _model(request, key, task["model"]) or {}).get("kind", "")
    return _page(
        request,
        "task.html",
        key,
        task=task,
        answered=answered,
        kind=kind,
        deliveries=sent,
        timeline=timeline,
        usage=usage,
        terminal=is_terminal(task["status"]),
    )


async def _usage_lines(request: Request, key: str, task_id: str) -> list[dict[str, Any]]:
    response = await _api(request, "GET", "/api/v1/usage", key, params={"limit": "1000"})
    if response.status_code != 200:
        return []
    return [item for item in response.json()["items"] if item["task_id"] == task_id]


@router.post("/tasks/{task_id}/cancel")
async def cancel(request: Request, task_id: str) -> Response:
    checked = await _form(request)
    if isinstance(checked, Response):
        return checked
    key, _ = checked
    response = await _api(request, "POST", f"/api/v1/model/result/{task_id}/cancel", key)
    if response.status_code not in {200, 409}:
        return _page(
            request, "error.html", key, response.status_code, message=_error_text(response)[0]
        )
    return RedirectResponse(f"/console/tasks/{task_id}", status_code=303)


@router.get("/tasks/{task_id}/events")
async def task_events(request: Request, task_id: str) -> Response:
    """The API's event stream for the session's key (an EventSource cannot send a header)."""
    key = await _key(request)
    if key is None:
        return Response(status_code=401)
    state = _console(request).state
    account = await authenticate(state.db, f"Bearer {key}", state.auth_cache)
    if await owned_task(state.db, account.id, task_id) is None:
        raise NotFound(f"no task {task_id!r}")
    return event_response(state, task_id, None, state.held.hold(account.id, f"Bearer {key}"))


# Deliveries.


@router.get("/deliveries")
async def deliveries(request: Request) -> Response:
    key = await _key(request)
    if key is None:
        return _to_login()
    every = request.query_params.get("scope") == "all"
    path = "/api/v1/admin/deliveries" if every else "/api/v1/webhooks/deliveries"
    failing: list[dict[str, Any]] = []
    for status in (DeliveryStatus.PENDING, DeliveryStatus.UNDELIVERABLE):
        response = await _api(request, "GET", path, key, params={"status": status, "limit": "100"})
        if response.status_code == 401:
            return _to_login()
        if response.status_code == 403:
            return _page(request, "error.html", key, 403, message=_error_text(response)[0])
        if response.status_code == 200:
            failing += [
                d
                for d in response.json()["data"]
                if d["status"] != DeliveryStatus.PENDING or d["attempts"]
            ]
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for delivery in failing:
        groups[urlsplit(delivery["url"]).netloc or delivery["url"]].append(delivery)
    recent = await _api(request, "GET", path, key, params={"limit": "20"})
    health = await _api(
        request,
        "GET",
        "/api/v1/admin/destinations" if every else "/api/v1/webhooks/destinations",
        key,
    )
    return _page(
        request,
        "deliveries.html",
        key,
        groups=sorted(groups.items()),
        recent=recent.json()["data"] if recent.status_code == 200 else [],
        circuits=_circuits(health.json()["data"]) if health.status_code == 200 else [],
        notice=request.query_params.get("notice"),
        every=every,
    )


def _circuits(destinations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The hosts and endpoints whose circuit is not closed, as the API shows them (an
    account's own only, every account's for the admin listing)."""
    found = []
    for host in destinations:
        for item in [host, *host["endpoints"]]:
            if item["state"] != "closed":
                found.append(
                    {
                        **item,
                        "target": item.get("endpoint") or host["destination"],
                        "account_id": host["account_id"],
                    }
                )
    return found


@router.post("/deliveries/{delivery_id}/redeliver")
async def redeliver_one(request: Request, delivery_id: str) -> Response:
    checked = await _form(request)
    if isinstance(checked, Response):
        return checked
    key, _ = checked
    response = await _api(
        request, "POST", f"/api/v1/webhooks/deliveries/{delivery_id}/redeliver", key
    )
    notice = "Redelivery queued." if response.status_code == 200 else _error_text(response)[0]
    return RedirectResponse(f"/console/deliveries?{_notice(notice)}", status_code=303)


def _notice(text: str) -> str:
    import httpx

    return str(httpx.QueryParams({"notice": text}))


def _parse_since(value: str) -> int | None:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


@router.post("/deliveries/redeliver-failed")
async def redeliver_failed(request: Request) -> Response:
    """Every undeliverable or failing delivery created since a time, one redelivery each."""
    checked = await _form(request)
    if isinstance(checked, Response):
        return checked
    key, form = checked
    since = _parse_since(str(form.get("since") or ""))
    if since is None:
        notice = "since: enter a date and time such as 2026-01-31T12:00"
        return RedirectResponse(f"/console/deliveries?{_notice(notice)}", status_code=303)
    done = failed = 0
    seen: set[str] = set()  # one just redelivered is pending now; not twice
    for status in (DeliveryStatus.UNDELIVERABLE, DeliveryStatus.PENDING):
        before: str | None = None
        while True:
            params = {"status": status, "limit": "100"}
            if before:
                params["before"] = before
            page = (
                await _api(request, "GET", "/api/v1/webhooks/deliveries", key, params=params)
            ).json()
            older = False
            for delivery in page["data"]:
                created = _parse_since(delivery["created_at"].replace("Z", "+00:00")) or 0
                if created < since:
                    older = True
                    break
                if delivery["id"] in seen or (
                    status == DeliveryStatus.PENDING and not delivery["attempts"]
                ):
                    continue
                seen.add(delivery["id"])
                path = f"/api/v1/webhooks/deliveries/{delivery['id']}/redeliver"
                if (await _api(request, "POST", path, key)).status_code == 200:
                    done += 1
                else:
                    failed += 1
            before = page.get("next_before")
            if older or not before:
                break
    notice = (
        f"{done} redelivery queued, {failed} refused."
        if done == 1
        else (f"{done} redeliveries queued, {failed} refused.")
    )
    return RedirectResponse(f"/console/deliveries?{_notice(notice)}", status_code=303)


# Keys and signing.


@router.get("/keys")
async def keys(request: Request) -> Response:
    key = await _key(request)
    if key is None:
        return _to_login()
    listed = await _api(request, "GET", "/api/v1/keys", key)
    if listed.status_code == 401:
        return _to_login()
    jwks = await _api(request, "GET", "/api/v1/webhooks/jwks.json", key)
    return _page(
        request,
        "keys.html",
        key,
        keys=listed.json()["keys"],
        jwks=jwks.json().get("keys", []) if jwks.status_code == 200 else [],
        signing=await _signing(request, key),
        new_key=None,
    )


async def _signing(request: Request, key: str) -> dict[str, Any]:
    response = await _api(request, "GET", "/api/v1/webhooks/signing-keys", key)
    signing: dict[str, Any] = response.json() if response.status_code == 200 else {}
    return signing


@router.post("/keys")
async def create_key(request: Request) -> Response:
    checked = await _form(request)
    if isinstance(checked, Response):
        return checked
    key, form = checked
    body = {"name": str(form.get("name") or "")}
    if bound := str(form.get("max_priority") or ""):
        body["max_priority"] = bound  # the API names a wrong one
    created = await _api(request, "POST", "/api/v1/keys", key, json_body=body)
    if created.status_code != 200:
        return _page(
            request, "error.html", key, created.status_code, message=_error_text(created)[0]
        )
    listed = await _api(request, "GET", "/api/v1/keys", key)
    jwks = await _api(request, "GET", "/api/v1/webhooks/jwks.json", key)
    return _page(
        request,
        "keys.html",
        key,
        keys=listed.json()["keys"],
        jwks=jwks.json().get("keys", []),
        signing=await _signing(request, key),
        new_key=created.json(),
    )


@router.post("/keys/{key_id}/revoke")
async def revoke(request: Request, key_id: str) -> Response:
    checked = await _form(request)
    if isinstance(checked, Response):
        return checked
    key, _ = checked
    response = await _api(request, "POST", f"/api/v1/keys/{key_id}/revoke", key)
    if response.status_code != 200:
        return _page(
            request, "error.html", key, response.status_code, message=_error_text(response)[0]
        )
    return RedirectResponse("/console/keys", status_code=303)


# Queue: who is waiting on whom.


@router.get("/queue")
async def queue(request: Request) -> Response:
    key = await _key(request)
    if key is None:
        return _to_login()
    own = await _api(request, "GET", "/api/v1/queue", key)
    if own.status_code == 401:
        return _to_login()
    if own.status_code != 200:
        return _page(request, "error.html", key, own.status_code, message=_error_text(own)[0])
    every = await _api(request, "GET", "/api/v1/admin/queue", key)
    accounts = every.json()["accounts"] if every.status_code == 200 else None
    return _page(
        request,
        "queue.html",
        key,
        own=own.json(),
        accounts=accounts,
        holding=[a for a in accounts or [] if a["running"]],
    )


# Usage.


@router.get("/usage")
async def usage(request: Request) -> Response:
    key = await _key(request)
    if key is None:
        return _to_login()
    items: list[dict[str, Any]] = []
    params = {"limit": "1000"}
    for _ in range(10):  # the newest 10,000 lines
        response = await _api(request, "GET", "/api/v1/usage", key, params=params)
        if response.status_code == 401:
            return _to_login()
        page = response.json()
        items += page["items"]
        if page["next_cursor"] is None:
            break
        params["cursor"] = str(page["next_cursor"])
    days: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for item in items:
        days[item["created_at"][:10]][item["model"]] += float(item["amount_usd"])
    rows = [
        {"day": day, "models": sorted(by_model.items()), "total": sum(by_model.values())}
        for day, by_model in sorted(days.items(), reverse=True)
    ]
    peak = max((row["total"] for row in rows), default=0.0) or 1.0
    models = sorted({item["model"] for item in items})
    return _page(
        request,
        "usage.html",
        key,
        rows=rows,
        peak=peak,
        models=models,
        total=page["total_usd"] if items else "0",
        task_count=len(items),
    )


def install_console(app: FastAPI, state: AppState) -> None:
    app.state.genhook_console = Console(state)
    app.include_router(router)
    app.mount("/console/static", StaticFiles(directory=str(HERE / "static")), name="console-static")
