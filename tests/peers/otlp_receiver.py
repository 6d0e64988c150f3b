#!/usr/bin/env python3
"""OTLP/HTTP trace receiver for the gateway's trace-export tests.

Listens on 127.0.0.1 (port from --port, 0 = any free one) and prints
`LISTENING <port>` as its first stdout line. Every POST to /v1/traces is
decoded as an `ExportTraceServiceRequest` with the official protobuf classes of
PyPI's opentelemetry-proto (pinned in requirements-modern.txt), and each span
is printed as ONE JSON line on stdout:

  {"trace_id", "span_id", "parent_span_id" (hex, "" for a root), "name",
   "kind" ("SPAN_KIND_SERVER", ...), "status" ("STATUS_CODE_ERROR", ...),
   "attributes": {key: value}, "resource": {key: value},
   "start_ns", "end_ns", "scope"}

A request that is not protobuf, or that does not decode, gets 400 and a line
{"error": ...}; the test sees it. Each accepted request gets the encoded
`ExportTraceServiceResponse` (application/x-protobuf), as a collector answers.
With --fail N, the first N requests get 503 (export failure tests).
Stdlib and opentelemetry-proto only; runs in the modern venv.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

MAX_BODY = 16 * 1024 * 1024
_out = threading.Lock()
_failures_left = 0


def emit(obj: dict) -> None:
    with _out:
        sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
        sys.stdout.flush()


def any_value(v) -> object:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes(kvs) -> dict:
    return {kv.key: any_value(kv.value) for kv in kvs}


def spans_of(request: ExportTraceServiceRequest):
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for span in ss.spans:
                yield {
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                    "kind": Span.SpanKind.Name(span.kind),
                    "status": Status.StatusCode.Name(span.status.code),
                    "attributes": attributes(span.attributes),
                    "resource": resource,
                    "scope": ss.scope.name,
                    "start_ns": span.start_time_unix_nano,
                    "end_ns": span.end_time_unix_nano,
                }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep stdout for spans only
        pass

    def reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        global _failures_left
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.reply(413, b"too large", "text/plain")
            return
        body = self.rfile.read(length)
        if self.path != "/v1/traces":
            emit({"error": f"POST to {self.path}"})
            self.reply(404, b"not here", "text/plain")
            return
        if self.headers.get("Content-Type") != "application/x-protobuf":
            emit({"error": f"content type {self.headers.get('Content-Type')!r}"})
            self.reply(400, b"protobuf only", "text/plain")
            return
        with _out:
            failing = _failures_left > 0
            if failing:
                _failures_left -= 1
        if failing:
            self.reply(503, b"failing on purpose", "text/plain")
            return
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except DecodeError as e:
            emit({"error": f"undecodable: {e}"})
            self.reply(400, b"undecodable", "text/plain")
            return
        for span in spans_of(request):
            emit(span)
        self.reply(
            200,
            ExportTraceServiceResponse().SerializeToString(),
            "application/x-protobuf",
        )


def main() -> None:
    global _failures_left
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--fail", type=int, default=0)
    args = parser.parse_args()
    _failures_left = args.fail
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    emit_line = f"LISTENING {server.server_address[1]}\n"
    sys.stdout.write(emit_line)
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
