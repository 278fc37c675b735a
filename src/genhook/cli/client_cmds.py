"""Client-side commands: ``listen``, ``submit``, ``result``, ``wait`` and ``models``.

They use only the SDK (``genhook.client``), so they work on the bare ``pip install genhook``.
The root app registers them with ``register(app)``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import mimetypes
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from genhook.cli._output import print_table
from genhook.client import (
    EDIT_MODEL,
    Client,
    GenhookError,
    ModelInfo,
    Prediction,
    WaitTimeout,
    WebhookVerifier,
    lora,
)
from genhook.client._client import Kind
from genhook.client._credentials import local_credentials
from genhook.client._images import file_item, image_items, is_media_field, is_url
from genhook.client._listen import Delivery, Listener
from genhook.media import CONTENT_TYPES, sniff_image_format
from genhook.priorities import Priority
from genhook.schema_marks import NO_EFFECT
from genhook.statuses import TaskStatus
from genhook.task_states import UNSUCCESSFUL

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

BASE_URL = typer.Option(
    None, "--base-url", envvar="GENHOOK_BASE_URL", help="Service URL (default 127.0.0.1:8000)."
)
API_KEY = typer.Option(
    None,
    "--api-key",
    envvar="GENHOOK_API_KEY",
    help="API key (default: the local service's credentials.json).",
)
AS_JSON = typer.Option(False, "--json", help="Print the raw JSON answer.")
VERBOSE = typer.Option(False, "--verbose", "-v", help="Also print a transcript's timed segments.")
OUTPUT_DIR = typer.Option(
    None,
    "--output-dir",
    "-o",
    help="Save every output of the finished task in this directory and print the paths.",
    file_okay=False,
)
KINDS: tuple[Kind, ...] = ("image", "video", "audio")

# Exit codes of submit --wait / wait: scripts can tell a failed task from an unfinished one.
EXIT_TASK_FAILED = 1
EXIT_WAIT_TIMEOUT = 2
EXIT_REQUEST_ERROR = 3


def register(app: typer.Typer) -> None:
    """Add the client commands to the root ``genhook`` app."""
    app.command("listen")(listen)
    app.command("submit")(submit)
    app.command("result")(result)
    app.command("wait")(wait)
    app.command("models")(models)
    from genhook.cli import watch_cmds

    watch_cmds.register(app)


def resolve_api_key(api_key: str | None, base_url: str | None) -> str | None:
    """``--api-key`` or ``$GENHOOK_API_KEY`` if given, else the local service's key.

    Says on stderr where a discovered key came from, so a wrong one is easy to spot.
    """
    if api_key:
        return api_key
    found = local_credentials(base_url)
    if found is None:
        return None
    data, path = found
    err_console.print(f"[dim]using the API key from {escape(str(path))}[/dim]", soft_wrap=True)
    return str(data["api_key"])


@contextlib.contextmanager
def open_client(api_key: str | None, base_url: str | None) -> Iterator[Client]:
    """The SDK client of one command, with the key ``resolve_api_key`` finds; an API error
    inside the block is printed with its field errors and ends the command with exit 3."""
    with Client(resolve_api_key(api_key, base_url), base_url=base_url) as client:
        try:
            yield client
        except GenhookError as exc:
            raise _fail_request(exc) from None


def _fail_request(exc: GenhookError) -> typer.Exit:
    status = f"HTTP {exc.status_code}: " if exc.status_code else ""
    err_console.print(f"[red]error:[/red] {status}{escape(exc.message)}")
    for item in exc.errors:
        if item.message == exc.message:
            continue  # the one field error the message already is
        err_console.print(f"  [yellow]{escape(item.field)}[/yellow]: {escape(item.message)}")
    return typer.Exit(EXIT_REQUEST_ERROR)


def _status_style(status: str) -> str:
    return {
        TaskStatus.COMPLETED: "green",
        "OK": "green",
        TaskStatus.FAILED: "red",
        TaskStatus.TIMEOUT: "red",
        TaskStatus.CANCELED: "red",
    }.get(status, "yellow")


def print_prediction(prediction: Prediction, as_json: bool, verbose: bool = False) -> None:
    """A task as labelled lines; a transcript's text (and with ``verbose`` its timed
    segments), since that text is what a transcription is run for."""
    if as_json:
        console.print_json(json.dumps(prediction.raw))
        return
    rows: list[tuple[str, str]] = []
    style = _status_style(prediction.status)
    rows.append(("id", prediction.id))
    rows.append(("model", prediction.model))
    rows.append(("status", f"[{style}]{prediction.status}[/{style}]"))
    if prediction.created_at:
        rows.append(("created_at", prediction.created_at))
    for index, url in enumerate(prediction.outputs):
        flags = prediction.has_nsfw_contents
        nsfw = " [red](nsfw)[/red]" if index < len(flags) and flags[index] else ""
        rows.append((f"output {index}", escape(url) + nsfw))
    if prediction.error_code is not None or prediction.error:
        rows.append(
            ("error", f"[red]{prediction.error_code}[/red] {escape(prediction.error or '')}")
        )
    stt = prediction.stt_result
    if stt is not None:
        rows.append(("transcript", escape(stt.text.strip())))
        rows.append(("language", f"{stt.language} ({stt.language_probability:.2f})"))
        if verbose:
            for segment in stt.segments:
                span = f"{segment.start:7.2f} → {segment.end:7.2f}"
                rows.append(("segment", f"{span}  {escape(segment.text.strip())}"))
    if prediction.info:
        rows.append(("info", escape(json.dumps(prediction.info, ensure_ascii=False))))
    if prediction.outputs_expire_at:
        rows.append(("outputs expire", prediction.outputs_expire_at))
    if "get" in prediction.urls:
        rows.append(("result", prediction.urls["get"]))
    # One line per value, never folded or cut: ids and URLs are pasted into other commands.
    for label, value in rows:
        console.print(f"[bold]{label:<11}[/bold] {value}", soft_wrap=True)


def _parse_field(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``, the value parsed as JSON if it can be; a media field (``audio``,
    ``image``, ``video``) given a local file's path gets that file as a data URL."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"expected KEY=VALUE, got {text!r}")
    if is_media_field(key) and not is_url(value):
        path = Path(value).expanduser()
        if path.is_file():
            return key, _read_file(path)
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _read_file(value: str | Path) -> str:
    try:
        return file_item(value)
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {value}: {exc.strerror or exc}") from None


def _submit_kind(client: Client, model: str, kind: str | None) -> Kind:
    """The submit path the model's catalogue entry names first, unless ``--kind`` is given."""
    if kind is not None:
        if kind not in KINDS:
            raise typer.BadParameter("kind must be image, video or audio")
        return kind
    info = client.model(model)
    for path in info.submit_paths:
        for each in KINDS:
            if path.lower().endswith("generate" + each):
                return each
    raise typer.BadParameter(f"the catalogue names no submit path for {model}; give --kind")


