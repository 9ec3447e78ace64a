"""`CallWrapper`: what the wrapped training function sees of its generation.

Its identity (rank, world size, slot), its process group (created over the job's store, under keys of this
generation only), its signals (`interrupted`, `should_stop`, `check()`) and `heal()`. The checks a training loop
makes at every step read local state only; `is_peer_failure` tells a collective that failed because of a peer
from a failure of this rank's own.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ftcoord import pausepoints
from ftcoord.env import LOCAL_RANK_ENV
from ftcoord.errors import ConfigError, FtcoordError
from ftcoord.host import group_sockets
from ftcoord.liveness.group_release import GroupRelease
from ftcoord.log import get_logger
from ftcoord.protocol import evidence, keys, tally
from ftcoord.protocol.record import GenerationRecord
from ftcoord.store.client import wait_for_key
from ftcoord.store.link import LinkedStore
from ftcoord.wrapper.heal import HealReport, heal
from ftcoord.wrapper.participant import Arrival, Participant


def _forget_failed_creation() -> None:
    """After a default process group's creation failed: reset torch's count of groups this process created.

    torch names a group, and its rendezvous keys, by that count, and a failed creation counted one: the next default
    group would wait for keys its peers, counting none, never write, until the members are fenced as hung. torch
    resets the count when the default group is destroyed; after a failed creation there is none to destroy."""
    if not dist.is_initialized():
        dist.distributed_c10d._world.group_count = 0


def _abort_groups() -> None:
    """Abort every process group of this process: the generation's default group and any made from it (heal's
    subgroup has communicators of its own). Thread-safe: the release watch calls it while the training thread may
    be blocked in one of them; the list is copied first, under the GIL."""
    for group in list(dist.distributed_c10d._world.pg_names):
        with contextlib.suppress(Exception):  # one that fails to abort must not keep the others blocked
            group.abort()


class GenerationInterrupted(FtcoordError):
    """Raised by `CallWrapper.check()`: leave this generation; the wrapper rejoins."""


_CUT_POLL_S = 0.05  # how often the watch of a process group's creation looks whether the creation ended

GLOO_RENDEZVOUS_OPTIONS = {"GLOO_ENABLE_RANK_AS_SEQUENCE_NUMBER": "1", "GLOO_ENABLE_STORE_V2_API": "1"}
"""gloo's own options for its full mesh's rendezvous, which each generation's group goes through again.
Without them each member writes its address and a sequence number per peer and reads every peer's key one at a
time: W² reads and O(W³) bytes through the store per generation (W members). With the rank as the sequence number
a key is one host's name and address, whatever W; with the store's extended API the reads are multi_gets of 128
keys: W²/128 of them and O(W²) bytes. Set where the user has not set them, before ftcoord forms a gloo group; every
member sets them alike (gloo reads them at each group's creation)."""

NCCL_OPTIONS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
"""torch's NCCL settings for an in-process restart, set where the user has not set them before an NCCL group forms.
2 (CleanUpOnly): when the watchdog finds a collective failed or past pg_timeout it aborts the communicators and the
next wait raises, where torch's default tears the whole process down; the process restarts in place instead."""

# Messages of collectives that failed because a peer went away (gloo, NCCL).
_PEER_FAILURE_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Socket Timeout",
                         "Timed out waiting", "NCCL communicator was aborted", "Broken pipe")


def is_peer_failure(exc: BaseException) -> bool:
    """Whether an exception is a collective that failed because of a peer, not this rank.

    Such restarts are collateral: they do not count against this rank's max_restarts.
    """
    if isinstance(exc, (GenerationInterrupted, dist.DistNetworkError, dist.DistBackendError)):
        return True
    text = str(exc)
    return any(marker in text for marker in _PEER_FAILURE_MARKERS)


