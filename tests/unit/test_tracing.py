"""genhook.tracing's switch: the OTEL_* variables that turn traces on, nothing imported when
they do not, and a clear refusal of an exporter or protocol it cannot honour."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from genhook import tracing


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_SERVICE_NAME": "genhook"}, False),
    ],
)
def test_which_variables_turn_traces_on(environ: dict[str, str], expected: bool) -> None:
    assert tracing.wanted(environ) is expected


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GENHOOK_TEST"))}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_off_imports_nothing_from_opentelemetry() -> None:
    done = _run(
        """
        import sys
        from genhook import tracing
        from genhook.tasks.worker import Worker
        from genhook.sender.dispatcher import Dispatcher
        for role in ("worker", "dispatcher"):
            assert tracing.setup(role) is False
        assert not tracing.enabled()
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        assert not loaded, loaded
        """
    )
    assert done.returncode == 0, done.stderr


def test_on_starts_the_sdk_in_the_roles_only() -> None:
    done = _run(
        """
        import sys
        from genhook import tracing
        assert tracing.setup("serve") is False
        assert tracing.setup("worker") is True and tracing.enabled()
        from opentelemetry import trace
        provider = trace.get_tracer_provider()
        resource = provider.resource.attributes
        assert resource["service.name"] == "genhook", resource
        assert resource["genhook.role"] == "worker", resource
        assert "opentelemetry.exporter.otlp.proto.grpc" in sys.modules
        """,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "use otlp, console or none"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "'http/protobuf' or 'grpc'",
        ),
    ],
)
def test_an_exporter_it_cannot_honour_stops_the_role(env: dict[str, str], message: str) -> None:
    done = _run("from genhook import tracing; tracing.setup('api')", **env)
    assert done.returncode != 0
    assert message in done.stderr
