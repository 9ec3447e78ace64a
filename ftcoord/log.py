"""structlog, configured once: readable on a terminal, JSON lines into a run directory.

Events are an API: the chaos verifier and reports read the JSON lines. One event name
per thing that happened (`generation_decided`, `member_declared_dead`), facts as keys.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

import structlog

_lock = threading.Lock()
_json_file: TextIO | None = None


def _write_json_line(_: Any, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Tee every event into the JSON-lines file (when one is configured).

    The file gets wall time (for humans), monotonic time (to measure intervals between
    processes on one host) and the pid; the terminal stays short.
    """
    if _json_file is not None:
        record = {"ts": time.time(), "mono": time.monotonic(), "pid": os.getpid(), **event_dict}
        line = json.dumps(record, default=str, separators=(",", ":"))
        with _lock:
            _json_file.write(line + "\n")
            _json_file.flush()
    return event_dict


def configure(
    log_file: Path | str | None = None,
    *,
    level: str = "info",
    stream: TextIO | None = None,
    console: bool = True,
) -> None:
    """Set up structlog for this process.

    Args:
        log_file: where JSON lines go; its directory is created. None: terminal only.
        level: the lowest level shown ("debug", "info", "warning", "error").
        stream: the terminal stream (stderr by default, so stdout stays machine-readable).
        console: False silences the terminal renderer (JSON file only).
    """
    global _json_file
    with _lock:
        if _json_file is not None:
            _json_file.close()
            _json_file = None
        if log_file is not None:
            path = Path(log_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            _json_file = path.open("a", encoding="utf-8")
    renderer: Any
    if console:
        out = stream or sys.stderr
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    else:
        renderer = structlog.processors.KeyValueRenderer()
        out = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _write_json_line,
            structlog.processors.TimeStamper(fmt="%H:%M:%S.%f", key="time"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


def is_configured() -> bool:
    """Whether this process configured structlog already (ours or the user's)."""
    return structlog.is_configured()


def get_logger(**bound: Any) -> structlog.typing.FilteringBoundLogger:
    """A logger with some facts bound to every event it writes."""
    return structlog.get_logger().bind(**bound)
