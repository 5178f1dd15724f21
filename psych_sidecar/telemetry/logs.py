"""Log lines: text (the default) or JSON, one object per line, with the call's context.

The RPC interceptors bind the RPC, tenant, Run id and connection of each call (from its request)
to a context variable; MCP sessions bind their connection; the storage thread pool carries
the context across. The JSON formatter writes those fields, the correlation id of an
internal error, and the current trace id, so a log line can be joined to its trace.

No line carries a credential. The sidecar's own lines about a connection pass through its
scrubber; the libraries' are kept from doing harm two ways: the HTTP and MCP libraries log
from WARNING on whatever the sidecar's level (`quiet_libraries`: at DEBUG, httpcore prints
every response header, a WWW-Authenticate echoing a bearer token included), and every line of
theirs, and every traceback, is scrubbed at the handler with the scrubbers of the live
connections (`ScrubLibraryLines`).
"""

from __future__ import annotations

import contextvars
import json
import logging
import weakref
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Literal

from psych_sidecar.telemetry import tracing

LogFormat = Literal["text", "json"]
FIELDS = ("rpc", "tenant", "run_id", "connection", "correlation_id")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The loggers of the libraries that can print a request's or response's headers, URL or body
# (httpx/httpcore and their h11/h2/hpack, urllib3) or an MCP message or a transport's
# exception (the MCP SDK: `mcp.*`, and its session's logger, named "client").
QUIET_LIBRARIES = (
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "h11",
    "h2",
    "hpack",
    "urllib3",
    "mcp",
    "client",
)
# The sidecar's own loggers: their lines are scrubbed where they are made.
_OWN_LOGGERS = "psych_sidecar"

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


def quiet_libraries() -> None:
    """The libraries of `QUIET_LIBRARIES` log from WARNING on, whatever the sidecar's level."""
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)


# The scrubbers of the live connections (each removes one connection's secrets, tokens
# included); held weakly: a connection's goes with its session.
_scrubbers: weakref.WeakSet[Callable[[str], str]] = weakref.WeakSet()


def scrub_library_lines_with(scrub: Callable[[str], str]) -> None:
    """Scrub the libraries' lines and every traceback with `scrub` too, while it lives."""
    _scrubbers.add(scrub)


def _scrubbed(text: str) -> str:
    for scrub in list(_scrubbers):
        text = scrub(text)
    return text


class ScrubLibraryLines(logging.Filter):
    """A handler's filter: a line of a library (not the sidecar's own, scrubbed where made)
    and any line's traceback pass through the live connections' scrubbers. A library's error
    may quote a header it refused, a token in it (httpx's "Illegal header value")."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        own = record.name == _OWN_LOGGERS or record.name.startswith(_OWN_LOGGERS + ".")
        if (own and not record.exc_info) or not _scrubbers:
            return True
        if not own:
            message = record.getMessage()
            scrubbed = _scrubbed(message)
            if scrubbed != message:
                record.msg, record.args = scrubbed, None
        if record.exc_info and not record.exc_text:
            record.exc_text = _scrubbed(self._formatter.formatException(record.exc_info))
        return True


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
            # The text the handler's filter scrubbed, when it did.
            line["exception"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(level: str, log_format: LogFormat) -> None:
    """Configure the root logger (stderr) once, for `serve` and `migrate`."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    handler.addFilter(ScrubLibraryLines())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    quiet_libraries()
