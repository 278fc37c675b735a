"""OpenTelemetry traces, opt-in through the standard ``OTEL_*`` environment variables.

Off unless ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``) or an OTLP
endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), or a
tracer provider is already installed in the process (``opentelemetry-instrument``). Off, this
module imports nothing from OpenTelemetry and every hook is a flag test, so the SDK is an
optional extra (``genhook[otel]``).

One trace per task, across the processes that handle it: the submit request (an HTTP server
span whose parent is the caller's ``traceparent``), the time in the queue, the task's run in a
worker with the engine run (its progress reports as events) and the output blob writes, and
every webhook attempt (an HTTP client span). The submit span's context is stored with the task
(``tasks.trace_context``) and copied into its delivery rows, which is how a worker and a
dispatcher, other processes, continue it; the webhook POST carries ``traceparent`` so the
receiver's trace continues too.

Attributes follow the HTTP semantic conventions and name tasks, models and destinations only:
no prompt, image, key, secret, URL path or query (a receiver's URL often holds a token) ever
goes into a span.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from genhook import __version__

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
    from yarl import URL

    from genhook.db.models import Task
    from genhook.sender.queue import Outcome, Outgoing

__all__ = [
    "batch_call",
    "begin_task",
    "enabled",
    "end_task",
    "fastapi_options",
    "instrument_app",
    "setup",
    "span",
    "steps",
    "task_context",
    "task_run",
    "wanted",
    "webhook_attempt",
    "within",
]

_ROLES = frozenset({"api", "worker", "dispatcher"})
# Requests that are not work: probes and scrapes would drown the traces that matter.
_UNTRACED = frozenset({"/healthz", "/readyz", "/metrics"})

_tracer: Tracer | None = None


def enabled() -> bool:
    return _tracer is not None


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def _installed_provider() -> bool:
    """A provider someone installed before us (``opentelemetry-instrument``, a host); looked
    up only when OpenTelemetry is already imported, so an untraced process imports nothing."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return False
    provider = api.get_tracer_provider()
    return not isinstance(provider, api.ProxyTracerProvider | api.NoOpTracerProvider)


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "otlp":
        protocol = (
            environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        ).strip()
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            return GrpcExporter()
        if protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter as HttpExporter,
            )

            return HttpExporter()
        raise RuntimeError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: genhook exports traces over "
            "'http/protobuf' or 'grpc'"
        )
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    raise RuntimeError(f"OTEL_TRACES_EXPORTER={name!r}: use otlp, console or none")


