"""``--log-format json``: one JSON object per line, for log shippers that index fields.

Every line has ``ts`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``; a line about
a record also has ``topic``, ``partition``, ``offset`` and ``key``, passed by the caller
as ``extra=record_fields(...)`` so a query can find every line of one record without
parsing messages. Tracebacks go to ``exc_info`` as one string. A worker started by
``worker --processes N`` adds ``process`` (its index).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any

RECORD_FIELDS = ("topic", "partition", "offset", "key")


def record_fields(topic: str, partition: int, offset: int, key: str | None) -> dict[str, Any]:
    """``extra=`` for a log call about one input record."""
    return {"topic": topic, "partition": partition, "offset": offset, "key": key}


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        index = os.environ.get("AGENTS_STREAM_PROCESS_INDEX")
        self.process = int(index) if index and index.isdigit() else None

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.process is not None:
            line["process"] = self.process
        for name in RECORD_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def use_json_logs(stream: Any = None) -> None:
    """Switch the root logger's handlers (installed by ``setup_logging``) to JSON lines."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler(stream or sys.stderr))
    for handler in root.handlers:
        handler.setFormatter(JsonFormatter())