class CallWrapper:
    """One generation of the wrapped function: its identity, its group, its signals.

    The Wrapper makes one per generation and passes it as the function's first argument; user code does
    not construct it. The checks a training loop makes at every step (`interrupted`, `should_stop`,
    `check()`, `ping()`) read or bump local state only: no store operation.

    Args:
        participant: this process's membership in the job (its slot, incarnation and watch threads).
        record: the generation's record, as the leader decided it (members in rank order, world size).
        restarts: how many times this process restarted the function in-process before this generation.
        pg_store: a store client of the job's own for the process group's rendezvous (a LinkedStore from
            `participant.clone_store()`, whose connection can be cut when the generation is interrupted
            during the rendezvous; a plain `dist.Store` cannot be cut).
        pg_timeout: how long a collective of the generation's process group may block before it fails;
            it also bounds the wait for every member at the rendezvous.
    """

    def __init__(
        self,
        participant: Participant,
        record: GenerationRecord,
        restarts: int,
        pg_store: dist.Store,
        pg_timeout: timedelta,
    ) -> None:
        self._participant = participant
        self.record = record
        self.restarts = restarts
        """How many times this process restarted the function in-process so far."""
        self._pg_store = pg_store
        self._pg_timeout = pg_timeout
        self._group: dist.ProcessGroup | None = None
        self._backend: str | None = None
        self._device: torch.device | None = None  # init_process_group's
        self._sockets: dict[int, str] = {}  # what init_process_group opened (see ftcoord.host.group_sockets)
        self._release: GroupRelease | None = None  # shuts them down when a member is declared dead (group_release)
        self._atomic_depth = 0
        self.step: int = -1
        """The last step this process committed; set it so the next join can report it."""
        self.last_heal: HealReport | None = None
        """What the last `heal()` of this generation did (source, receivers, bytes, seconds)."""
        self._log = get_logger(component="call", slot=participant.slot, generation=record.generation)

    # -- identity -------------------------------------------------------------------

    @property
    def iteration(self) -> int:
        """The globally unique generation number (equal on every member)."""
        return self.record.generation

    @property
    def rank(self) -> int:
        """This process's rank in the generation (0 to world_size - 1; slots in rank order: `members`)."""
        rank = self.record.rank_of(self._participant.slot, self._participant.incarnation)
        assert rank is not None
        return rank

    @property
    def world_size(self) -> int:
        """How many members the generation has."""
        return self.record.world_size

    @property
    def slot(self) -> int:
        """This process's slot: stable across its restarts, taken over by its replacement."""
        return self._participant.slot

    @property
    def incarnation(self) -> int:
        """Which process of the slot this is (1 for its first, counted up at each new process)."""
        return self._participant.incarnation

    @property
    def members(self) -> tuple[int, ...]:
        """Slots in rank order."""
        return self.record.members

    @property
    def cause(self) -> str | None:
        """Why the previous generation ended, root cause first, as the leader found it ("slot 1 died (SIGKILL),
        seen by slot 0"); None in a first generation."""
        return self.record.cause

    @property
    def culprits(self) -> tuple[int, ...]:
        """The slots whose own process ended the previous generation (died, hung, raised, was fenced or left)."""
        return self.record.culprits

    @property
    def is_leader(self) -> bool:
        """Whether this process currently leads coordination (it can change at any time)."""
        return self._participant.leader.is_leader

    @property
    def store(self) -> LinkedStore:
        """The job-scoped store (keys under `ftcoord/<job_id>/`): the `dist.Store` operations, riding through a
        store that goes away and comes back (ftcoord.store.link); `.view()` is the current real `dist.Store`."""
        return self._participant.store

    # -- signals ----------------------------------------------------------------------

    @property
    def interrupted(self) -> bool:
        """The generation was interrupted (a peer died, hung or rejoined): leave it soon."""
        return self._participant.interrupted

    @property
    def should_stop(self) -> bool:
        """Preemption was requested: finish the step, checkpoint, return."""
        return self._participant.should_stop

    @property
    def store_lost(self) -> BaseException | None:
        """The store stayed away past store_timeout: `should_stop` is set; write an emergency checkpoint and
        return (the wrapper then exits with code 75)."""
        return self._participant.store_lost

    @property
    def store_away(self) -> bool:
        """The store is away right now (this process is reconnecting; it may come back, or be lost)."""
        return self._participant.store_away

    def check(self) -> None:
        """Raise GenerationInterrupted when interrupted (not inside `atomic()`)."""
        if self._atomic_depth == 0 and self._participant.interrupted:
            raise GenerationInterrupted(
                f"generation {self.iteration} was interrupted ({self._participant.monitor.reason})"
            )

    def wait_for_device(self) -> None:
        """Wait until the work this rank queued on its GPU, its collectives among it, has finished; raise
        GenerationInterrupted if the generation was interrupted meanwhile or its group failed (`group_failed`: an
        aborted collective leaves a void result). Call it after backward, before the optimizer changes anything, so
        that a failed step changes nothing. On the CPU a collective returns when it is done, and this does nothing.
        While it waits the rank counts as waiting on its peers (ftcoord.liveness.still_stack: torch.cuda's frames)."""
        if self._device is None or self._device.type != "cuda":
            return
        torch.cuda.synchronize(self._device)
        if self._participant.interrupted or self.group_failed:
            raise GenerationInterrupted(f"generation {self.iteration}: its collectives failed or were aborted while "
                                        f"this rank waited on its GPU ({self._participant.monitor.reason})")

    @property
    def group_failed(self) -> bool:
        """This generation's group can no longer be trusted: the release watch aborted it, or its NCCL backend
        reports an error (its watchdog aborted it: a collective failed or outlived pg_timeout). An aborted NCCL
        collective ends quietly with whatever its buffers held: a result read since is void, and an error it
        caused (a garbled message, a mismatch) is a peer's failure, not this rank's."""
        if self._release is not None and self._release.aborted:
            return True
        if self._backend != "nccl" or self._group is None:
            return False
        try:
            return self._group._get_backend(self._device).get_error().name != "SUCCESS"
        except Exception:  # a backend without error state, or one torn down meanwhile
            return False

    def ping(self) -> None:
        """Progress heartbeat: a rank that stops pinging for progress_timeout is hung. Call it after each
        committed step, with `step` set: operators see the step and steps/s (`ftcoord status`)."""
        self._participant.heartbeat.ping()
        if self.step >= 0:
            self._participant.report.committed(self.step)

    def checkpoint_stall(self, seconds: float) -> None:
        """Report that training stood still for a checkpoint (the launcher's `ftcoord_checkpoint_stall_seconds`).

        Local only: the heartbeat thread publishes it.

        Args:
            seconds: how long the training thread stood still for the checkpoint.
        """
        self._participant.report.checkpoint_stall(seconds)

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """A section an interrupt must not cut in half (a checkpoint commit, say): `check()` does
        not raise inside it. A process that hangs inside it is still fenced at once: what runs in
        it must be crash-safe (ftcoord's checkpoints are), since a kill can always come."""
        self._atomic_depth += 1
        try:
            yield
        finally:
            self._atomic_depth -= 1

    # -- process group ------------------------------------------------------------------

    def init_process_group(self, backend: str | None = None,
                           device: torch.device | str | None = None) -> dist.ProcessGroup:
        """Create this generation's default process group over the external store (once; later calls return it).

        Its rendezvous keys live under `gen/<g>/pg`, so generations never collide, and no
        second rendezvous server is started. The wait for every member to arrive leaves at once
        when the generation is interrupted (GenerationInterrupted), and so does a creation cut short.
        An NCCL group is bound to its device (a new communicator per generation, created eagerly) and
        aborted when the generation is interrupted under a collective (ftcoord.liveness.group_release).

        Args:
            backend: "nccl" or "gloo"; None: nccl for a cuda device, gloo otherwise.
            device: where this rank's tensors live (ftcoord.wrapper.device.local_device picks one); None: the
                CPU, or cuda:$LOCAL_RANK with backend="nccl". A cuda device becomes the current device and the
                group's device_id.

        Returns:
            The generation's process group, `dist.group.WORLD`.
        """
        if self._group is not None:
            return self._group
        if device is None:  # NCCL asked for by name: this process's GPU, as under torchrun
            device = f"cuda:{os.environ.get(LOCAL_RANK_ENV, '0')}" if backend == "nccl" else "cpu"
        device = self._device = torch.device(device)
        self._backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        device_id = None
        if self._backend == "nccl":
            if device.type != "cuda":
                raise ConfigError(f"init_process_group(backend='nccl', device={str(device)!r}): NCCL moves CUDA "
                                  f"tensors only; pass device=torch.device('cuda', LOCAL_RANK), or use gloo")
            device_id = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(device_id)
            for name, value in NCCL_OPTIONS.items():
                os.environ.setdefault(name, value)
        else:
            for name, value in GLOO_RENDEZVOUS_OPTIONS.items():
                os.environ.setdefault(name, value)
        pausepoints.reached(pausepoints.BEFORE_RENDEZVOUS)
        self._meet_members()
        pausepoints.reached(pausepoints.IN_RENDEZVOUS)
        pg_store = self._pg_store.view() if hasattr(self._pg_store, "view") else self._pg_store  # a real dist.Store
        store = dist.PrefixStore(keys.process_group(self.iteration), pg_store)
        try:
            with group_sockets.opened_by(self._sockets), self._cut_when_interrupted():
                self._log.info("process_group_creating", backend=self._backend, rank=self.rank,
                               world_size=self.world_size)
                dist.init_process_group(self._backend, store=store, rank=self.rank, world_size=self.world_size,
                                        timeout=self._pg_timeout, device_id=device_id)
        except BaseException:
            _forget_failed_creation()
            # No group to tear down later: what the failed creation left connected goes down now, so no peer
            # stays blocked on a half-made group's connection, and no descriptor leaks per failed creation.
            released = group_sockets.shut_down(self._sockets)
            self._log.info("process_group_creation_failed", sockets=released)
            raise
        self._group = dist.group.WORLD
        monitor = self._participant.monitor
        grace_s = self._participant.timing.heartbeat_timeout / 2
        if self._backend == "gloo":  # so a peer can name us if our connection closes (ftcoord.protocol.evidence)
            self._participant.publish_addresses(self.iteration, evidence.local_addresses(self._sockets))
            self._release = GroupRelease(self.slot, self.iteration, self.members, self._sockets, monitor.wait,
                                         lambda: monitor.reason, self._participant.clone_store,
                                         grace_s=grace_s).start()
        else:  # NCCL: its communicators are aborted, from the watch's thread (ProcessGroup.abort is thread-safe)
            self._release = GroupRelease(self.slot, self.iteration, self.members, {}, monitor.wait,
                                         lambda: monitor.reason, grace_s=grace_s, abort=_abort_groups).start()
        self._log.info("process_group_ready", backend=self._backend, rank=self.rank,
                       world_size=self.world_size)
        return self._group

    def _meet_members(self) -> None:
        """Wait until every member reached the rendezvous, leaving at once when the generation is interrupted.

        Arrivals are marks (ftcoord.protocol.tally): exact when a request is retried, and made again by a member
        still waiting when the store restarts (Participant.arrival), so a restart does not leave the others waiting.

        torch's rendezvous blocks in C++ until every rank connected or pg_timeout passed: a member that
        died between the decision and the rendezvous would cost every other member the whole timeout
        (60 s by default), deaf to the interrupt the leader raised for it. Meeting here first, in slices
        that look at the interrupt, makes that an ordinary in-process restart.
        """
        generation = self.iteration
        arrival = self._participant.arrival = Arrival(generation, self.rank, self.world_size)
        tally.arrive(self.store, generation, self.rank, self.world_size)
        deadline = time.monotonic() + self._pg_timeout.total_seconds()
        while not wait_for_key(self.store, keys.all_arrived(generation), 0.05):
            if self._participant.interrupted:
                raise GenerationInterrupted(f"generation {generation} was interrupted before every member reached "
                                            f"its rendezvous ({self._participant.monitor.reason})")
            if time.monotonic() > deadline:
                raise GenerationInterrupted(f"not every member of generation {generation} reached its rendezvous "
                                            f"within pg_timeout={self._pg_timeout.total_seconds():.0f}s")
        arrival.met = True

    @contextlib.contextmanager
    def _cut_when_interrupted(self) -> Iterator[None]:
        """Cut the process group's creation when the generation is interrupted meanwhile.

        Every member reached the rendezvous (_meet_members), but one may still stop or die before it published its
        address or answered the others' connections: torch then blocks in C++, deaf to the interrupt, until the
        store's client gives up on the address (torch's 300 s) or gloo on the connection (pg_timeout), and every
        generation after it waits join_timeout for that live process that never joins. A watch of the interrupt
        (a thread, for as long as the creation lasts) shuts down the rendezvous's store connection and the sockets
        the creation opened, so it fails at once and the member rejoins like any other."""
        if not isinstance(self._pg_store, LinkedStore):
            yield  # a plain client: nothing of ours to cut
            return
        pg_store, monitor, done = self._pg_store, self._participant.monitor, threading.Event()
        before = group_sockets.open_sockets()

        def watch() -> None:
            while not done.is_set():
                if monitor.wait(_CUT_POLL_S) and not done.is_set():
                    cut = pg_store.cut() + group_sockets.shut_down(group_sockets.opened_since(before))
                    self._log.warning("process_group_creation_cut", reason=monitor.reason, sockets=cut)
                    return

        watcher = threading.Thread(target=watch, name=f"ftcoord-rendezvous-watch-{self.slot}", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()

    def process_group(self) -> dist.ProcessGroup:
        """This generation's process group (created on first use, default backend)."""
        return self.init_process_group()

    def heal(self, objects: Mapping[str, Any], step: int) -> int:
        """Make every member hold the most advanced member's state, in place; returns the healed step.

        A collective: every member calls it, with the same names. The member with the highest step (lowest
        rank on ties) is the source; every member behind it or differing from it receives its state over
        this generation's process group (created here if it does not exist yet), tensor by tensor. When
        nobody holds state the given step comes back unchanged: read your checkpoint first, then heal.
        The report is kept in `last_heal`, and `self.step` is set to the healed step. See
        ftcoord.wrapper.heal for the protocol.

        Args:
            objects: names to modules, optimizers, schedulers, tensors or anything with
                `state_dict()`/`load_state_dict()`; the same names on every member.
            step: how far this member's objects are, in committed training steps: 0 for a fresh start,
                the checkpoint's step after loading one, the last committed step for a survivor,
                negative (ftcoord.wrapper.heal.NO_STATE) for "nothing worth sharing".

        Returns:
            The step every member now holds, equal on every member: the source's step, or the given
            step when no member held state (every step negative).

        Raises:
            StateMismatch: the members passed different names, or the source's state cannot travel
                safely (a FatalError: it ends the job).
            TypeError: a value has neither `state_dict()` nor `load_state_dict()`.
        """
        self.process_group()
        try:
            report = heal(objects, step)
        except Exception as exc:
            if self.group_failed:  # what it read after the abort was void: the group's failure, not a mismatch
                raise GenerationInterrupted(f"generation {self.iteration}: its group failed during the heal "
                                            f"({type(exc).__name__}: {exc})") from exc
            raise
        self.last_heal = report
        if report.step >= 0:
            self.step = report.step
        self._log.info("state_healed", step=report.step, source=report.source, receivers=list(report.receivers),
                       bytes=report.bytes, seconds=round(report.seconds, 4))
        return report.step

    def report_closed_peers(self, exc: BaseException) -> list[int] | None:
        """After a failed collective: record a closed connection as evidence (ftcoord.protocol.evidence).

        Only for a gloo group this generation created; a failure to record is logged, not raised (the
        heartbeat timeout still decides).

        Args:
            exc: the exception the collective raised.

        Returns:
            The slots of the members the closed connection leads to (empty when no published address
            matches it), or None when the failure was not a closed connection or nothing could be recorded.
        """
        if self._backend != "gloo" or self._group is None:
            return None
        try:
            return evidence.report_closed(self.store, self.iteration, self.slot, exc)
        except Exception as error:  # evidence is an optimisation: the heartbeat timeout still decides
            self._log.warning("evidence_report_failed", error=str(error))
            return None

    def report_raised(self, exc: BaseException) -> None:
        """Record that this rank's own code raised `exc` and so ended the generation (ftcoord.protocol.evidence):
        the leader names this slot as the cause, whichever member's interrupt came first. A failure to record is
        logged, not raised.

        Args:
            exc: the exception the function raised (not a peer's failure).
        """
        try:
            evidence.report_raised(self.store, self.iteration, self.slot, type(exc).__name__)
        except Exception as error:  # the cause's name is for the operator and the verifier: never a new failure
            self._log.warning("evidence_report_failed", error=str(error))

    def teardown(self, failed: bool = False) -> None:
        """Destroy what this generation created, so the next one starts clean.

        Args:
            failed: the generation ended by a failure (an exception here, a peer's, an interrupt):
                no peer may stay blocked in one of its collectives, whoever still references the
                group (NCCL: the communicator is aborted; gloo: its sockets are shut down).
        """
        if self._release is not None:
            self._release.stop()
            failed = failed or self._release.aborted
            self._release = None
        if self._group is None:
            return
        if self._backend == "nccl" and failed:
            _abort_groups()  # abort before destroy: every communicator ends at once, and destroy waits on no peer
        try:
            dist.destroy_process_group()
        except Exception as exc:  # a broken group is being thrown away anyway
            self._log.warning("process_group_teardown_failed", error=str(exc))
            if dist.is_initialized():  # the next generation's group needs the default one gone
                with contextlib.suppress(Exception):
                    dist.distributed_c10d._abort_process_group()
        if failed:
            with contextlib.suppress(Exception):  # the store may be gone; the sockets go down regardless
                evidence.announce_leaving(self.store, self.iteration, self.slot)
            released = group_sockets.shut_down(self._sockets)
            self._log.info("process_group_released", sockets=released)
        self._sockets.clear()
        self._group = None
