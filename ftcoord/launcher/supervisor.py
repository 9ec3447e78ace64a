"""The per-node supervisor behind `ftcoord-launch`: start, watch, fence and restart.

It owns the processes of its slots. A dead process is marked dead in the store at once (nobody waits for a
heartbeat timeout) and replaced, from a warm standby when one is ready. A slot the leader fenced (hung or stalled)
is SIGKILLed here, which turns a hang into a crash that peers blocked in a gloo collective see immediately.
Its store client rides through a store that goes away (ftcoord.store.link), then tells a restarted store which
incarnation each of its slots runs and which died meanwhile (`rebuild`), so a rank killed while the store was
away is replaced and judged as soon as it returns. A store away past store_timeout ends the launcher with exit
code 75, after its processes wrote their emergency checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import InitVar, dataclass, field

import torch.distributed as dist

from ftcoord import env
from ftcoord.errors import EXIT_STORE_LOST, StoreLost, Superseded
from ftcoord.host import scratch, stack_dump
from ftcoord.host.reap import wait_killed
from ftcoord.launcher.children_env import children_env, job_env, standby_env
from ftcoord.launcher.config import LaunchConfig
from ftcoord.launcher.fence_watch import FenceWatch
from ftcoord.launcher.job_end_watch import JobEndWatch
from ftcoord.launcher.job_restarts import JobRestarts
from ftcoord.launcher.slot_process import SlotProcess
from ftcoord.launcher.standby_client import ForkedProcess, ForkFailed
from ftcoord.launcher.standby_keeper import StandbyKeeper, standby_wanted
from ftcoord.launcher.standby_template import PythonCommand, unsupported
from ftcoord.liveness.heartbeat import mark_dead
from ftcoord.log import get_logger
from ftcoord.protocol import keys, launcher_report, restore
from ftcoord.protocol.generations import started
from ftcoord.protocol.spares import SPARE_SLOT_BASE
from ftcoord.store.client import get_or_none, read_int

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
"""The launcher's own bad arguments; and a child that exited 2: a bad argument or configuration of the
command (argparse's code, `python -m training`'s for any configuration error), which no restart can fix."""
EXIT_RESTARTS_EXHAUSTED = 3
EXIT_TERMINATED = 128 + signal.SIGTERM


@dataclass
class Supervisor:
    """One launcher's loop over its node's slots (see the module docstring); `run` returns the exit code."""

    config: LaunchConfig
    store: dist.Store  # job-scoped
    slots: dict[int, SlotProcess] = field(default_factory=dict)
    job_restarts: int = 0
    terminating_since: float | None = None
    early_standby: InitVar[StandbyKeeper | None] = None
    """The warm standby ftcoord.launcher.main started before it imported torch (StandbyKeeper.start); None: made
    here."""

    def __post_init__(self, early_standby: StandbyKeeper | None) -> None:
        self._log = get_logger(component="launcher", job_id=self.config.job_id)
        self._signalled: int | None = None  # a SIGTERM/SIGINT not acted on yet (signalled)
        if self.config.warm_standby and not PythonCommand.parse(self.config.command):
            self._log.warning("warm_standby_disabled", reason=unsupported(self.config.command))
        self._job_restarts: JobRestarts | None = None
        if self.config.restart_policy == "job":
            self._job_restarts = JobRestarts(self.store)  # every launcher restarts its node's (job_restarts)
        self.standby = early_standby or StandbyKeeper(self.config.command, standby_wanted(self.config), self._log)
        self._standby_env = standby_env(self.config)
        self._fences = FenceWatch(self.store, self._log)
        self._job_end = JobEndWatch(self.config.grace_s, get_or_none(self.store, keys.STOPPED))
        self._env = children_env(self.config.nproc)
        if "OMP_NUM_THREADS" not in os.environ:
            self._log.info("omp_threads_set", omp_num_threads=self._env["OMP_NUM_THREADS"],
                           why="cores / processes, as torchrun does; set OMP_NUM_THREADS to choose")

    # -- environment and process start ------------------------------------------------

    def _child_env(self, slot: SlotProcess) -> dict[str, str]:
        values = {**job_env(self.config), env.SLOT_ENV: str(slot.slot), env.LOCAL_RANK_ENV: str(slot.local_rank)}
        if slot.slot < SPARE_SLOT_BASE:  # a worker's rank at start; a hot spare has none until it is seated
            values[env.TORCHRUN_RANK_ENV] = str(slot.slot)
        link = getattr(self.store, "link", None)
        instance = link.learn_instance(self.store) if link is not None else None
        if instance is not None:  # a child that starts while the store is away knows which one it was
            values[env.STORE_INSTANCE_ENV] = str(instance)
        return values

    def rebuild(self, store: dist.Store, base: dist.Store) -> None:
        """The store came back empty (ftcoord.protocol.restore): each slot's incarnation, a death it missed, a
        replacement on its way, and this launcher's report."""
        for slot in self.slots.values():
            if slot.finished or slot.incarnation == 0:
                continue
            restore.slot(store, slot.slot, slot.incarnation)
            if slot.process is None or slot.process.poll() is not None:
                mark_dead(store, slot.slot, slot.incarnation)
            if slot.replacing > slot.incarnation:
                store.set(keys.replacing(slot.slot), f"{slot.replacing}:{slot.replacing_beat}")
            self._report_to(store, slot)
        if self._job_restarts is not None:
            self._job_restarts.rebuild(store)
        self._log.info("store_rebuilt_by_launcher", slots=sorted(self.slots))

    def _start(self, slot: SlotProcess, from_standby: bool = True) -> None:
        """Start the slot's process: forked by the warm standby, or a new interpreter.

        A fork is asked for here and collected at the next ticks (the loop wakes when the standby answers, within
        milliseconds): the launcher never waits for its standby, so one that is stopped or starved holds up no fence
        and no other slot, and one that has not answered in time (ftcoord.launcher.standby_client.FORK_ANSWER_S) is
        given up for a new interpreter. While the standby is still warming up (it was started moments ago, or
        restarted), the start waits for it, up to STANDBY_WAIT_S: its import is further along than a new
        interpreter's.
        """
        forked = None
        if from_standby and self.standby.enabled:
            try:
                forked = self._fork(slot)
            except ForkFailed as exc:
                self._log.warning("standby_fork_failed", slot=slot.slot, reason=str(exc))
            else:
                if forked is None and (self.standby.forking(slot.slot) or self.standby.warming()):
                    slot.restart_due = time.monotonic()  # collected, or asked again, at the next tick
                    return
        if forked is not None:
            slot.process, slot.from_standby, slot.incarnation = forked, True, slot.forking_incarnation
        else:
            slot.incarnation = self._next_incarnation(slot)
            slot.process = subprocess.Popen(self.config.command, env={**self._env, **self._child_env(slot)})
            slot.from_standby = False
        slot.restart_due, slot.fence_killed = None, False
        self._log.info("child_started", slot=slot.slot, pid=slot.process.pid, incarnation=slot.incarnation,
                       from_standby=slot.from_standby, restarts=slot.restarts)
        self._report(slot)

    def _next_incarnation(self, slot: SlotProcess) -> int:
        """The incarnation the slot's next process will register as; its fence key exists before that process does
        (the process's _fence never blocks)."""
        self.store.compare_set(keys.fence(slot.slot), "", "0")
        return read_int(self.store, keys.incarnation(slot.slot)) + 1

    def _report(self, slot: SlotProcess) -> None:
        self._report_to(self.store, slot)

    def _report_to(self, store: dist.Store, slot: SlotProcess) -> None:
        launcher_report.publish(store, slot.slot, slot.process.pid if slot.process else None,
                                slot.restart_kinds, self.standby.state(), slot.last_exit)

    # -- the warm standby (ftcoord.launcher.standby_keeper) -----------------------------------------

    def _refresh_standby(self) -> None:
        if self.terminating_since is None:
            self.standby.refresh(self._standby_env, on_ready=self._report_all)

    def _report_all(self) -> None:
        for slot in self.slots.values():
            self._report(slot)

    def _fork(self, slot: SlotProcess) -> ForkedProcess | None:
        """The slot's process forked by the ready warm standby; None while it is on its way or when no standby is
        ready. Raises ForkFailed when the standby will not fork it."""
        if not self.standby.forking(slot.slot):
            self._refresh_standby()
            if not self.standby.ready():  # no store request per tick while it warms up
                return None
            slot.forking_incarnation = self._next_incarnation(slot)
            if not self.standby.ask(slot.slot, self._child_env(slot)):
                return None
        return self.standby.collect(slot.slot)

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        self._take_scratch()
        try:
            self._refresh_standby()  # the node's ranks are forked from it as soon as it is warm
            try:
                for local_rank, slot in enumerate(self.config.slots):
                    self.slots[slot] = SlotProcess(slot, local_rank)
                    self._start(self.slots[slot])
                while True:
                    now = time.monotonic()
                    code = self._tick(now)
                    if code is not None:
                        self.standby.release()
                        return code
                    self.standby.sleep(self.config.poll_s)  # less when it answers a fork sooner
            except (StoreLost, Superseded) as exc:
                return self._store_lost(exc)
        finally:
            removed = scratch.release(self.config.job_id, self.config.slots)
            self._log.info("scratch_released", removed=[str(p) for p in removed])

    def _take_scratch(self) -> None:
        """Reap what dead jobs left in this node's shared memory; own this job's (see ftcoord.host.scratch)."""
        for orphan in scratch.reap(keep_job=self.config.job_id):
            self._log.warning("scratch_reaped", path=str(orphan.path), job_id=orphan.job_id, bytes=orphan.bytes,
                              why="its job is not running on this node")
        scratch.claim(self.config.job_id)

    def signalled(self, signum: int) -> None:
        """SIGTERM/SIGINT, from the signal handler: only noted, and the loop terminates at its next tick. A handler
        runs in this thread between any two bytecodes, maybe while it holds a lock (the logger's): taking it again
        there would deadlock."""
        self._signalled = signum

    def _tick(self, now: float) -> int | None:
        if self._signalled is not None and self.terminating_since is None:
            self.terminate(self._signalled)
        if self.terminating_since is not None:
            return self._tick_terminating(now)
        for slot in self.slots.values():
            if slot.process is not None and (code := slot.process.poll()) is not None:
                outcome = self._on_exit(slot, code)
                if outcome is not None:
                    return outcome
            if slot.restart_due is not None and now >= slot.restart_due:
                self._start(slot)
        if all(s.finished for s in self.slots.values()):
            self._log.info("launcher_done", job_restarts=self.job_restarts)
            return EXIT_OK
        for slot in self.slots.values():
            slot.beat_replacement(self.store, now)
        self._fence(now)
        if self._job_restarts is not None and (number := self._job_restarts.asked_elsewhere(now)) is not None:
            return self._restart_job(number, asked_here=False)
        self._end_outstayed(now)
        self._refresh_standby()
        return None

    def _end_outstayed(self, now: float) -> None:
        """Kill the children still running grace_s after the job was done or stopped: stuck
        (ftcoord.launcher.job_end_watch). The next tick reaps them as finished."""
        running = [s for s in self.slots.values() if s.process is not None and s.process.poll() is None]
        if not running or not self._job_end.outstayed(self.store, now):
            return
        for slot in running:
            assert slot.process is not None
            self._log.warning("child_ended_after_job_end", slot=slot.slot, pid=slot.process.pid,
                              incarnation=slot.incarnation, grace_s=self.config.grace_s)
            slot.process.kill()
            wait_killed(slot.process)  # reaped by the next tick, not killed again by it

    def _replacement_coming(self, slot: SlotProcess, registered: int) -> None:
        """Say a replacement is coming *before* the death is known (a fenced process not yet reaped, an
        exit not yet marked), so the leader waits for it instead of shrinking the world and growing it
        back a moment later (ftcoord.launcher.slot_process)."""
        if self.config.restart_policy == "slot" and slot.restarts < self.config.max_restarts:
            slot.replacement_coming(self.store, registered)

    def _on_exit(self, slot: SlotProcess, code: int) -> int | None:
        pid = slot.process.pid if slot.process else None
        slot.process = None
        if pid is not None:
            stack_dump.discard_empty(self.config.log_dir, slot.slot, pid)
        if code == 0:
            slot.finished = True
            self._log.info("child_finished", slot=slot.slot, pid=pid)
            return None
        if code == EXIT_USAGE:
            return self._configuration_error(slot, pid)
        # How it ended, before anything brings its replacement: the leader names it when it decides without it.
        kind = launcher_report.exit_kind(code, slot.fence_killed)
        slot.last_exit = launcher_report.Exit(slot.incarnation, code, kind)
        self._report(slot)
        registered = read_int(self.store, keys.incarnation(slot.slot))
        self._replacement_coming(slot, registered)
        if registered >= slot.incarnation:
            mark_dead(self.store, slot.slot, slot.incarnation)
        self._log.warning("child_exited", slot=slot.slot, pid=pid, code=code, incarnation=slot.incarnation)
        if self._job_end.ended(self.store, time.monotonic()):  # done or stopped: nothing left to join
            slot.finished = True
            return None
        fatal = get_or_none(self.store, keys.FATAL)
        if fatal is not None:
            print(f"ftcoord-launch: the job failed: {fatal.decode()}; not restarting.", file=sys.stderr)
            self._log.error("job_failed", error=fatal.decode())
            self._kill_all()
            return EXIT_FAILED
        if self._job_restarts is not None:
            return self._restart_job(*self._job_restarts.ask())
        if slot.restarts >= self.config.max_restarts:
            self._log.error("restarts_exhausted", slot=slot.slot, restarts=slot.restarts,
                            max_restarts=self.config.max_restarts, last_code=code)
            print(f"ftcoord-launch: slot {slot.slot} died {slot.restarts + 1} times (max_restarts="
                  f"{self.config.max_restarts}; last exit code {code}); stopping this node's processes. "
                  f"Raise --max-restarts or fix the cause in the logs above.", file=sys.stderr)
            self._kill_all()
            return EXIT_RESTARTS_EXHAUSTED
        slot.restarts += 1
        slot.restart_kinds[launcher_report.exit_kind(code, slot.fence_killed)] += 1
        delay = slot.delay.after(came_up=registered >= slot.incarnation)
        slot.restart_due = time.monotonic() + delay
        self._log.info("slot_restart_scheduled", slot=slot.slot, delay_s=delay, restarts=slot.restarts)
        return None

    def _configuration_error(self, slot: SlotProcess, pid: int | None) -> int:
        """A child refused its command line or configuration (exit 2): end the job now, restart nothing.

        The whole job fails (`fatal`), so every other node's processes stop too; a job that never
        formed a generation leaves no keys of this launcher's behind in the store.
        """
        message = (f"slot {slot.slot} exited with code 2: a bad argument or configuration of the command "
                   f"(its message is above)")
        print(f"ftcoord-launch: {message}; not restarting. Fix the command and launch again.", file=sys.stderr)
        self._log.error("child_configuration_error", slot=slot.slot, pid=pid)
        self._kill_all()
        if started(self.store):
            self.store.compare_set(keys.FATAL, "", message)
        else:
            self._forget_unstarted_job()
        return EXIT_USAGE

    def _forget_unstarted_job(self) -> None:
        """Delete the keys this launcher wrote for a job that never started (nothing else knows them)."""
        for slot in self.config.slots:
            for key in (keys.fence(slot), keys.replacing(slot), keys.incarnation(slot), keys.dead(slot),
                        keys.launcher(slot)):
                self.store.delete_key(key)

    def _restart_job(self, number: int, asked_here: bool) -> int | None:
        """The classic whole-job restart: stop every process of this node, start them all again; the job's
        restart `number`, asked by this launcher (a process of this node died) or by another one
        (ftcoord.launcher.job_restarts: every launcher restarts its own node's)."""
        if self.job_restarts >= self.config.max_restarts:
            self._log.error("restarts_exhausted", job_restarts=self.job_restarts)
            print(f"ftcoord-launch: the job restarted {self.job_restarts} times (max_restarts="
                  f"{self.config.max_restarts}); giving up.", file=sys.stderr)
            self._kill_all()
            return EXIT_RESTARTS_EXHAUSTED
        self.job_restarts += 1
        self._kill_all()
        # One `job_restart` per restart of the job (the launcher that asked), `job_restart_followed` on the others.
        self._log.warning("job_restart" if asked_here else "job_restart_followed", job_restarts=self.job_restarts,
                          number=number)
        for slot in self.slots.values():
            slot.finished = False
            slot.restart_kinds["job"] += 1
            self._start(slot, from_standby=False)
        return None

    def _kill_all(self) -> None:
        self.standby.abandon_forks()
        for slot in self.slots.values():
            if slot.process is not None and slot.process.poll() is None:
                slot.process.kill()
        for slot in self.slots.values():
            if slot.process is not None:
                wait_killed(slot.process)
                if read_int(self.store, keys.incarnation(slot.slot)) >= slot.incarnation:
                    mark_dead(self.store, slot.slot, slot.incarnation)
                slot.process = None

    def _fence(self, now: float, replacing: bool = True) -> None:
        """Kill the processes the leader declared dead, at once (ftcoord.launcher.fence_watch); `replacing`: say a
        replacement is on its way (not while this launcher stops).

        Even inside `call.atomic()` (a checkpoint commit): a commit is crash-safe by construction
        (a kill mid-write leaves a temp directory, never a torn checkpoint), so waiting would only
        turn a hang into a longer stall for every peer. The kill waits only for the process's stacks
        (ftcoord.host.stack_dump: DUMP_WAIT_S + WRITE_WAIT_S at most, after the replacement was announced).
        """
        running = [s for s in self.slots.values() if s.process is not None and s.process.poll() is None]
        fenced = self._fences.fenced(running, now)
        for slot in fenced:  # every answer first: the leader waits FENCE_ANSWER_S for each, not for the dumps
            assert slot.process is not None
            self._log.warning("rank_fenced_killed", slot=slot.slot, pid=slot.process.pid,
                              incarnation=slot.incarnation)
            if replacing:
                self._replacement_coming(slot, read_int(self.store, keys.incarnation(slot.slot)))
        for slot in fenced:
            assert slot.process is not None
            stack_dump.before_kill(slot.process.pid, slot.slot, self.config.log_dir, self._log)
            slot.process.kill()
            slot.fence_killed = True

    def _store_lost(self, exc: StoreLost | Superseded) -> int:
        """The store stayed away past store_timeout (or came back as an instance this launcher cannot vouch
        for): the processes saw it too; they write their emergency checkpoint and exit 75. Wait for them (up
        to the grace period), then end with the same code."""
        self._log.error("store_lost_exit", error=str(exc), exit_code=EXIT_STORE_LOST)
        self.standby.abandon_forks()
        print(f"ftcoord-launch: {exc}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + self.config.grace_s
        for slot in self.slots.values():
            if slot.process is None:
                continue
            while slot.process.poll() is None and time.monotonic() < deadline:
                time.sleep(self.config.poll_s)
            if slot.process.poll() is None:
                self._log.error("child_killed_after_grace", slot=slot.slot, pid=slot.process.pid)
                slot.process.kill()
                wait_killed(slot.process)
        self.standby.release()
        return EXIT_STORE_LOST

    # -- termination ---------------------------------------------------------------------

    def terminate(self, signum: int) -> None:
        """SIGTERM/SIGINT to the launcher: forward SIGTERM, escalate after the grace period."""
        if self.terminating_since is not None:
            return
        self.terminating_since = time.monotonic()
        self._log.warning("launcher_terminating", signal=signal.Signals(signum).name, grace_s=self.config.grace_s)
        for slot in self.slots.values():
            if slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGTERM)

    def _tick_terminating(self, now: float) -> int | None:
        assert self.terminating_since is not None
        self.standby.abandon_forks()  # here, not in terminate: a signal handler may interrupt a fork's collection
        alive = [s for s in self.slots.values() if s.process is not None and s.process.poll() is None]
        if not alive:
            ended = [(s.process.returncode, s.fence_killed) for s in self.slots.values() if s.process is not None]
            codes = [code for code, _ in ended]
            clean = all(code == 0 or fence_killed for code, fence_killed in ended)  # fenced: see below
            self._log.info("launcher_stopped", clean=clean, codes=codes)
            return EXIT_OK if clean else EXIT_TERMINATED
        self._fence_while_stopping(now)
        if now - self.terminating_since > self.config.grace_s:
            for slot in alive:
                assert slot.process is not None
                self._log.error("child_killed_after_grace", slot=slot.slot, pid=slot.process.pid)
                slot.process.kill()
                wait_killed(slot.process)
            return EXIT_TERMINATED
        return None

    def _fence_while_stopping(self, now: float) -> None:
        """A child the leader fences while this launcher stops (it hung as a preemption came) is killed at once, as at
        any other time, with no replacement announced; it counts as a clean end (the leader left it out, and its
        peers stopped without it). Otherwise it would hold the stop until it woke, or for grace_s (30 s by default)
        if it never did, and the relaunch waits for every launcher. A store away while stopping is not waited for:
        the grace period ends the stop anyway."""
        link = getattr(self.store, "link", None)
        if link is not None and (link.down or link.lost is not None):
            return
        try:
            self._fence(now, replacing=False)
        except Exception as exc:  # noqa: BLE001 - the store went away meanwhile: as above
            self._log.warning("fences_unread_while_stopping", error=str(exc))
