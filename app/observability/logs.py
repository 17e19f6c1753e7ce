"""Log lines: readable text by default, one JSON object per line with ``LOG_FORMAT=json``.

Every line carries the id of the request it was written for. The access line, one per
request, is written here when the request ends (gunicorn's own access log is off: it
would write a second line, and the user of an ``Authorization: Basic`` header, which a
``curl -u "$KEY:"`` makes the whole key). Nothing a caller sends is logged but the method,
the path without its query string, and ids the gateway chose; anything shaped like an
API key that reaches a line anyway is cut down to its prefix.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any

from app.encoding import dumps
from app.observability.trace import RequestTrace, current_request_id

access_log = logging.getLogger("gateway.access")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
# The gateway's keys (sk-gw-...) and the usual shape of upstream keys (sk-..., sk-ant-...).
KEY_SHAPED = re.compile(r"\b(sk-(?:gw-|ant-)?)[A-Za-z0-9_\-]{8,}")
LOG_FORMATS = ("text", "json")


def redact(line: str) -> str:
    """Cut anything shaped like an API key down to its prefix."""
    return KEY_SHAPED.sub(r"\1[redacted]", line) if "sk-" in line else line


class TextFormatter(logging.Formatter):
    """``time level logger [request id] message``, for people reading a terminal."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        """Format ``record`` with its request's id, keys redacted."""
        record.request_id = getattr(record, "request_id", None) or current_request_id() or "-"
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id and fields."""

    def format(self, record: logging.LogRecord) -> str:
        """Format ``record`` as one line of JSON, keys redacted."""
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or current_request_id(),
        }
        line.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return redact(dumps(line).decode())


def formatter_for(log_format: str) -> logging.Formatter:
    """Return the formatter of ``LOG_FORMAT`` (``text`` or ``json``)."""
    return JsonFormatter() if log_format == "json" else TextFormatter()


def configure_logging(log_format: str) -> None:
    """Send every logger's lines to stderr at INFO, formatted as ``log_format`` says."""
    # No format shows the thread, the process or the calling line; not collecting them
    # (the logging HOWTO's "Optimization") takes a quarter off every line, the access
    # line of every request among them.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None
    root = logging.getLogger()
    handler = next((h for h in root.handlers if getattr(h, "gateway", False)), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.gateway = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    handler.setFormatter(formatter_for(log_format))
    root.setLevel(logging.INFO)


def access_fields(trace: RequestTrace) -> dict[str, Any]:
    """Return what the access line says of a request."""
    usage = trace.usage
    return {
        "client": trace.client,
        "method": trace.method,
        "path": trace.path,
        "status": trace.status,
        "error_code": trace.error_code,
        "account_id": trace.account_id,
        "key_id": trace.key_id,
        "model": trace.model,
        "api": trace.api,
        "upstream": trace.upstream,
        "generation_id": trace.generation_id,
        "prompt_tokens": getattr(usage, "prompt_tokens", None),
        "completion_tokens": getattr(usage, "completion_tokens", None),
        "cost": str(trace.cost) if trace.cost is not None else None,
        "latency_ms": round(trace.elapsed() * 1000, 1),
        "ttfb_ms": _ms(trace.first_byte_seconds),
        "ttft_ms": _ms(trace.first_token_seconds),
        "overhead_ms": round(trace.overhead_seconds() * 1000, 1),
    }


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 1) if seconds is not None else None


def log_access(trace: RequestTrace) -> None:
    """Write the request's one access line."""
    fields = access_fields(trace)
    shown = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None and k != "path")
    access_log.info(
        '"%s %s" %s',
        trace.method,
        trace.path,
        shown,
        extra={"fields": fields, "request_id": trace.request_id},
    )
