"""Log formatting of the long-running commands (controller, webhook): `plain` (key=value text for
a terminal) or `json` (one object per line, for a log pipeline: Loki, Elasticsearch, Cloud Logging).

A JSON line carries `time` (UTC, RFC 3339 with milliseconds), `level`, `logger`, `message`,
every structured field passed through `extra=` (for example `logger.info("bound", extra={"claim":
"ns/name"})`), and `exception` with the traceback when there is one. Values JSON cannot hold are
written as their `str()`, so a log call never fails because of what it carries.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any, Literal

__all__ = ["FORMATS", "JsonFormatter", "LogFormat", "PlainFormatter", "configure_logging"]

LogFormat = Literal["plain", "json"]
FORMATS: tuple[LogFormat, ...] = ("plain", "json")
"""The values `--log-format` accepts."""

PLAIN_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"
"""The text format the controller always had (`cli.py`)."""

# Attributes every LogRecord has; anything else on a record came through `extra=`.
_RECORD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys() | {"message", "asctime", "taskName"}
)


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {key: value for key, value in vars(record).items() if key not in _RECORD_ATTRIBUTES}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages and tracebacks are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line: time, level, logger, message, its extra fields, exception."""
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _extras(record).items():
            # An extra field never overwrites the four fixed ones: a reader relies on them.
            entry.setdefault(key, value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """`PLAIN_FORMAT`, with extra fields appended as `key=value` so that the same log calls
    carry the same facts in both formats."""

    def __init__(self) -> None:
        super().__init__(PLAIN_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        """The text line, then ` key=value` for each extra field (before any traceback)."""
        text = super().format(record)
        extras = _extras(record)
        if not extras:
            return text
        fields = " ".join(f"{key}={value}" for key, value in extras.items())
        first, newline, rest = text.partition("\n")
        return f"{first} {fields}{newline}{rest}"


def configure_logging(*, level: str = "info", log_format: LogFormat = "plain") -> logging.Handler:
    """Send the root logger's records to stderr in `log_format` at `level` (a name such as
    "info"); replaces handlers installed before. Returns the handler (tests read its stream)."""
    if log_format not in FORMATS:
        raise ValueError(f"--log-format {log_format!r}: use one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else PlainFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    return handler