def _output_name(task_id: str, index: int, url: str, content_type: str | None) -> str:
    """``<task id>-<n><ext>``: the extension from the URL, else from the content type."""
    suffix = Path(httpx.URL(url).path).suffix if "://" in url else ""
    if not suffix and content_type:
        suffix = mimetypes.guess_extension(content_type.split(";")[0].strip()) or ""
    return f"{task_id}-{index}{suffix or '.bin'}"


def save_outputs(prediction: Prediction, directory: Path) -> list[Path]:
    """Write every output of ``prediction`` into ``directory``: URLs are downloaded (the URL
    is the credential, no key is sent), data URLs and raw base64 strings decoded."""
    directory.mkdir(parents=True, exist_ok=True)
    saved: list[Path] = []
    for index, url in enumerate(prediction.outputs):
        if url.startswith(("http://", "https://")):
            with httpx.stream("GET", url, timeout=60, follow_redirects=True) as response:
                if response.status_code != 200:
                    raise ValueError(f"output {index} answered HTTP {response.status_code}: {url}")
                content_type = response.headers.get("content-type")
                path = directory / _output_name(prediction.id, index, url, content_type)
                with path.open("wb") as file:
                    for chunk in response.iter_bytes():
                        file.write(chunk)
        else:
            header, _, encoded = url.rpartition(",")
            data = base64.b64decode(encoded)
            mime = header[5:].split(";")[0] if header.startswith("data:") else None
            fmt = sniff_image_format(data)
            path = directory / _output_name(
                prediction.id, index, "", mime or (CONTENT_TYPES[fmt] if fmt else None)
            )
            path.write_bytes(data)
        saved.append(path)
    return saved


