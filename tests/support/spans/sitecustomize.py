"""Imported at start-up by the Python processes a tracing test starts (this folder first on
their PYTHONPATH). With ``GENHOOK_TEST_SPANS`` set it installs an OpenTelemetry tracer
provider whose in-memory exporter also appends every finished span, one JSON line each, to
that file, so the test sees the spans of the api, worker and dispatcher processes alike;
``genhook.tracing`` uses a provider installed before it. It then runs the netguard's
``sitecustomize``, which this one shadows, so the services stay on loopback."""

import os

_path = os.environ.get("GENHOOK_TEST_SPANS")
if _path:
    import json
    import sys

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    class _Shared(InMemorySpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            lines = []
            for span in spans:
                parent = span.parent
                lines.append(
                    json.dumps(
                        {
                            "name": span.name,
                            "kind": span.kind.name,
                            "trace_id": f"{span.context.trace_id:032x}",
                            "span_id": f"{span.context.span_id:016x}",
                            "parent_id": f"{parent.span_id:016x}" if parent else None,
                            "start": span.start_time,
                            "end": span.end_time,
                            "status": span.status.status_code.name,
                            "attributes": dict(span.attributes or {}),
                            "events": [
                                {"name": e.name, "attributes": dict(e.attributes or {})}
                                for e in span.events
                            ],
                            "pid": os.getpid(),
                            "argv": sys.argv,
                        }
                    )
                )
            # One write per batch in append mode: lines of several processes never interleave.
            with open(_path, "a", encoding="utf-8") as out:
                out.write("".join(line + "\n" for line in lines))
            return super().export(spans)

    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(_Shared()))
    trace.set_tracer_provider(_provider)

_netguard = os.path.join(os.path.dirname(os.path.dirname(__file__)), "netguard", "sitecustomize.py")
with open(_netguard, encoding="utf-8") as _source:
    exec(compile(_source.read(), _netguard, "exec"), {"__file__": _netguard, "__name__": __name__})
