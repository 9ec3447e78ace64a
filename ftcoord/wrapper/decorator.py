"""`Wrapper`: the decorator that runs a training function through faults with in-process restarts.

    @Wrapper(store="127.0.0.1:29600", job_id="llm-7", min_world_size=2, heartbeat_timeout=5.0)
    def train(call: CallWrapper, cfg): ...

Each call of the function is one generation. On a fault (an exception, a failed collective, an interrupt because
a peer died, hung or rejoined) the wrapper tears down the generation's process group and calls the function again
for the next generation, in the same Python process. Constructing a Wrapper and `check_configuration()` import no
torch: a program refuses a bad configuration before it pays for torch, and so can the warm standby's preload
(ftcoord.launcher.standby_template).
"""

from __future__ import annotations

import functools
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ftcoord import env, log
from ftcoord.config import QuorumPolicy, Timing
from ftcoord.errors import (
    EXIT_STORE_LOST,
    FatalError,
    FtcoordError,
    JobFinished,
    StoreLost,
    StoreUnavailable,
    Superseded,
)
from ftcoord.host import stack_dump
from ftcoord.host.process_title import rank_title, set_title
from ftcoord.store.address import StoreAddress, check_job_id

if TYPE_CHECKING:
    from ftcoord.wrapper.participant import Participant

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_MAX_RESTARTS = 32
DEFAULT_PG_TIMEOUT_S = 60.0


class RestartsExhausted(FtcoordError):
    """The function failed more often than max_restarts allows."""