def _print_saved(paths: list[Path], as_json: bool) -> None:
    for path in paths:
        # With --json stdout holds only the JSON answer; the paths go to stderr.
        (err_console if as_json else console).print(f"saved {escape(str(path))}", soft_wrap=True)


def _finish(
    prediction: Prediction, output_dir: Path | None, as_json: bool, verbose: bool = False
) -> None:
    """Print a task, save its outputs when asked, and exit 1 if it did not succeed."""
    print_prediction(prediction, as_json, verbose)
    if output_dir is not None and prediction.status == TaskStatus.COMPLETED:
        try:
            _print_saved(save_outputs(prediction, output_dir), as_json)
        except (httpx.HTTPError, OSError, ValueError) as exc:
            err_console.print(f"[red]error:[/red] saving the outputs: {escape(str(exc))}")
            raise typer.Exit(EXIT_REQUEST_ERROR) from None
    _exit_for(prediction)


def _wait_with_progress(client: Client, task_id: str, timeout: float, as_json: bool) -> Prediction:
    started = time.monotonic()
    with console.status(f"waiting for {task_id}", spinner="dots") as status:

        def on_update(prediction: Prediction) -> None:
            elapsed = time.monotonic() - started
            status.update(f"{task_id}: [bold]{prediction.status}[/bold] ({elapsed:.1f} s)")

        try:
            return client.wait(task_id, timeout=timeout, on_update=None if as_json else on_update)
        except WaitTimeout as exc:
            err_console.print(f"[yellow]{escape(exc.message)}[/yellow]")
            print_prediction(exc.last, as_json)
            raise typer.Exit(EXIT_WAIT_TIMEOUT) from None


def _exit_for(prediction: Prediction) -> None:
    if prediction.status in UNSUCCESSFUL:
        raise typer.Exit(EXIT_TASK_FAILED)


