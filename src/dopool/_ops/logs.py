"""The log lines ``dopool worker`` writes to stderr: plain text, or one JSON object a line
(``--log-format json``) for a collector such as journald's, Loki's or Elasticsearch's.

A JSON line holds ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``; the
fields an engine record carries (``record.dopool``: ``event_id``, ``pool``, ``instance``,
``attempt``, ...; :mod:`dopool._engine.logs`) at the top level beside them; and
``traceback``, the formatted exception, when there is one.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "dopool", None)
        if isinstance(fields, dict):
            line.update({key: value for key, value in fields.items() if key not in line})
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["traceback"] = record.exc_text
        return json.dumps(line, default=repr, ensure_ascii=False)


def configure(level: str, log_format: str) -> None:
    """Send every record at ``level`` or above to stderr, as ``log_format`` lines."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler])
