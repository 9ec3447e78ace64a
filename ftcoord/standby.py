"""Warm standby: a process that has already imported torch and waits to take a slot.

Starting Python and importing torch costs seconds, which would dominate a restart. The
launcher keeps standbys ready; when a slot dies it hands one the slot's environment and
the standby runs the user's command in-process with runpy: `python SCRIPT ARGS` and
`python -m MODULE ARGS` are supported. A standby touches no accelerator until it runs.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from ftcoord.env import die_with_launcher

READY_FD_ENV = "FTCOORD_STANDBY_READY_FD"
STANDBY_ENV = "FTCOORD_STANDBY"  # set to "1" in a process that started as a standby


@dataclass(frozen=True)
class PythonCommand:
    """A command a standby can run in-process."""

    module: str | None
    script: str | None
    args: list[str]

    @classmethod
    def parse(cls, command: list[str]) -> PythonCommand | None:
        """`python -m MOD ...` or `python FILE.py ...`; None for anything else."""
        if len(command) < 2 or not Path(command[0]).name.startswith("python"):
            return None
        if command[1] == "-m" and len(command) >= 3:
            return cls(command[2], None, command[3:])
        if command[1].endswith(".py"):
            return cls(None, command[1], command[2:])
        return None

    def preload(self) -> None:
        """Import what the command will import, without running its main."""
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401

        if self.module is not None:
            try:  # a module run with -m keeps its work behind `if __name__ == "__main__"`
                module = importlib.import_module(self.module)
                if hasattr(module, "__path__"):  # a package: -m runs its __main__, warm that too
                    importlib.import_module(f"{self.module}.__main__")
            except Exception:  # noqa: S110 - preloading is best effort; the real run reports errors
                pass

    def run(self) -> int:
        """Run as `__main__`, like the interpreter would; return the exit code."""
        try:
            if self.module is not None:
                sys.argv = [self.module, *self.args]
                runpy.run_module(self.module, run_name="__main__", alter_sys=True)
            else:
                assert self.script is not None
                sys.argv = [self.script, *self.args]
                sys.path.insert(0, str(Path(self.script).resolve().parent))
                runpy.run_path(self.script, run_name="__main__")
        except SystemExit as exc:
            code = exc.code
            return code if isinstance(code, int) else (0 if code is None else 1)
        except BaseException:
            traceback.print_exc()
            return 1
        return 0


STANDBY_NICE = 10


def _lower_priority() -> int:
    try:
        os.nice(STANDBY_NICE)
        return STANDBY_NICE
    except OSError:
        return 0


def _restore_priority(niced: int) -> None:
    """Back to normal priority when taking a slot (needs the privilege to lower niceness)."""
    if niced:
        try:
            os.nice(-niced)
        except OSError:
            print("ftcoord standby: could not restore normal priority (not permitted); running niced",
                  file=sys.stderr)


def main() -> None:
    """`python -m ftcoord.standby -- CMD...`: preload, say ready, wait for a slot, run."""
    command = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else sys.argv[1:]
    parsed = PythonCommand.parse(command)
    if parsed is None:
        print(f"ftcoord standby: cannot run {command!r} in-process", file=sys.stderr)
        sys.exit(2)
    die_with_launcher()
    # Warm up at low priority: on a busy node the import must not slow the running ranks.
    niced = _lower_priority()
    parsed.preload()
    ready_fd = int(os.environ.pop(READY_FD_ENV, "-1"))
    if ready_fd >= 0:
        try:
            os.write(ready_fd, b"ready\n")
        except BrokenPipeError:
            pass  # the launcher stopped listening (it assigned us already, or let us go: see stdin)
        os.close(ready_fd)
    line = sys.stdin.readline()
    if not line.strip():
        sys.exit(0)  # the launcher let us go
    assignment = json.loads(line)
    _restore_priority(niced)
    os.environ.update(assignment["env"])
    os.environ[STANDBY_ENV] = "1"
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdout.flush()
    code = parsed.run()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