def submit(
    prompt: str | None = typer.Option(
        None,
        "--prompt",
        "-p",
        help="The prompt: the edit, the text to speak; models without one take none.",
    ),
    image: list[str] = typer.Option(
        [], "--image", "-i", help="Image file, URL or data URL; repeat for several (1..10)."
    ),
    audio: str | None = typer.Option(
        None, "--audio", help="Audio (or video) file, URL or data URL to transcribe."
    ),
    model: str = typer.Option(EDIT_MODEL, "--model", "-m"),
    kind: str | None = typer.Option(
        None,
        "--kind",
        help="image, video or audio submit path (default: the model's own, from the catalogue).",
    ),
    size: str | None = typer.Option(None, "--size", help="WIDTH*HEIGHT, e.g. 2048*2048."),
    output_format: str | None = typer.Option(
        None, "--output-format", help="The model's format, e.g. jpeg, png, mp3, wav."
    ),
    webhook_url: str | None = typer.Option(None, "--webhook-url", help="https callback URL."),
    loras: list[str] = typer.Option(
        [],
        "--lora",
        help="A local model's LoRA adapter, NAME or NAME:SCALE (film:0.8), or a URL where "
        "the service allows them; repeat for several.",
    ),
    field: list[str] = typer.Option(
        [],
        "--field",
        "-f",
        help="Extra body field KEY=VALUE (VALUE parsed as JSON if it can; a file path for "
        "an audio or image field is sent as that file).",
    ),
    idempotency_key: str | None = typer.Option(
        None, "--idempotency-key", help="Makes a resubmit return the first task (24 h)."
    ),
    start_deadline: float | None = typer.Option(
        None, "--start-deadline", help="Seconds; a task not started by then ends timeout."
    ),
    priority: Priority | None = typer.Option(
        None,
        "--priority",
        case_sensitive=False,
        help="Order among the account's own waiting tasks (default normal; a key may be bounded).",
    ),
    wait_for_it: bool = typer.Option(False, "--wait", help="Wait for the terminal state."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds --wait waits at most."),
    output_dir: Path | None = OUTPUT_DIR,
    base_url: str | None = BASE_URL,
    api_key: str | None = API_KEY,
    as_json: bool = AS_JSON,
    verbose: bool = VERBOSE,
) -> None:
    """Submit a task (an image edit by default) and print it; --wait follows it to the end."""
    if output_dir is not None and not wait_for_it:
        raise typer.BadParameter("--output-dir needs --wait (or use: genhook wait ID -o DIR)")
    fields: dict[str, Any] = {}
    if prompt is not None:
        fields["prompt"] = prompt
    if image:
        try:
            fields["images"] = image_items(image)
        except OSError as exc:
            raise typer.BadParameter(f"cannot read image: {exc}") from None
    if audio is not None:
        fields["audio"] = _read_file(audio)
    for name, value in (("size", size), ("output_format", output_format)):
        if value is not None:
            fields[name] = value
    if webhook_url is not None:
        fields["webhook_url"] = webhook_url
    if loras:
        try:
            fields["loras"] = [lora(item) for item in loras]
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--lora") from None
    fields.update(_parse_field(item) for item in field)
    with open_client(api_key, base_url) as client:
        created = client.submit(
            model,
            kind=_submit_kind(client, model, kind),
            idempotency_key=idempotency_key,
            start_deadline=start_deadline,
            priority=priority,
            **fields,
        )
        if not wait_for_it:
            print_prediction(created, as_json)
            return
        if not as_json:
            console.print(f"submitted [bold]{created.id}[/bold]")
        final = _wait_with_progress(client, created.id, timeout, as_json)
    _finish(final, output_dir, as_json, verbose)


def result(
    task_id: str = typer.Argument(..., help="The task id."),
    output_dir: Path | None = OUTPUT_DIR,
    base_url: str | None = BASE_URL,
    api_key: str | None = API_KEY,
    as_json: bool = AS_JSON,
    verbose: bool = VERBOSE,
) -> None:
    """Print a task's current state (a transcript's text); with -o, save the outputs."""
    with open_client(api_key, base_url) as client:
        prediction = client.result(task_id)
    if output_dir is None:
        print_prediction(prediction, as_json, verbose)
        return
    if not prediction.done:
        print_prediction(prediction, as_json, verbose)
        err_console.print("[yellow]the task has not ended: nothing to save yet[/yellow]")
        raise typer.Exit(EXIT_WAIT_TIMEOUT)
    _finish(prediction, output_dir, as_json, verbose)


def wait(
    task_id: str = typer.Argument(..., help="The task id."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait at most."),
    output_dir: Path | None = OUTPUT_DIR,
    base_url: str | None = BASE_URL,
    api_key: str | None = API_KEY,
    as_json: bool = AS_JSON,
    verbose: bool = VERBOSE,
) -> None:
    """Poll a task with backoff until it ends; exit 1 if it failed, 2 if still running."""
    with open_client(api_key, base_url) as client:
        prediction = _wait_with_progress(client, task_id, timeout, as_json)
    _finish(prediction, output_dir, as_json, verbose)


def models(
    model_id: str | None = typer.Argument(None, help="Show one model, with its fields."),
    base_url: str | None = BASE_URL,
    api_key: str | None = API_KEY,
    as_json: bool = AS_JSON,
) -> None:
    """List the service's models: kind, submit path, price and deadline."""
    with open_client(api_key, base_url) as client:
        found = [client.model(model_id)] if model_id else client.models()
    if as_json:
        raw = [m.raw for m in found]
        console.print_json(json.dumps(raw[0] if model_id else {"models": raw}))
        return
    table = Table("model", "kind", "submit to", "price", "deadline")
    for info in found:
        table.add_row(
            escape(info.id),
            info.kind,
            "\n".join(info.submit_paths),
            escape(str(info.pricing.get("summary", ""))),
            f"{info.deadline_seconds:g} s" if info.deadline_seconds is not None else "",
        )
    print_table(console, table)
    if model_id:
        print_model_fields(found[0])


def _field_type(prop: dict[str, Any]) -> dict[str, Any]:
    """A property with a nullable ``anyOf`` folded into its one non-null member."""
    members = [p for p in prop.get("anyOf", []) if p.get("type") != "null"]
    return {**members[0], **{k: v for k, v in prop.items() if k != "anyOf"}} if members else prop


def _choice_names(values: list[Any]) -> list[str]:
    """``["a", ...]`` as is; ``[{"voice": "joe", "language": "en-us", ...}]`` as
    ``joe (en-us, ...)``: the value to send first, what it is in brackets."""
    names = []
    for value in values:
        if isinstance(value, dict) and value:
            first, *rest = value.values()
            extra = ", ".join(str(v) for v in rest if v != first)
            names.append(f"{first} ({extra})" if extra else str(first))
        else:
            names.append(str(value))
    return names


def print_model_fields(info: ModelInfo) -> None:
    """What a user can send a model: each field's type or choices, bounds and default; the
    named values (voices, styles); and the fields that do nothing on this model, apart."""
    console.print(escape(info.description))
    properties = info.request_schema.get("properties", {})
    required = set(info.request_schema.get("required", []))
    fields = Table("field", "type or choices", "bounds", "default", "required", "about")
    inert: list[str] = []
    for name, raw in properties.items():
        if name == "model":
            continue  # the id above
        if raw.get(NO_EFFECT):
            inert.append(name)
            continue
        prop = _field_type(raw)
        kind = str(prop.get("type", ""))
        if "enum" in prop:
            kind = " | ".join(map(str, prop["enum"]))
        elif kind == "array":
            kind = f"list of {prop.get('items', {}).get('type', 'values')}"
        for key in (name, name + "s"):  # voice: the voices listed below
            if key in info.choices:
                kind = f"{kind}, one of the {key} below"
        bounds = ""
        low = prop.get("minimum", prop.get("minLength", prop.get("minItems")))
        high = prop.get("maximum", prop.get("maxLength", prop.get("maxItems")))
        if low is not None or high is not None:
            unit = " chars" if "maxLength" in prop else " items" if "maxItems" in prop else ""
            bounds = f"{'' if low is None else low}..{'' if high is None else high}{unit}"
        default = json.dumps(prop["default"]) if "default" in prop else ""
        fields.add_row(
            name,
            escape(kind),
            bounds,
            escape(default),
            "yes" if name in required else "",
            escape(str(prop.get("description", ""))),
        )
    print_table(console, fields)
    for key, values in info.choices.items():
        if isinstance(values, list):
            names = _choice_names(values)
            console.print(
                f"[bold]{escape(key)}[/bold] ({len(names)}): " + escape(", ".join(names)),
                soft_wrap=True,
            )
        else:
            console.print(f"[bold]{escape(key)}[/bold]: {escape(str(values))}", soft_wrap=True)
    if inert:
        console.print(f"[dim]accepted, no effect on this model: {escape(', '.join(inert))}[/dim]")


def print_delivery(delivery: Delivery, show_body: bool) -> None:
    clock = datetime.fromtimestamp(delivery.received_at).strftime("%H:%M:%S")
    event = delivery.event
    if event is not None:
        kid = f" kid {event.key_id}" if event.key_id else ""
        check = f"[green]✔ verified {event.scheme}{kid}[/green]"
    elif delivery.error is not None:
        check = f"[red]✘ {delivery.error.reason.value}[/red] {escape(delivery.error.message)}"
    else:
        check = "[yellow]not verified[/yellow]"
    console.print(f"[dim]{clock}[/dim] {delivery.method} {escape(delivery.path)}  {check}")
    data: dict[str, Any] | None = event.raw if event is not None else None
    if data is None:
        try:
            parsed = json.loads(delivery.body)
            data = parsed if isinstance(parsed, dict) else None
        except ValueError:
            data = None
    if data is not None:
        payload = data.get("payload") if isinstance(data.get("payload"), dict) else {}
        assert isinstance(payload, dict)
        status = str(data.get("status", "?"))
        style = _status_style(status)
        console.print(
            f"  [bold]{escape(str(data.get('event_type', '?')))}[/bold]  "
            f"task [bold]{escape(str(data.get('session_id', '?')))}[/bold]  "
            f"[{style}]{escape(status)}[/{style}] / {escape(str(payload.get('status', '?')))}"
        )
        outputs = payload.get("outputs")
        for url in outputs if isinstance(outputs, list) else []:
            console.print(f"  → {escape(str(url))}", soft_wrap=True)
        if data.get("error") or payload.get("error_code") is not None:
            code = payload.get("error_code")
            console.print(f"  [red]error {code}[/red]: {escape(str(data.get('error', '')))}")
    if show_body:
        console.print(escape(delivery.body.decode("utf-8", "replace")))
    if delivery.forwarded_status is not None:
        style = "green" if delivery.forwarded_status < 300 else "red"
        console.print(
            f"  forwarded → [{style}]{delivery.forwarded_status}[/{style}] "
            f"({delivery.forward_ms or 0:.0f} ms)"
        )
    elif delivery.forward_error is not None:
        console.print(f"  [red]forward failed[/red]: {escape(delivery.forward_error)}")
    console.print(f"  answered {delivery.answered}")


def listen(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to receive on."),
    port: int = typer.Option(4242, "--port", help="Port to receive on (0 picks one)."),
    forward_to: str | None = typer.Option(
        None, "--forward-to", help="Re-POST each delivery's exact bytes and headers here."
    ),
    jwks_url: str | None = typer.Option(
        None, "--jwks-url", help="Key set URL (default: <base-url>/api/v1/webhooks/jwks.json)."
    ),
    hmac_secret: str | None = typer.Option(
        None, "--hmac-secret", envvar="GENHOOK_SIGNING_SECRET", help="Account signing secret."
    ),
    ed25519: bool = typer.Option(True, "--ed25519/--no-ed25519", help="Verify Ed25519."),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="Verify deliveries at all."),
    forward_unverified: bool = typer.Option(
        False, "--forward-unverified", help="Forward deliveries that fail verification too."
    ),
    brand: str = typer.Option(
        "Service", "--brand", envvar="GENHOOK_WEBHOOK_HEADER_BRAND", help="Header brand."
    ),
    tolerance: float = typer.Option(300.0, "--tolerance", help="Replay window, seconds."),
    max_deliveries: int = typer.Option(
        0, "--max-deliveries", help="Exit after this many deliveries (0: run until Ctrl-C)."
    ),
    print_body: bool = typer.Option(False, "--print-body", help="Print each raw body."),
    base_url: str | None = BASE_URL,
) -> None:
    """Receive webhook deliveries locally, verify and print them, optionally forward them."""
    verifier: WebhookVerifier | None = None
    keys_url: str | None = None
    if verify:
        if ed25519:
            service = (base_url or "http://127.0.0.1:8000").rstrip("/")
            keys_url = jwks_url or f"{service}/api/v1/webhooks/jwks.json"
        if keys_url is None and not hmac_secret:
            raise typer.BadParameter("--no-ed25519 needs --hmac-secret (or use --no-verify)")
        verifier = WebhookVerifier(
            jwks_url=keys_url, hmac_secret=hmac_secret, tolerance=tolerance, brand=brand
        )
    done = _Countdown(max_deliveries)

    def on_delivery(delivery: Delivery) -> None:
        print_delivery(delivery, print_body)
        done.tick()

    listener = Listener(
        verifier=verifier,
        on_delivery=on_delivery,
        forward_to=forward_to,
        forward_unverified=forward_unverified,
        host=host,
        port=port,
    )
    checks = []
    if keys_url:
        checks.append(f"Ed25519 keys from {keys_url}")
    if verifier is not None and hmac_secret:
        checks.append("HMAC secret")
    console.print(f"[bold]Ready![/bold] Listening on {listener.url}", soft_wrap=True)
    console.print(
        "  verifying with " + (" and ".join(checks) if checks else "nothing"), soft_wrap=True
    )
    if forward_to:
        console.print(f"  forwarding to {forward_to}", soft_wrap=True)
    listener.start()
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        listener.close()


class _Countdown:
    """Blocks ``wait`` until ``tick`` was called ``limit`` times (forever when limit is 0)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._count = 0
        self._event = threading.Event()

    def tick(self) -> None:
        self._count += 1
        if self.limit and self._count >= self.limit:
            self._event.set()

    def wait(self) -> None:
        while not self._event.wait(0.5):
            pass
