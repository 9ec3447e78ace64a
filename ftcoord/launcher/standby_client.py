"""The launcher's handle on its warm standby (ftcoord.launcher.standby_template): asking for replacements.

The launcher never waits for the template: it asks (`WarmStandby.request_fork`) and collects the answer at a later tick
(`PendingFork.collect`), and writes to a non-blocking stdin: a request the full pipe takes none of is not sent (a
template that stopped reading leaves its launcher a full pipe), so a template that stops answering holds up no fence and
no other slot. One that is stopped (SIGSTOP, a frozen cgroup), or has not answered by FORK_ANSWER_S (starved), is given
up on at once: a new interpreter takes the slot, and what the template forks for it after all is refused or killed,
never a second process for the slot. A replacement's death is seen without the template too (`ForkedProcess.poll` reads
a zombie's exit status): a stopped template reaps nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ftcoord.host.process_state import stopped, zombie_exit_code
from ftcoord.host.reap import wait_killed
from ftcoord.launcher.standby_template import LIFELINE_FD_ENV, NICE_ENV, READY_FD_ENV, PythonCommand

FORK_ANSWER_S = 2.0
"""How long the template may take to fork a replacement (milliseconds when it is well) before it forks nothing for
that request and the launcher starts a new interpreter instead (seconds of imports, but not waiting on a template
that is stopped or starved)."""
ZOMBIE_LOOK_S = 0.1
"""How often a replacement's end is looked for in /proc, beside its template's word (which a stopped template does
not send): a look is cheap but not free, and the launcher polls each process several times a tick."""
FORK_MARGIN_S = 0.5
"""How much longer than FORK_ANSWER_S the launcher waits for the answer: a fork made just before the deadline is
still collected, not killed."""


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
    """The rest of a line longer than PIPE_BUF that a write did not take (the pipe had room for less): sent first."""

    @classmethod
    def start(cls, command: list[str], env: dict[str, str], niced: bool = True) -> WarmStandby:
        read_fd, write_fd = os.pipe()
        lifeline_read, lifeline_write = os.pipe()
        parsed = PythonCommand.parse(command)  # its interpreter options are the template's: a fork keeps them
        options = list(parsed.options) if parsed is not None else []
        process = subprocess.Popen([sys.executable, *options, "-m", "ftcoord.launcher.standby_template", "--",
                                    *command],
                                   stdin=subprocess.PIPE,
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
