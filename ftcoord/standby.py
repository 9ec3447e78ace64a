"""Warm standby: a template process that has imported torch and forks a ready replacement at once.

Starting Python and importing torch costs seconds (2-4 s here, far more on a busy node), which
would dominate a restart. The launcher keeps one warm standby: a process that imported torch and
the user's module (for `python -m MODULE`, its `__main__` too) at low priority and then waits. When a
slot dies the launcher asks it for a replacement and it *forks* one, which takes its slot's
environment and runs the user's command in-process with runpy (`python SCRIPT ARGS` and
`python -m MODULE ARGS` are supported): a replacement is ready in milliseconds, and as many as
faults need, at once. (A standby that became the replacement itself, as before, left the next
fault a cold start while a new standby warmed up: the demo measured 2.6 s per recovery on 2 cores.)

Forking is safe because the template never runs a torch op (torch's thread pools start lazily)
and touches no accelerator; numpy's OpenBLAS, the one library that starts a thread at import,
shuts its pool down around fork. Protocol: the launcher writes `{"spawn": id, "env": {...}, "by": T}` lines
on the template's stdin (and `{"cancel": id}` for a request it gave up on); the template answers on its reply
descriptor `{"ready": true, "refused": ...}` (refused: why the command's module turned its command line down, see
PRELOAD_ATTRIBUTE), then `{"spawned": id, "pid": N}` (`"pid": null`: it read the request after T, a
`time.monotonic()` deadline, or with its cancellation, and forked nothing) and `{"exited": N, "code": C}` (it is the
replacements' parent and reaps them); each replacement says `{"reported": N, "code": C}` there itself as it ends,
the launcher's word on its exit code once the template is gone. The template dies with its launcher (a parent-death
signal), and so do its replacements, though not with the template: each watches a lifeline, a pipe whose write end
only the launcher holds (`_die_with_launcher`), so the template's own death (the kernel's pick when memory runs out,
say) takes no rank with it; the launcher sees their deaths without it (below) and starts a new template. A closed
stdin lets the template exit once its last replacement has.

The launcher never waits for the template: it asks (`WarmStandby.request_fork`) and collects the answer at a later
tick (`PendingFork.collect`), and writes to a non-blocking stdin: a request the full pipe takes none of is not sent
(a template that stopped reading leaves its launcher a full pipe), so a template that stops answering holds up no
fence and no other slot.
One that is stopped (SIGSTOP, a frozen cgroup), or has not answered by FORK_ANSWER_S (starved), is given up on at
once: a new interpreter takes the slot, and what the template forks for it after all is refused or killed, never a
second process for the slot. A replacement's death is seen without the template too (`ForkedProcess.poll` reads a
zombie's exit status): a stopped template reaps nothing.
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
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ftcoord.env import die_with_launcher
from ftcoord.process_state import stopped, zombie_exit_code
from ftcoord.reap import wait_killed

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
FORK_ANSWER_S = 2.0
"""How long the template may take to fork a replacement (milliseconds when it is well) before it forks nothing for
that request and the launcher starts a new interpreter instead (seconds of imports, but not waiting on a template
that is stopped or starved)."""
ZOMBIE_LOOK_S = 0.1
"""How often a replacement's end is looked for in /proc, beside its template's word (which a stopped template does
not send): a look costs ~20 us here, and the launcher polls each process several times a tick."""
FORK_MARGIN_S = 0.5
"""How much longer than FORK_ANSWER_S the launcher waits for the answer: a fork made just before the deadline is
still collected, not killed."""


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
        # Every optimizer's constructor imports torch._dynamo (1.6-2 s here): a replacement running a
        # plain script (the quickstart) spent that long between its fork and its first join.
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


STANDBY_NICE = 10


def _preload_niced(parsed: PythonCommand, niced: bool) -> str | None:
    """`parsed.preload()` at low priority, without lowering the process's own.

    Linux niceness belongs to a thread: the import runs in a thread of its own at nice STANDBY_NICE (it
    must not slow the ranks training beside it), while the main thread, the one that forks every
    replacement, keeps normal priority. (Nicing the process and undoing it in each replacement needs a
    privilege most users lack: their replacements trained niced.) The thread has ended before any fork.
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
    its lifeline, a pipe whose write end only the launcher holds. (A parent-death signal fires at the template's
    death: a standby killed took every rank of its node with it, and their recovery waited for a new one to warm.)"""

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
    """`python -m ftcoord.standby -- CMD...`: preload, say ready, fork a replacement per request."""
    command = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else sys.argv[1:]
    parsed = PythonCommand.parse(command)
    if parsed is None:
        print(f"ftcoord standby: cannot run {command!r} in-process", file=sys.stderr)
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
    os._exit(0)  # nothing to flush or finalize; the interpreter's teardown of torch would take ~1 s


@dataclass
class ForkedProcess:
    """A replacement forked by the warm standby: the subset of Popen the launcher uses."""

    pid: int
    standby: WarmStandby
    returncode: int | None = None
    _looked_at: float = 0.0  # when /proc last said it had not ended

    def poll(self) -> int | None:
        if self.returncode is None:
            self.standby.pump()
        if self.returncode is None and (now := time.monotonic()) >= self._looked_at + ZOMBIE_LOOK_S:
            self._looked_at = now
            self.returncode = zombie_exit_code(self.pid)  # dead, and its template has not reaped it (stopped, busy)
        if self.returncode is None and not self.standby.alive and not Path(f"/proc/{self.pid}").exists():
            self.standby.pump()  # its own word on its exit code, written before it ended (_replacement)
            # none: it said nothing (a signal ended it, or an os._exit of its own), taken for a kill
            self.returncode = self.standby.reported.pop(self.pid, -signal.SIGKILL)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkFailed(Exception):
    """The template will not fork the replacement asked for (it died, read the request too late, or did not
    answer in time)."""


@dataclass(frozen=True)
class PendingFork:
    """A replacement asked of the template and not collected yet (WarmStandby.request_fork)."""

    standby: WarmStandby
    number: int
    answer_by: float
    """time.monotonic(): the template forks nothing for this request after it."""
    give_up_at: float
    """time.monotonic(): the launcher collects nothing for it after it (answer_by and a margin)."""

    def collect(self) -> ForkedProcess | None:
        """The replacement, once the template forked it; None while its answer is on its way. Raises ForkFailed
        when none will come; a request not answered by give_up_at is given up (abandon)."""
        return self.standby.collect(self)

    def abandon(self) -> None:
        """Nobody will collect this fork: the template forks nothing for it once it reads its cancellation (or after
        answer_by), and a process it forked before that is killed as soon as its answer comes."""
        self.standby.abandon(self)


@dataclass
class WarmStandby:
    """The launcher's handle on its warm standby (see the module docstring)."""

    process: subprocess.Popen[bytes]
    reply_fd: int
    lifeline_fd: int
    """The write end of its replacements' lifeline (_die_with_launcher): open while they may run; close ends them."""
    ready: bool = False
    refused: str | None = None
    """Why the command's module refused its command line when the standby warmed up (it preloaded
    nothing heavy); None when it preloaded."""
    children: dict[int, ForkedProcess] = field(default_factory=dict)
    reported: dict[int, int] = field(default_factory=dict)
    """The exit codes its replacements told as they ended (by pid): the only word left once the template died."""
    _buffer: bytes = b""
    _spawned: dict[int, int | None] = field(default_factory=dict)
    _abandoned: set[int] = field(default_factory=set)
    _requests: int = 0
    _unsent: bytes = b""
    """What a write took not of a line longer than PIPE_BUF (the pipe had room for less): it goes before any other."""

    @classmethod
    def start(cls, command: list[str], env: dict[str, str], niced: bool = True) -> WarmStandby:
        read_fd, write_fd = os.pipe()
        lifeline_read, lifeline_write = os.pipe()
        process = subprocess.Popen([sys.executable, "-m", "ftcoord.standby", "--", *command], stdin=subprocess.PIPE,
                                   pass_fds=(write_fd, lifeline_read),
                                   env={**env, READY_FD_ENV: str(write_fd), LIFELINE_FD_ENV: str(lifeline_read),
                                        NICE_ENV: "1" if niced else "0"})
        os.close(write_fd)
        os.close(lifeline_read)
        os.set_blocking(read_fd, False)
        os.set_blocking(process.stdin.fileno(), False)  # see _send
        return cls(process, read_fd, lifeline_write)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def pump(self) -> None:
        """Read what the standby said (readiness, forks, exits) without blocking; write the rest of a line it was
        sent in part (_send)."""
        self._write_unsent()
        try:
            chunk = os.read(self.reply_fd, 65536)
        except (BlockingIOError, OSError):
            return
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            message = json.loads(line)
            if "ready" in message:
                self.ready, self.refused = True, message["refused"]
            elif "spawned" in message:
                self._answered(message["spawned"], message["pid"])
            elif "reported" in message:
                self.reported[message["reported"]] = message["code"]
            else:  # reaped: the template's word is the last
                self.reported.pop(message["exited"], None)
                if message["exited"] in self.children:
                    self.children.pop(message["exited"]).returncode = message["code"]

    def collect(self, pending: PendingFork) -> ForkedProcess | None:
        """See PendingFork.collect."""
        self.pump()
        if pending.number in self._spawned:
            pid = self._spawned.pop(pending.number)
            if pid is None:
                raise ForkFailed("the standby read the request after its deadline and forked nothing")
            child = ForkedProcess(pid, self)
            self.children[pid] = child
            return child
        if not self.alive:
            raise ForkFailed(f"the standby died (exit code {self.process.returncode})")
        if stopped(self.process.pid):  # it answers nothing until continued, which may be never: a new interpreter
            self.abandon(pending)
            raise ForkFailed("the standby is stopped (SIGSTOP, a debugger, a frozen cgroup)")
        if time.monotonic() > pending.give_up_at:
            self.abandon(pending)
            raise ForkFailed(f"the standby did not answer by its deadline and a margin "
                             f"({pending.give_up_at - pending.answer_by:.1f} s): stopped or starved")
        return None

    def abandon(self, pending: PendingFork) -> None:
        """See PendingFork.abandon."""
        self._abandoned.add(pending.number)
        if pending.number in self._spawned:  # answered, not collected
            self._answered(pending.number, self._spawned.pop(pending.number))
        else:  # not sent when it does not fit: the request's deadline forks nothing
            self._send({"cancel": pending.number})

    def _answered(self, number: int, pid: int | None) -> None:
        if number not in self._abandoned:
            self._spawned[number] = pid
            return
        self._abandoned.discard(number)
        if pid is not None:  # forked just before its deadline, after the launcher gave up on it: not a second process
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def request_fork(self, env: dict[str, str], answer_s: float = FORK_ANSWER_S,
                     margin_s: float = FORK_MARGIN_S) -> PendingFork | None:
        """Ask for a replacement with `env` added, forked at once; collect it with PendingFork.collect at later ticks.
        None when the standby cannot take requests (not ready, dead, or its pipe is full: it stopped reading)."""
        if not self.ready or not self.alive:
            return None
        self._requests += 1
        answer_by = time.monotonic() + answer_s
        pending = PendingFork(self, self._requests, answer_by, answer_by + margin_s)
        if not self._send({"spawn": pending.number, "env": env, "by": pending.answer_by}):
            return None
        return pending

    def _send(self, message: dict[str, object]) -> bool:
        """Write one line to the template's stdin without blocking; False when the pipe takes none of it now, or the
        template is gone. A template that stopped reading (stopped, starved) would otherwise hold up the launcher,
        every fence and every other slot with it, in a write to a full pipe.

        The stdin is non-blocking, and the kernel alone knows the room left: a pipe holds 16 pages, not 64 KB, and
        a line that does not fit in the last page's rest takes a page of its own. A line of up to PIPE_BUF (4 KB) goes
        whole or not at all; of a longer one, the rest a write did not take goes at the next pump or send, before any
        other line, and the line counts as sent (its deadline and cancellation hold as for any)."""
        if not self._write_unsent():
            return False
        line = (json.dumps(message) + "\n").encode()
        written = self._write(line)
        self._unsent = line[written:] if written else b""
        return written > 0

    def _write_unsent(self) -> bool:
        """Write what is left of a line sent in part; True when nothing is left."""
        if self._unsent:
            self._unsent = self._unsent[self._write(self._unsent):]
        return not self._unsent

    def _write(self, data: bytes) -> int:
        """Bytes of `data` the template's stdin takes now: 0 when its pipe is full, the template is gone (broken
        pipe) or its stdin closed."""
        stdin = self.process.stdin
        try:
            return os.write(stdin.fileno(), data) if stdin is not None else 0
        except (OSError, ValueError):  # BlockingIOError is an OSError
            return 0

    def wait_answer(self, timeout: float) -> None:
        """Sleep until the template says something (a fork's answer, say) or `timeout` passes."""
        select.select([self.reply_fd], [], [], timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Let the standby go: it exits once its replacements have (killed after `timeout`, and what it forked with
        it: the lifeline ends)."""
        if self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        deadline = time.monotonic() + timeout
        while self.alive and time.monotonic() < deadline:
            self.pump()  # a fork given up on and made anyway is killed (_answered), not waited for
            time.sleep(0.005)
        if self.alive:
            self.process.kill()
            wait_killed(self.process)
        os.close(self.reply_fd)
        os.close(self.lifeline_fd)


if __name__ == "__main__":
    main()
