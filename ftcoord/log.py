"""ftcoord's events: readable on a terminal, JSON lines into a run directory.

Events are an API: the chaos verifier and reports read the JSON lines. One event name
per thing that happened (`generation_decided`, `member_declared_dead`), facts as keys.
Used as a library, ftcoord logs through the standard loggers `ftcoord.<component>`, and the
application's logging setup decides what shows. Only ftcoord's own entry points call
`configure`, which gives ftcoord a terminal renderer of its own; neither structlog's global
configuration nor a handler of `logging` is ever installed.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
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
            if _json_file is not None:  # configure() may have closed it meanwhile
                _json_file.write(line + "\n")
                _json_file.flush()
    return event_dict


LOGGER_PREFIX = "ftcoord"
"""Standard loggers are named `ftcoord.<component>` (`ftcoord.leader`, `ftcoord.wrapper`, ...)."""


_LEVELS = {**logging.getLevelNamesMapping(), "WARN": logging.WARNING, "EXCEPTION": logging.ERROR, "MSG": logging.INFO}


def _skip_if_disabled(logger: logging.Logger, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Drop an event the standard logger would not emit, unless a JSON-lines file wants every event."""
    if _json_file is None and not logger.isEnabledFor(_LEVELS.get(method.upper(), logging.INFO)):
        raise structlog.DropEvent
    return event_dict


_facts = structlog.processors.KeyValueRenderer(sort_keys=False)


def _message(_: Any, __: str, event_dict: dict[str, Any]) -> tuple[tuple[str], dict[str, Any]]:
    """`event key=value ...` for a standard record, which carries the level, the time and a traceback itself."""
    event_dict.pop("level", None)
    event_dict.pop("component", None)  # the logger's name
    exc_info = event_dict.pop("exc_info", None)
    event = event_dict.pop("event", "")
    facts = _facts(_, __, event_dict)
    return (f"{event} {facts}" if facts else str(event),), ({"exc_info": exc_info} if exc_info else {})


@dataclass(frozen=True)
class _Output:
    """Where ftcoord's events go: its own structlog pipeline, never the process's global structlog configuration.
    `print_to` None: through the standard logger `ftcoord.<component>` of each event."""

    processors: list[Any]
    wrapper_class: type
    print_to: Any
    configured: bool

    def logger_for(self, bound: dict[str, Any]) -> Any:
        if self.print_to is not None:
            return self.print_to
        return logging.getLogger(f"{LOGGER_PREFIX}.{bound.get('component', 'events')}")


def _output(level: str, stream: TextIO | None, console: bool, configured: bool, through_logging: bool) -> _Output:
    if through_logging:
        processors = [
            structlog.contextvars.merge_contextvars,
            _skip_if_disabled,
            structlog.processors.add_log_level,
            _write_json_line,
            _message,
        ]
        return _Output(processors, structlog.stdlib.BoundLogger, None, configured)
    renderer: Any
    if console:
        out = stream or sys.stderr
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    else:
        renderer = structlog.processors.KeyValueRenderer()
        out = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _write_json_line,
        structlog.processors.TimeStamper(fmt="%H:%M:%S.%f", key="time"),
        renderer,
    ]
    wrapper_class = structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()])
    # One write per line: print() writes the line and its newline apart when output is unbuffered
    # (PYTHONUNBUFFERED=1, as containers often set), and the ranks that share a terminal merge their lines.
    return _Output(processors, wrapper_class, structlog.WriteLogger(out), configured)


_state: tuple[int, _Output | None] = (0, None)
"""(version, output): configure() sets a new output with the next version, and loggers made before resolve theirs
again; None until first needed (then the standard loggers)."""


def _current() -> tuple[int, _Output]:
    global _state
    version, output = _state
    if output is None:
        output = _output("info", None, True, configured=False, through_logging=True)
        with _lock:
            if _state[0] == version and _state[1] is None:
                _state = (version, output)
            version, output = _state  # type: ignore[assignment]
    return version, output  # type: ignore[return-value]


def configure(
    log_file: Path | str | None = None,
    *,
    level: str = "info",
    stream: TextIO | None = None,
    console: bool = True,
    through_logging: bool = False,
) -> None:
    """Set where ftcoord's events go in this process: called by ftcoord's own entry points (the launcher, the store,
    `chaos`, `python -m training`, a rank under its launcher). The application's own structlog and logging
    configuration are left as they are.

    Args:
        log_file: where JSON lines go (the events at `level` and above; with through_logging, every event); its
            directory is created. None: no file.
        level: the lowest level written ("debug", "info", "warning", "error").
        stream: the terminal stream (stderr by default, so stdout stays machine-readable).
        console: False silences the terminal renderer (JSON file only).
        through_logging: the terminal stays the application's: events go to the standard loggers
            `ftcoord.<component>` (level, stream and console are then the application's logging's to decide).
    """
    global _json_file, _state
    output = _output(level, stream, console, configured=not through_logging, through_logging=through_logging)
    with _lock:
        if _json_file is not None:
            _json_file.close()
            _json_file = None
        if log_file is not None:
            path = Path(log_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            _json_file = path.open("a", encoding="utf-8")
        _state = (_state[0] + 1, output)


def is_configured() -> bool:
    """Whether an entry point of this process gave ftcoord's events a terminal renderer of its own."""
    output = _state[1]
    return output is not None and output.configured


class Logger:
    """A logger with facts bound to every event; it writes wherever ftcoord's output is configured when it writes
    (an entry point may configure it after the logger was made)."""

    __slots__ = ("_bound", "_resolved", "_version")

    def __init__(self, bound: dict[str, Any]) -> None:
        self._bound = bound
        self._resolved: Any = None
        self._version = -1

    def bind(self, **more: Any) -> Logger:
        """The same logger with more facts bound."""
        return Logger({**self._bound, **more})

    def _logger(self) -> Any:
        version, output = _current()
        if self._version != version:
            self._resolved = structlog.wrap_logger(output.logger_for(self._bound), processors=output.processors,
                                                   wrapper_class=output.wrapper_class).bind(**self._bound)
            self._version = version
        return self._resolved

    def __getattr__(self, name: str) -> Any:  # debug, info, warning, error, exception, ...
        if name.startswith("_"):  # copy and pickle look for hooks before __init__ ran: none here
            raise AttributeError(name)
        return getattr(self._logger(), name)

    def __getstate__(self) -> dict[str, Any]:
        return {"bound": self._bound}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["bound"])  # type: ignore[misc]


def get_logger(**bound: Any) -> Logger:
    """A logger with some facts bound to every event it writes."""
    return Logger(bound)
