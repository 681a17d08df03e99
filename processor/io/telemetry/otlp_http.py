"""Spans POSTed to an OTLP/HTTP collector's ``/v1/traces``, in either encoding: the transport
the OTLP/JSON (io/telemetry/otlp_json.py) and protobuf (io/telemetry/otlp_proto.py) exporters share.

It reads the standard variables as the SDK's exporters do: the endpoint, the headers, the
timeout (in seconds, as the Python SDK reads it), the compression (gzip or deflate) and, for
an https endpoint, the CA certificate and the client's certificate and key. A refusal the
OTLP specification calls transient (429, 502, 503, 504) or a connection that fails is tried
again after 1, 2, 4 ... s until the timeout is spent, as the SDK's exporter does; anything else
fails the export at once. A failed export is logged and its spans dropped.
"""

from __future__ import annotations

import gzip
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Mapping, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

from processor.core.backoff import retry_delay_s

log = logging.getLogger("ductor.telemetry")

# OTLP's numbers for the span kinds, in either encoding.
SPAN_KINDS = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
_TRANSIENT = frozenset({429, 502, 503, 504})
_FIRST_RETRY_S = 1.0
_MAX_RETRY_S = 32.0


class OtlpHttpSpanExporter(SpanExporter):
    """POSTs each batch of spans as one request body of ``content_type``, made by
    ``encode``."""

    content_type = "application/x-protobuf"

    def __init__(
        self,
        endpoint: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.endpoint = endpoint or _endpoint_from_environment()
        self.headers = {
            **(_headers_from_environment() if headers is None else dict(headers)),
            "Content-Type": self.content_type,
        }
        timeout = _traces_variable("TIMEOUT")
        self.timeout_s = timeout_s if timeout_s is not None else float(timeout or 10)
        self.compression = (_traces_variable("COMPRESSION") or "none").lower()
        if self.compression != "none":
            self.headers["Content-Encoding"] = self.compression
        self._context = _tls_context()
        self._stopping = threading.Event()

    def encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        raise NotImplementedError

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        body = self.encode(spans)
        if self.compression == "gzip":
            body = gzip.compress(body)
        elif self.compression == "deflate":
            body = zlib.compress(body)
        deadline = time.monotonic() + self.timeout_s
        tries = 0
        while True:
            why = self._post(body, deadline)
            if why is None:
                return SpanExportResult.SUCCESS
            transient, reason = why
            delay = retry_delay_s(tries, _FIRST_RETRY_S, _MAX_RETRY_S)
            tries += 1
            if not transient or time.monotonic() + delay >= deadline:
                log.warning(
                    "could not export %d span(s) to %s after %d tries: %s",
                    len(spans),
                    self.endpoint,
                    tries,
                    reason,
                )
                return SpanExportResult.FAILURE
            if self._stopping.wait(delay):
                return SpanExportResult.FAILURE  # shutting down: no more waiting

    def _post(self, body: bytes, deadline: float) -> tuple[bool, str] | None:
        """None when the collector took the body, else (whether trying again may help, why)."""
        request = urllib.request.Request(self.endpoint, body, self.headers, method="POST")
        timeout = max(0.1, deadline - time.monotonic())
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self._context) as answer:
                answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code in _TRANSIENT, f"HTTP {exc.code} {exc.reason}"
        except (urllib.error.URLError, OSError) as exc:
            return True, str(exc)
        return None

    def shutdown(self) -> None:
        self._stopping.set()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _endpoint_from_environment() -> str:
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces:
        return traces  # used as it is (the specification's rule for per-signal endpoints)
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")
    return base.rstrip("/") + "/v1/traces"


def _traces_variable(name: str) -> str:
    """OTEL_EXPORTER_OTLP_TRACES_<NAME>, else OTEL_EXPORTER_OTLP_<NAME> (stripped; "" if unset)."""
    return (
        os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}")
        or ""
    ).strip()


def _tls_context() -> ssl.SSLContext | None:
    """The TLS context the certificate variables ask for (None: Python's default)."""
    ca = _traces_variable("CERTIFICATE")
    cert = _traces_variable("CLIENT_CERTIFICATE")
    key = _traces_variable("CLIENT_KEY")
    if not (ca or cert):
        return None
    context = ssl.create_default_context(cafile=ca or None)
    if cert:
        context.load_cert_chain(cert, key or None)
    return context


def _headers_from_environment() -> dict[str, str]:
    raw = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or os.environ.get(
        "OTEL_EXPORTER_OTLP_HEADERS", ""
    )
    headers: dict[str, str] = {}
    for pair in raw.split(","):
        name, sep, value = pair.partition("=")
        if sep and name.strip():
            headers[urllib.parse.unquote(name.strip())] = urllib.parse.unquote(value.strip())
    return headers
