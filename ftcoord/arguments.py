"""Command-line argument types that check ranges at parse time.

Used by every entry point (`ftcoord-store`, `ftcoord-launch`, `python -m training`, `chaos`), so a
bad value is refused before anything starts, in one line that names the value, the limit and what
to do (argparse prints it as "PROG: error: argument --FLAG: MESSAGE" and exits 2).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
from collections.abc import Callable
from typing import NoReturn


def version() -> str:
    """The installed distribution's version ("0+unknown" when run from a checkout that was never installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("ftcoord")
    except PackageNotFoundError:
        return "0+unknown"


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Prints an option's default after its help, unless there is none to print (None, a switch that is off) or the
    help already says it in its own words."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        nothing = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if nothing or "default" in text:
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: what is wrong, and where the help is; every command that uses
    it answers `--version`."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.add_argument("--version", action="version", version=f"%(prog)s (ftcoord) {version()}")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind: type, low: float | None, high: float | None, hint: str) -> Callable[[str], float | int]:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}"
                                             f"{f'; {hint}' if hint else ''}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number")
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = (f"between {low} and {high}" if low is not None and high is not None
                      else f">= {low}" if low is not None else f"<= {high}")
            raise argparse.ArgumentTypeError(f"{text} is out of range: it must be {bounds}"
                                             f"{f'; {hint}' if hint else ''}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in some messages
    return parse


def port(text: str) -> int:
    """A TCP port, 0..65535 (0: the system picks a free one)."""
    return int(_number(int, 0, 65535, "0 picks a free port")(text))


def positive_int(text: str) -> int:
    return int(_number(int, 1, None, "")(text))


def non_negative_int(text: str) -> int:
    return int(_number(int, 0, None, "")(text))


def int_range(low: int, high: int) -> Callable[[str], int]:
    """An integer between `low` and `high`, both included."""
    parse = _number(int, low, high, "")

    def checked(text: str) -> int:
        return int(parse(text))

    checked.__name__ = "int"
    return checked


def positive_float(text: str) -> float:
    value = float(_number(float, None, None, "")(text))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be > 0")
    return value


def seconds_or_off(text: str) -> float:
    """A positive number of seconds, or "off" (math.inf: never)."""
    if text.strip().lower() == "off":
        return math.inf
    return positive_float(text)


def non_negative_float(text: str) -> float:
    return float(_number(float, 0, None, "")(text))


def executable(command: str) -> str:
    """The program of a command line: an executable path, or a name on PATH."""
    if os.sep in command:
        if not os.path.isfile(command):
            raise argparse.ArgumentTypeError(f"command {command!r} not found: no such file")
        if not os.access(command, os.X_OK):
            raise argparse.ArgumentTypeError(f"command {command!r} is not executable (chmod +x it, or run it "
                                             f"through its interpreter, e.g. `-- python {command}`)")
        return command
    if shutil.which(command) is None:
        raise argparse.ArgumentTypeError(f"command {command!r} not found on PATH; give its full path or check "
                                         f"the environment the launcher runs in")
    return command
