"""Warm standby: a template process that has imported torch and forks a ready replacement at once.

Starting Python and importing torch costs seconds, which would dominate a restart. The launcher keeps one warm
standby: a process that imported torch and the user's module (for `python -m MODULE`, its `__main__` too) at low
priority and then waits. When a slot dies the launcher asks it for a replacement and it *forks* one, which takes
its slot's environment and runs the user's command in-process with runpy (`python [OPTIONS] SCRIPT ARGS` and
`python [OPTIONS] -m MODULE ARGS`): a replacement is ready in milliseconds, as many as faults need, and the standby
stays warm for the next fault. Forking is safe because the template never runs a torch op (torch's thread pools
start lazily) and touches no accelerator; numpy's OpenBLAS shuts its pool down around fork. The protocol on its
pipes: `main`; the launcher's side: ftcoord.launcher.standby_client.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import runpy
import select
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from ftcoord.env import die_with_launcher

READY_FD_ENV = "FTCOORD_STANDBY_READY_FD"
LIFELINE_FD_ENV = "FTCOORD_STANDBY_LIFELINE_FD"
NICE_ENV = "FTCOORD_STANDBY_NICE"
PRELOAD_ATTRIBUTE = "ftcoord_preload"
"""A module run with -m may name, under this name, what it imports late (after parsing its arguments,
say): a tuple of module names, or a function of the command's arguments that returns them and raises
for a command line the module would refuse. The standby imports them too; a refused command line
preloads nothing (not even torch), so the processes forked from it fail in a fraction of a second
with their own message instead of after seconds of imports."""
STANDBY_ENV = "FTCOORD_STANDBY"  # set to "1" in a process that started as a standby


INTERPRETER_FLAGS = frozenset("bBdOPqsuv")
"""The interpreter's options without a value that a standby can honour, alone or joined (`-u`, `-uB`, `-OO`): each is
set when an interpreter starts and a fork keeps it, so the standby starts with the command's options (`python -u -m
train`: its replacements' output unbuffered, as the command's own would be). Not these: -S and -I (the standby itself
would not find ftcoord in site-packages), -E (nor its job's variables), -i, -c, -x, -h, -V."""
VALUED_OPTIONS = ("-X", "-W")
"""Options that take a value, joined (`-Xfaulthandler`) or next (`-X dev`); they too are set at start and forked."""


@dataclass(frozen=True)
class PythonCommand:
    """A command a standby can run in-process: `python [OPTIONS] -m MOD ARGS` or `python [OPTIONS] FILE.py ARGS`."""

    module: str | None
    script: str | None
    args: list[str]
    options: tuple[str, ...] = ()
    """The interpreter's options before the module or script (INTERPRETER_FLAGS, VALUED_OPTIONS): the standby starts
    with them."""

    @classmethod
    def parse(cls, command: list[str]) -> PythonCommand | None:
        """The command, or None for anything a standby cannot run as the interpreter would (`unsupported` says why)."""
        read = _read(command)
        return read if isinstance(read, PythonCommand) else None

    def preload(self) -> str | None:
        """Import what the command will import, without running its main.

        Returns why nothing heavy was imported (the command's module refused its command line, see
        PRELOAD_ATTRIBUTE), or None when torch and the command's modules are loaded.
        """
        late: tuple[str, ...] = ()
        if self.module is not None:
            try:  # a module run with -m keeps its work behind `if __name__ == "__main__"`
                module = importlib.import_module(self.module)
                main_name = f"{self.module}.__main__"
                if hasattr(module, "__path__"):  # a package: -m runs its __main__, warm that too
                    module = importlib.import_module(main_name)
                    # runpy executes it afresh as __main__, and warns when it finds it already imported
                    sys.modules.pop(main_name, None)
                late = _late_imports(module, self.args)
            except _Refused as exc:
                return str(exc)
            except Exception:  # noqa: S110 - preloading is best effort; the real run reports errors
                pass
        # Every optimizer's constructor imports torch._dynamo, which takes seconds: preloaded here, a replacement
        # running a plain script does not spend them between its fork and its first join.
        import torch  # noqa: F401
        import torch._dynamo  # noqa: F401
        import torch.distributed  # noqa: F401

        for name in late:
            with contextlib.suppress(Exception):  # best effort, as above
                importlib.import_module(name)
        return None

    def run(self) -> int:
        """Run as `__main__`, like the interpreter would; return the exit code."""
        try:
            if self.module is not None:
                sys.argv = [self.module, *self.args]
                runpy.run_module(self.module, run_name="__main__", alter_sys=True)
            else:
                assert self.script is not None
                sys.argv = [self.script, *self.args]
                if not sys.flags.safe_path:  # `python -P FILE.py` puts no script directory on the path
                    sys.path.insert(0, str(Path(self.script).resolve().parent))
                runpy.run_path(self.script, run_name="__main__")
        except SystemExit as exc:
            code = exc.code
            return code if isinstance(code, int) else (0 if code is None else 1)
        except BaseException:
            traceback.print_exc()
            return 1
        return 0


class _Refused(Exception):
    """The command's module refused its command line (its preload function raised)."""


def _late_imports(module: object, args: list[str]) -> tuple[str, ...]:
    """The module's PRELOAD_ATTRIBUTE, called with the command's arguments when it is a function (its
    messages silenced: the forked processes print their own)."""
    declared = getattr(module, PRELOAD_ATTRIBUTE, ())
    if not callable(declared):
        return tuple(declared)
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            return tuple(declared(list(args)))
    except SystemExit as exc:
        said = sink.getvalue().strip().splitlines()
        raise _Refused(said[-1] if said else f"exit code {exc.code}") from None
    except Exception as exc:
        raise _Refused(f"{type(exc).__name__}: {exc}") from None


def unsupported(command: list[str]) -> str | None:
    """Why a standby cannot run `command` in-process (None: it can, see PythonCommand)."""
    read = _read(command)
    return read if isinstance(read, str) else None


def _read(command: list[str]) -> PythonCommand | str:
    """`command` as a PythonCommand, or why it is none: its interpreter options, then `-m MODULE` or a FILE.py."""
    if not command or not Path(command[0]).name.startswith("python"):
        return "the command does not start with a python interpreter"
    options, i = [], 1
    while i < len(command):
        word = command[i]
        if word == "-m":
            if i + 1 == len(command):
                return "`-m` names no module"
            return PythonCommand(command[i + 1], None, command[i + 2:], tuple(options))
        if word.endswith(".py"):
            return PythonCommand(None, word, command[i + 1:], tuple(options))
        if word in VALUED_OPTIONS:
            if i + 1 == len(command):
                return f"`{word}` has no value"
            options.extend(command[i:i + 2])
            i += 2
        elif word.startswith(VALUED_OPTIONS) or (word.startswith("-") and len(word) > 1
                                                  and set(word[1:]) <= INTERPRETER_FLAGS):
            options.append(word)
            i += 1
        else:
            return (f"`{word}` is not `-m MODULE`, a FILE.py or an interpreter option a standby can keep "
                    f"(-{' -'.join(sorted(INTERPRETER_FLAGS))}, -X, -W)")
    return "the command names no `-m MODULE` and no FILE.py"


STANDBY_NICE = 10


def _preload_niced(parsed: PythonCommand, niced: bool) -> str | None:
    """`parsed.preload()` at low priority, without lowering the process's own.

    Linux niceness belongs to a thread: the import runs in a thread of its own at nice STANDBY_NICE (it
    must not slow the ranks training beside it), while the main thread, the one that forks every
    replacement, keeps normal priority. (Nicing the whole process would need each replacement to undo it, a
    privilege most users lack: the replacements would train niced.) The thread has ended before any fork.
    """
    outcome: dict[str, str | None] = {}

    def work() -> None:
        if niced:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), STANDBY_NICE)
        outcome["refused"] = parsed.preload()

    thread = threading.Thread(target=work, name="ftcoord-standby-preload")
    thread.start()
    thread.join()
    return outcome.get("refused")


def _die_with_launcher(lifeline: int) -> None:
    """A replacement dies with its launcher, however it ends, and not with its template: a thread waits for the end of
    its lifeline, a pipe whose write end only the launcher holds. (Not a parent-death signal: it fires at the
    template's death, so a standby killed would take every rank of its node with it, and their recovery would wait
    for a new standby to warm.)"""

    def watch() -> None:
        try:
            os.read(lifeline, 1)  # nothing is ever written: returns at the end, when the launcher is gone
        except OSError:
            return  # the command closed it: nothing left to watch (its launcher's fences still reach it)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="ftcoord-lifeline", daemon=True).start()


def _replacement(parsed: PythonCommand, env: dict[str, str], reply_fd: int, lifeline: int) -> None:
    """In a forked child: become the slot's process and run the command; never returns."""
    code = 1
    try:
        os.set_inheritable(reply_fd, False)  # kept to tell its exit code (below); no program it runs gets it
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the template ignores them; we must not
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        _die_with_launcher(lifeline)
        os.environ.update(env)
        os.environ[STANDBY_ENV] = "1"
        code = parsed.run()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        # Its template reaps it and tells the launcher its exit code. A template that died first tells nothing, and
        # whoever reaps the orphan (init) tells nobody: without this word an exit 0 or 2 would read as a kill.
        with contextlib.suppress(OSError):
            os.write(reply_fd, (json.dumps({"reported": os.getpid(), "code": code}) + "\n").encode())
        os._exit(code)


def main() -> None:
    """`python -m ftcoord.launcher.standby_template -- CMD...`: preload, say ready, fork a replacement per request.

    The launcher writes `{"spawn": id, "env": {...}, "by": T}` lines on the template's stdin (and `{"cancel": id}`
    for a request it gave up on). The template answers on its reply descriptor `{"ready": true, "refused": ...}`
    (refused: why the command's module turned its command line down, see PRELOAD_ATTRIBUTE), then
    `{"spawned": id, "pid": N}` (`"pid": null`: it read the request after T, a `time.monotonic()` deadline, or with
    its cancellation, and forked nothing) and `{"exited": N, "code": C}` (it is the replacements' parent and reaps
    them). Each replacement writes `{"reported": N, "code": C}` there itself as it ends: the launcher's word on its
    exit code once the template is gone.

    The template dies with its launcher (a parent-death signal), and so do its replacements, though not with the
    template: each watches a lifeline, a pipe whose write end only the launcher holds (`_die_with_launcher`), so
    the template's own death (the kernel's pick when memory runs out, say) takes no rank with it; the launcher sees
    their deaths without it (ftcoord.launcher.standby_client) and starts a new template. A closed stdin lets the
    template exit once its last replacement has.
    """
    command = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else sys.argv[1:]
    parsed = PythonCommand.parse(command)
    if parsed is None:
        print(f"ftcoord standby: cannot run {command!r} in-process: {unsupported(command)}", file=sys.stderr)
        sys.exit(2)
    die_with_launcher()
    # Ctrl-C reaches the whole process group: the launcher turns it into a graceful stop of the ranks;
    # the template must outlive that (its death would SIGKILL its replacements).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Warm up at low priority when ranks already train here: the import must not slow them.
    refused = _preload_niced(parsed, niced=os.environ.pop(NICE_ENV, "1") == "1")
    reply_fd = int(os.environ.pop(READY_FD_ENV))
    lifeline = int(os.environ.pop(LIFELINE_FD_ENV))
    os.set_inheritable(lifeline, False)  # forks keep it; what a replacement runs with exec need not

    def reply(message: str) -> None:
        os.write(reply_fd, (message + "\n").encode())

    reply(json.dumps({"ready": True, "refused": refused}))
    children: set[int] = set()
    pending = b""
    stdin_open = True
    while stdin_open or children:
        if stdin_open and select.select([0], [], [], 0.02)[0]:
            chunk = os.read(0, 65536)
            stdin_open = bool(chunk)
            pending += chunk
            lines, _, pending = pending.rpartition(b"\n")
            requests = [json.loads(line) for line in lines.split(b"\n") if line]
            cancelled = {request["cancel"] for request in requests if "cancel" in request}
            for request in requests:
                if "spawn" not in request:
                    continue
                if request["spawn"] in cancelled or time.monotonic() > request["by"]:  # given up: no second process
                    reply(json.dumps({"spawned": request["spawn"], "pid": None}))
                    continue
                pid = os.fork()
                if pid == 0:
                    _replacement(parsed, request["env"], reply_fd, lifeline)
                children.add(pid)
                reply(json.dumps({"spawned": request["spawn"], "pid": pid}))
        elif not stdin_open:
            time.sleep(0.02)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            reply(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}))
    os._exit(0)  # nothing to flush or finalize, and the interpreter's teardown of torch is slow


if __name__ == "__main__":
    main()