def setup(role: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Start tracing in a role's process when asked to; returns whether it is on.

    A missing SDK, or an exporter or protocol it does not know, stops the role with a clear
    message rather than running untraced while the operator believes otherwise.
    """
    global _tracer
    if role not in _ROLES or _tracer is not None:
        return _tracer is not None
    installed = _installed_provider()
    if not installed and not wanted(environ):
        return False
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise RuntimeError(
            "OTEL_* asks for traces but the OpenTelemetry SDK is not installed: "
            "pip install 'genhook[otel]'"
        ) from exc
    if not installed:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attributes = {"service.version": __version__, "genhook.role": role}
        if not environ.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = "genhook"
        provider = TracerProvider(resource=Resource.create(attributes))
        names = environ.get("OTEL_TRACES_EXPORTER", "otlp") or "otlp"
        for name in filter(None, (n.strip().lower() for n in names.split(","))):
            provider.add_span_processor(BatchSpanProcessor(_exporter(name, environ)))
        trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("genhook", __version__)
    return True


def _w3c_extract(carrier: Mapping[str, str]) -> Context:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier)


def _w3c_inject(carrier: MutableMapping[str, str]) -> None:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    TraceContextTextMapPropagator().inject(carrier)


def _fail(span: Span, error_type: str) -> None:
    from opentelemetry.trace import StatusCode

    span.set_attribute("error.type", error_type)
    span.set_status(StatusCode.ERROR)


# -- api ------------------------------------------------------------------------------------


def fastapi_options() -> dict[str, Any]:
    """FastAPI's own telemetry off, in the FastAPI versions that have it: the API's server
    spans are this module's, one per request, with its redactions; FastAPI's would add a
    second server span and record validation failures with the values sent (prompts)."""
    import inspect

    from fastapi import FastAPI

    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    off = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}
    return {"telemetry": off}


def instrument_app(app: Any) -> None:
    """HTTP server spans for the API's requests, when tracing is on."""
    if _tracer is not None:
        app.add_middleware(_ServerSpans)


class _ServerSpans:
    """A pure ASGI middleware: one server span per request, parented on its ``traceparent``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _UNTRACED or _tracer is None:
            await self.app(scope, receive, send)
            return
        from opentelemetry.trace import SpanKind

        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in (b"traceparent", b"tracestate")
        }
        method = scope["method"]
        server = scope.get("server") or ("", None)
        # No url.path: a path can be a capability (an output's key, a callback's token), so
        # a request is named by its route template (http.route) alone, set once it matched.
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", "1.1"),
        }
        if server[0]:
            attributes["server.address"] = server[0]
        if server[1]:
            attributes["server.port"] = server[1]
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with _tracer.start_as_current_span(
            method,
            context=_w3c_extract(carrier),
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                await self.app(scope, receive, send_status)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if isinstance(route, str):
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    _fail(span, str(status))


def task_context(task_id: str, model: str) -> str | None:
    """The ``traceparent`` to store with a task being created (None when untraced); names
    the task on the submit request's span."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    current = trace.get_current_span()
    if not current.get_span_context().is_valid:
        return None
    current.set_attribute("genhook.task.id", task_id)
    current.set_attribute("genhook.model", model)
    carrier: dict[str, str] = {}
    _w3c_inject(carrier)
    return carrier.get("traceparent")


# -- worker ---------------------------------------------------------------------------------


def _task_parent(trace_context: str | None) -> Context | None:
    return _w3c_extract({"traceparent": trace_context}) if trace_context else None


def begin_task(task: Task) -> Span | None:
    """The task's time in the queue (from when it became runnable to its claim), ended now,
    and its ``genhook.task.run`` span, begun now and returned (None when untraced): the
    caller makes it current (``within``) where work of the task alone runs, and ends it."""
    if _tracer is None:
        return None
    parent = _task_parent(task.trace_context)
    attributes: dict[str, str | int] = {
        "genhook.task.id": task.id,
        "genhook.model": task.model,
        "genhook.task.attempt": task.attempts,
    }
    queued = _tracer.start_span(
        "genhook.task.queued",
        context=parent,
        start_time=task.available_at * 1_000_000,
        attributes=attributes,
    )
    queued.end()
    return _tracer.start_span("genhook.task.run", context=parent, attributes=attributes)


@contextlib.contextmanager
def within(run: Span | None) -> Iterator[None]:
    """``run`` current while the body runs, so the engine and blob spans nest in it."""
    if run is None:
        yield
        return
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    token = otel_context.attach(trace.set_span_in_context(run))
    try:
        yield
    finally:
        otel_context.detach(token)


def end_task(run: Span | None) -> None:
    if run is not None:
        run.end()


@contextlib.contextmanager
def task_run(task: Task) -> Iterator[None]:
    """``begin_task``'s run span, current while the body runs, then ended."""
    run = begin_task(task)
    try:
        with within(run):
            yield
    finally:
        end_task(run)


@contextlib.contextmanager
def batch_call(runs: Sequence[Span | None], attributes: Mapping[str, str | int]) -> Iterator[None]:
    """One ``genhook.engine.run`` span for a call shared by a batch's tasks, current while
    the body runs, linked with each task's run span (both ways): each task keeps a trace
    of its own, and the shared call is found from any of them."""
    if _tracer is None:
        yield
        return
    from opentelemetry.trace import Link

    live = [run for run in runs if run is not None]
    links = [Link(run.get_span_context()) for run in live]
    with _tracer.start_as_current_span(
        "genhook.engine.run",
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as call:
        for run in live:
            run.add_link(call.get_span_context())
        try:
            yield
        except BaseException as exc:
            _fail(call, type(exc).__qualname__)
            raise


@contextlib.contextmanager
def span(name: str, attributes: Mapping[str, str | int | float] | None = None) -> Iterator[None]:
    """A child of the current span (the engine run, a blob write); an exception marks it
    failed by its type alone, since engine messages may quote the request."""
    if _tracer is None:
        yield
        return
    with _tracer.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield
        except BaseException as exc:
            _fail(current, type(exc).__qualname__)
            raise


def steps(report: Callable[..., None]) -> Callable[..., None]:
    """An engine's progress reports, also as events of the span current where the engine
    reports (the engine run's; the thread it runs in has a copy of the context)."""
    if _tracer is None:
        return report
    from opentelemetry import trace

    def traced(progress: float | None = None, log: str | None = None) -> None:
        attributes = {} if progress is None else {"genhook.progress": float(progress)}
        trace.get_current_span().add_event("genhook.engine.step", attributes)
        report(progress, log)

    return traced


# -- dispatcher -----------------------------------------------------------------------------

Post = Callable[["Outgoing", "URL", Any, "dict[str, str] | None"], Awaitable["Outcome"]]


async def webhook_attempt(attempt: Outgoing, url: URL, session: Any, post: Post) -> Outcome:
    """One delivery attempt as an HTTP client span in the task's trace (its context came
    with the delivery row); the POST carries its ``traceparent``. Only the destination
    (scheme, host, port) is recorded, never the path."""
    assert _tracer is not None
    from opentelemetry.trace import SpanKind

    parent = _task_parent(attempt.trace_context)
    attributes: dict[str, str | int] = {
        "http.request.method": "POST",
        "url.scheme": url.scheme,
        "server.address": url.host or "",
        "server.port": url.port or 0,
        "genhook.webhook.destination": attempt.destination or f"{url.scheme}://{url.host}",
        "genhook.webhook.attempt": attempt.attempts + 1,
        "genhook.webhook.event": attempt.event_type,
        "genhook.delivery.id": attempt.id,
        "genhook.task.id": attempt.task_id,
    }
    with _tracer.start_as_current_span(
        "POST",
        context=parent,
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        headers = dict(attempt.headers)
        _w3c_inject(headers)
        outcome = await post(attempt, url, session, headers)
        if outcome.status_code is not None:
            current.set_attribute("http.response.status_code", outcome.status_code)
            if not 200 <= outcome.status_code < 300:
                _fail(current, str(outcome.status_code))
        elif outcome.error is not None:
            _fail(current, "timeout" if outcome.error.startswith("timeout") else "connection")
        return outcome
