"""Application logs of every ``kvgate`` command: a level and a format (``text`` or ``json``).

``kvgate --log-level LEVEL --log-format FORMAT COMMAND`` (or the same options after the
command) sets them; they travel to child processes (gateway workers, an engine process) in
``KVGATE_LOG_LEVEL`` / ``KVGATE_LOG_FORMAT``, which ``configure`` reads. A JSON record is one
line: ``ts`` (Unix seconds), ``level``, ``logger``, ``message`` and, for an exception, ``exc``.
The gateway's access log is its own stream (stdout) and is JSON either way.
"""

from __future__ import annotations

import json
import logging
import os
import sys

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")
LEVEL_ENV, FORMAT_ENV = "KVGATE_LOG_LEVEL", "KVGATE_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def export(level: str, fmt: str) -> None:
    """Make ``level`` and ``fmt`` this process's and its children's settings."""
    os.environ[LEVEL_ENV], os.environ[FORMAT_ENV] = level, fmt


def configure() -> None:
    """Set up the root logger on stderr as the environment says (info, text by default)."""
    level = os.environ.get(LEVEL_ENV, "info").lower()
    fmt = os.environ.get(FORMAT_ENV, "text").lower()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if level in LEVELS else "INFO")