def release_frames(exc: BaseException) -> None:
    """Drop the locals of every frame a failed generation's exception still holds.

    A traceback keeps the failed call's frames, and with them its process group and DDP module,
    alive: gloo keeps a live group's sockets open (peers stay blocked in their collective), and a
    live DDP reducer keeps its autograd hooks on the parameters, so the next generation's backward
    would fire them too. The exception itself (type and message) stays for the log.
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]


class Wrapper:
    """Decorator that makes a training function survive faults (see the module docstring).

    Every argument has a default, so `@Wrapper()` works under `ftcoord-launch`. Store, job id, slot and
    world size left as None are read from the environment when the function runs (ftcoord.env: the
    launcher sets FTCOORD_*, torchrun and SLURM set the fallbacks). Timing arguments left as None take
    the defaults of `ftcoord.config.Timing`; all times are in seconds.

    Args:
        store: "HOST:PORT" of the ftcoord-store server. None: $FTCOORD_STORE, else "127.0.0.1:29600".
        job_id: names the job; its keys live under `ftcoord/<job_id>/` in the store. None:
            $FTCOORD_JOB_ID, else torchrun's $TORCHELASTIC_RUN_ID, else $SLURM_JOB_ID, else "default".
        slot: this process's slot, a stable integer >= 0 that a replacement process takes over. None:
            $FTCOORD_SLOT, else $RANK, else $SLURM_PROCID, else 0.
        world_size: the job's target world size (processes it runs with when all are alive). None:
            $FTCOORD_WORLD_SIZE, else $WORLD_SIZE, else $SLURM_NTASKS, else 1.
        min_world_size: the fewest members a generation may have (default 1); with fewer processes
            alive the job waits, up to barrier_timeout, then fails with QuorumTimeout.
        max_world_size: the most members a generation may have (hot spares beyond it wait). None:
            the target world size.
        global_batch: the job's constant global batch; when given, only world sizes that divide it
            are picked, and a target world size that does not divide it is refused (ConfigError).
            None: any size in [min_world_size, max_world_size].
        heartbeat_interval: seconds between two heartbeats of this process. None: Timing's 0.5.
        heartbeat_timeout: seconds of unchanged heartbeat after which a process is dead; at least
            two intervals and below barrier_timeout. None: Timing's 5.0.
        join_timeout: seconds the leader waits for missing live slots before it decides a smaller
            generation; below barrier_timeout. None: Timing's 3.0.
        barrier_timeout: seconds after which too few joiners fail the generation with
            QuorumTimeout. None: Timing's 120.0.
        progress_timeout: seconds a member's training thread may go without a `call.ping()` while not
            waiting on its peers before the leader fences it as stuck (its launcher kills it and the slot
            gets a new process); it must exceed heartbeat_interval; math.inf never calls a member stuck. None:
            `Timing.progress_timeout_below(pg_timeout)`, i.e. 12 heartbeat timeouts, and at most two
            thirds of pg_timeout (40 s at the defaults). A value at or above pg_timeout is accepted
            with a warning: a stuck member is then ended by its peers' collective timeout instead.
        store_timeout: seconds this process rides through a store that went away before it gives up
            (`call.should_stop` and `call.store_lost` are set; then exit code 75). None:
            $FTCOORD_STORE_TIMEOUT (which ftcoord-launch sets from --store-timeout), else Timing's 300.0.
        max_restarts: how many times this process's own code may fail (an exception not caused by a
            peer) before `run` raises RestartsExhausted; restarts caused by peers do not count.
            Default 32 (DEFAULT_MAX_RESTARTS); must be >= 0.
        pg_timeout: seconds a collective of the generation's process group may block before it
            fails; also bounds the wait for every member at the rendezvous. Default 60.0
            (DEFAULT_PG_TIMEOUT_S).
        log_dir: directory for this process's JSON-lines log, `slot<S>-<pid>.jsonl`. None:
            $FTCOORD_LOG_DIR (set by `ftcoord-launch --log-dir`), else none. Outside ftcoord-launch,
            events also go to the standard loggers `ftcoord.<component>` (your logging setup decides).
        handle_sigterm: install a SIGTERM handler while the function runs (main thread only) that
            asks the whole job to stop at a step boundary (`call.should_stop`). Default True.

    Raises:
        ConfigError: a timing that breaks Timing's invariants.
        FtcoordError: progress_timeout not above heartbeat_interval, or max_restarts below 0.
    """

    def __init__(
        self,
        store: str | None = None,
        job_id: str | None = None,
        slot: int | None = None,
        world_size: int | None = None,
        *,
        min_world_size: int = 1,
        max_world_size: int | None = None,
        global_batch: int | None = None,
        heartbeat_interval: float | None = None,
        heartbeat_timeout: float | None = None,
        join_timeout: float | None = None,
        barrier_timeout: float | None = None,
        progress_timeout: float | None = None,
        store_timeout: float | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        pg_timeout: float = DEFAULT_PG_TIMEOUT_S,
        log_dir: str | Path | None = None,
        handle_sigterm: bool = True,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.slot = slot
        self.world_size = world_size
        self.min_world_size = min_world_size
        self.max_world_size = max_world_size
        self.global_batch = global_batch
        overrides = {k: v for k, v in {
            "heartbeat_interval": heartbeat_interval, "heartbeat_timeout": heartbeat_timeout,
            "join_timeout": join_timeout, "barrier_timeout": barrier_timeout,
            "store_timeout": store_timeout if store_timeout is not None
            else env.store_timeout_from_env(Timing.store_timeout)}.items() if v is not None}
        self.timing = Timing(**overrides)
        if progress_timeout is not None and progress_timeout <= self.timing.heartbeat_interval:
            raise FtcoordError(f"progress_timeout={progress_timeout}s must exceed heartbeat_interval="
                               f"{self.timing.heartbeat_interval}s")
        if progress_timeout is not None and math.isfinite(progress_timeout) and progress_timeout >= pg_timeout:
            # Allowed, but a stuck member then costs its slot for a while (Timing.progress_timeout_below)
            log.get_logger(component="wrapper").warning(
                "progress_timeout_not_below_pg_timeout", progress_timeout=progress_timeout, pg_timeout=pg_timeout,
                effect="a member stuck in its step is ended by its peers' collective timeout, not fenced and replaced",
                what_to_do="set progress_timeout below pg_timeout (or leave it unset: 2/3 of pg_timeout at most)")
        self.progress_timeout = (self.timing.progress_timeout_below(pg_timeout) if progress_timeout is None
                                 else progress_timeout)
        if max_restarts < 0:
            raise FtcoordError(f"max_restarts={max_restarts} must be >= 0")
        self.max_restarts = max_restarts
        self.pg_timeout = timedelta(seconds=pg_timeout)
        self.log_dir = log_dir
        self.handle_sigterm = handle_sigterm

    def __call__(self, fn: Callable[..., R]) -> Callable[..., R | None]:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> R | None:
            return self.run(fn, *args, **kwargs)

        return wrapped

    def check_configuration(self) -> None:
        """Check what can be checked before connecting to anyone, without importing torch.

        Reads the store address, job id, slot and world size (from the environment where not given)
        and builds the quorum policy: a target world size that does not divide global_batch is refused
        here, up front.

        Raises:
            ConfigError: with the value, the limit and what to do.
        """
        self._policy()
        StoreAddress.parse(self.store or env.store_from_env())
        check_job_id(self.job_id or env.job_id_from_env())

    def _policy(self) -> QuorumPolicy:
        target = self.world_size if self.world_size is not None else env.world_size_from_env()
        return QuorumPolicy(target, self.min_world_size, self.max_world_size, self.global_batch)

    def _participant(self) -> Participant:
        from ftcoord.wrapper.participant import Participant

        slot = self.slot if self.slot is not None else env.slot_from_env()
        return Participant(self.store or env.store_from_env(), self.job_id or env.job_id_from_env(),
                           slot, self._policy(), self.timing, self.progress_timeout)

    def run(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R | None:
        """Run `fn(call, *args, **kwargs)` until it returns on every member.

        Args:
            fn: the training function; its first argument is the generation's CallWrapper.
            *args: passed on to `fn` after the CallWrapper, unchanged, at every call.
            **kwargs: passed on to `fn`, unchanged, at every call.

        Returns:
            What `fn` returned in the generation that completed, or None for a hot spare that was
            never needed.

        Raises:
            RestartsExhausted: more than max_restarts in-process restarts.
            QuorumTimeout: too few processes to form a generation.
            Superseded: this process was replaced while it was paused; it must exit.
            SystemExit: one line, at once, when this process is a worker of torchrun's agent (see
                `env.torchrun_refusal`), or when no store answered within connect_timeout; one line and
                exit code 75 (EXIT_STORE_LOST) when the store stayed away past store_timeout (the function
                saw `should_stop` first: its emergency checkpoint is written).
        """
        from ftcoord.wrapper.call import CallWrapper, GenerationInterrupted, is_peer_failure

        refusal = env.torchrun_refusal()
        if refusal is not None:
            raise SystemExit(refusal)
        env.die_with_launcher()
        log_dir = self.log_dir or os.environ.get(env.LOG_DIR_ENV)
        participant = self._participant()
        route_events(log_dir, participant.slot)
        self._start(participant)
        logger = log.get_logger(component="wrapper", slot=participant.slot, incarnation=participant.incarnation)
        restore_signal = self._install_sigterm(participant)
        pg_store = participant.clone_store()
        restarts, own_failures, step = 0, 0, -1
        leaving = True
        stack_dump.install(log_dir, participant.slot)  # a fence's SIGKILL is preceded by a dump of every stack
        if env.launched():  # a launcher's ranks share its standby's command line; a process of the user's keeps its own
            set_title(rank_title(participant.job_id, participant.slot))
        try:
            while True:
                try:
                    record = participant.join(step)
                except JobFinished:
                    logger.info("spare_exit", reason="job finished without needing this process")
                    return None
                except Superseded as exc:  # a newer incarnation holds the slot: nothing of ours may be written
                    logger.error("superseded_exit", reason=str(exc))
                    leaving = False
                    raise
                call = CallWrapper(participant, record, restarts, pg_store, self.pg_timeout)
                call.step = step
                participant.report.joined(record.generation, call.rank, record.heal_source, record.start_step,
                                          record.world_size, record.cause)
                logger.info("function_started", generation=record.generation, rank=call.rank,
                            world_size=record.world_size, restarts=restarts, mono=time.monotonic())
                collateral, ended_by = True, None
                try:
                    result = fn(call, *args, **kwargs)
                except FatalError as exc:  # no restart can fix it: end the job everywhere
                    message = f"slot {participant.slot}: {type(exc).__name__}: {exc}"
                    participant.generations.fail(message)
                    participant.interrupt(f"fatal:slot={participant.slot}")
                    logger.error("job_failed", error=message)
                    call.teardown(failed=True)
                    raise
                except Exception as exc:  # any fault of this generation: restart in-process
                    cause: BaseException = exc
                    # Collateral: the generation was already over (a peer died, hung or
                    # raised) or a collective failed because of a peer. Only this rank's own
                    # failures count against max_restarts.
                    peer_failed = is_peer_failure(exc) or call.group_failed  # read before the teardown below
                    collateral = peer_failed or participant.generations.is_interrupted(record.generation)
                    if not peer_failed:  # its own code raised, even in a generation already ending
                        call.report_raised(exc)
                    closed = call.report_closed_peers(exc)
                    if closed is not None:
                        participant.leader.note_closed(record)
                    ended_by = participant.interrupt(f"exception:slot={participant.slot}:{type(exc).__name__}"
                                                     + (f":closed={','.join(map(str, closed)) or '?'}"
                                                        if closed is not None else ""))
                    call.teardown(failed=True)  # peers blocked in this generation's collectives fail now
                else:
                    call.teardown()
                    if not participant.interrupted and participant.finish():
                        logger.info("function_completed", generation=record.generation,
                                    stopped=participant.should_stop)
                        return result
                    cause = GenerationInterrupted(f"generation {record.generation} ended before every member returned")
                finally:
                    call.teardown(failed=True)  # a no-op after the teardowns above; else an exit mid-generation
                    step = call.step
                restarts += 1
                own_failures += not collateral
                # What ended the generation, as every member reads it (the interrupt's reason: `ftcoord status`
                # and the incidents name one cause per change), rather than this rank's view of it (a peer's closed
                # socket, in gloo's words): the monitor may not have read it yet when a collective failed first.
                participant.report.left(participant.monitor.reason or ended_by
                                        or f"{type(cause).__name__}: {cause}"[:200], restarts)
                logger.warning("in_process_restart", generation=record.generation, restarts=restarts,
                               own_failure=not collateral, cause=f"{type(cause).__name__}: {cause}"[:500],
                               mono=time.monotonic(),
                               traceback=None if collateral else "".join(traceback.format_exception(cause))[-4000:])
                if own_failures > self.max_restarts:
                    raise RestartsExhausted(
                        f"slot {participant.slot} failed {own_failures} times in its own code "
                        f"(max_restarts={self.max_restarts}); last error: {type(cause).__name__}: {cause}. "
                        f"Fix the cause or raise max_restarts"
                    ) from cause
                release_frames(cause)
                del cause
        except StoreLost as exc:
            logger.error("store_lost_exit", error=str(exc), exit_code=EXIT_STORE_LOST)
            print(f"ftcoord: slot {participant.slot}: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_STORE_LOST) from exc
        finally:
            restore_signal()
            participant.close(leaving=leaving)
            stack_dump.uninstall()

    def _start(self, participant: Participant) -> None:
        """Connect, saying within a second which store is being waited for and where its address came from:
        a store that is not there must not cost connect_timeout in silence and end in a C++ stack trace."""
        source = "from Wrapper(store=...)" if self.store else env.store_source()
        waiting = log.get_logger(component="wrapper", slot=participant.slot)

        def on_wait(error: BaseException) -> None:
            waiting.warning("store_waiting", store=str(participant.address), source=source,
                            deadline_s=participant.timing.connect_timeout, error=str(error)[:200])

        try:
            participant.start(on_wait)
        except StoreUnavailable as exc:
            waiting.error("store_unavailable", store=str(participant.address), source=source)
            raise SystemExit(f"ftcoord: {exc} (the address is {source})") from exc

    def _install_sigterm(self, participant: Participant) -> Callable[[], None]:
        """SIGTERM asks the whole job to stop at a step boundary (see CallWrapper.should_stop)."""
        if not self.handle_sigterm or threading.current_thread() is not threading.main_thread():
            return lambda: None

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            participant.monitor.request_stop()

        previous = signal.signal(signal.SIGTERM, on_sigterm)
        return lambda: signal.signal(signal.SIGTERM, previous)


def route_events(log_dir: str | Path | None, slot: int) -> None:
    """Where a rank's events go. Under its launcher a rank is ftcoord's own process, with ftcoord's terminal; in a
    process of the user's the terminal stays the application's logging's, and a log directory adds the JSON lines.

    Args:
        log_dir: the directory for `slot<S>-<pid>.jsonl`, or None for no file.
        slot: this rank's slot.
    """
    own_terminal = env.launched() or log.is_configured()
    if log_dir:
        log.configure(Path(log_dir) / f"slot{slot}-{os.getpid()}.jsonl", through_logging=not own_terminal)
    elif own_terminal and not log.is_configured():
        log.configure(None)
