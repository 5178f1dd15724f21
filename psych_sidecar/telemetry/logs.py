"""Log lines: text (the default) or JSON, one object per line, with the call's context.

The RPC interceptors bind the RPC, tenant, Run id and connection of each call (from its request)
to a context variable; MCP sessions bind their connection; the storage thread pool carries
the context across. The JSON formatter writes those fields, the correlation id of an
internal error, and the current trace id, so a log line can be joined to its trace.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Literal

from psych_sidecar.telemetry import tracing

LogFormat = Literal["text", "json"]
FIELDS = ("rpc", "tenant", "run_id", "connection", "correlation_id")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_EMPTY: Mapping[str, str] = {}
_bound: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "psych_sidecar_log_fields", default=_EMPTY
)


def bind_call(fields: dict[str, str]) -> contextvars.Token[Mapping[str, str]]:
    """Add a call's fields (none empty; the dict is given away) to this context's log lines."""
    outer = _bound.get()
    return _bound.set({**outer, **fields} if outer else fields)


def bind_only(**fields: str) -> None:
    """Replace this context's fields: for a long-lived task started by a call, whose lines
    must not carry that call's fields."""
    _bound.set({key: value for key, value in fields.items() if value})


def unbind(token: contextvars.Token[Mapping[str, str]]) -> None:
    _bound.reset(token)


def bound() -> Mapping[str, str]:
    return _bound.get()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (RFC 3339, UTC), level, logger, message, the bound
    fields, trace_id when a span is current, and exception (the formatted stack) if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(_bound.get())
        for field in FIELDS:
            value = record.__dict__.get(field)
            if value:
                line[field] = str(value)
        trace_id = tracing.current_trace_id()
        if trace_id:
            line["trace_id"] = trace_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(level: str, log_format: LogFormat) -> None:
    """Configure the root logger (stderr) once, for `serve` and `migrate`."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
