"""Real OTLP trace receivers on loopback, over HTTP and over gRPC: each decodes every export
request with the protocol's own messages, as a collector does, and keeps them."""

from __future__ import annotations

from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.support.postgres import free_port

Requests = list[trace_service_pb2.ExportTraceServiceRequest]


def received_spans(requests: Requests) -> list[tuple[dict[str, str], Any]]:
    """(resource attributes, span) of every span received."""
    out = []
    for request in list(requests):
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                out.extend((resource, span) for span in scope_spans.spans)
    return out


class OtlpHttpCollector:
    """``endpoint`` is what ``OTEL_EXPORTER_OTLP_ENDPOINT`` names; ``requests`` what came."""

    def __init__(self) -> None:
        self.requests: Requests = []
        self.refused: list[str] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                kind = self.headers.get("Content-Type")
                if self.path != "/v1/traces" or kind != "application/x-protobuf":
                    collector.refused.append(f"{self.path} {kind}")
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector.requests.append(request)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def spans(self) -> list[tuple[dict[str, str], Any]]:
        return received_spans(self.requests)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class OtlpGrpcCollector(trace_service_pb2_grpc.TraceServiceServicer):
    """The same over gRPC (the TraceService of the OTLP protocol)."""

    def __init__(self) -> None:
        self.requests: Requests = []
        port = free_port()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"127.0.0.1:{port}")
        self._server.start()
        self.endpoint = f"http://127.0.0.1:{port}"

    def Export(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[dict[str, str], Any]]:
        return received_spans(self.requests)

    def close(self) -> None:
        self._server.stop(None).wait(5)
