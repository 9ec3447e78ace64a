"""Joining generations: announce, wait for the record, catch up when decided without us.

A process never waits for a generation already decided: a record of g that leaves it out sends it on to g+1 (and
interrupts g when the job is below its target size), so a restart before the leader advanced cannot deadlock; one
that wakes from a pause to find its generation forgotten (keys.FORGOTTEN) catches up with the newest. Only the
newest incarnation of a slot takes part: an older one, or one the newest leader fenced and its launcher will kill,
raises Superseded before it announces itself or interrupts anyone. A joiner that finds a restarted store announces
itself again in the new epoch. The job's end reaches a waiting process where it waits (the record it waits for
becomes keys.ENDED), so a hot spare waits in long slices and still leaves as soon as the job ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch.distributed as dist

from ftcoord import pausepoints
from ftcoord.config import Timing
from ftcoord.errors import JobFailed, JobFinished, QuorumTimeout, Superseded
from ftcoord.log import get_logger
from ftcoord.protocol import keys, restore, tally
from ftcoord.protocol.generations import (
    current_generation,
    is_end,
    is_forgotten,
    mark_ended,
    next_generation,
    parse_record,
    read_record,
)
from ftcoord.protocol.record import GenerationRecord, JoinRequest
from ftcoord.protocol.slots import fenced, superseded
from ftcoord.store.client import get_or_none, wait_for_key, wait_get
from ftcoord.store.link import StoreRestarted, instance_number

_NEW_INSTANCE = object()  # _wait_record's answer when the store restarted meanwhile


class GenerationClient:
    """The main thread's side of the protocol (on the main thread's own store client)."""

    def __init__(self, store: dist.Store, slot: int, incarnation: int, timing: Timing,
                 on_waiting_after: Callable[[GenerationRecord], None] = lambda record: None,
                 on_announced: Callable[[int], None] = lambda generation: None, fence_ends_it: bool = False) -> None:
        """The protocol for one incarnation of a slot.

        Args:
            store: the main thread's own client of the job's keys.
            slot: this process's slot.
            incarnation: this process's incarnation of the slot.
            timing: the job's timing (heartbeat, join and barrier timeouts).
            on_waiting_after: called with `record` when this process waits for the generation after it (when
                it is not a member of that one, it is a hot spare or a replacement: ftcoord.leader.cadence).
            on_announced: called with `generation` when this process announced itself for it (its interrupt
                monitor reads no probe after that: ftcoord.liveness.interrupt_watch).
            fence_ends_it: a launcher kills this process when the leader fences it (raise_if_superseded).
        """
        self._store = store
        self._fence_ends_it = fence_ends_it
        self._on_waiting_after = on_waiting_after
        self._on_announced = on_announced
        self.slot = slot
        self.incarnation = incarnation
        self._timing = timing
        # A stop that ended an earlier run of this job must not end this one.
        self.stale_stopped = get_or_none(store, keys.STOPPED)
        self._finished_in: tuple[GenerationRecord, bool] | None = None  # (record, stopping) once finish() counted us
        self._seen: dict[str, bytes] = {}  # done / stopped / fatal, as seen: a restarted store is told again
        self._log = get_logger(component="generation", slot=slot, incarnation=incarnation)

    def current(self) -> int:
        return current_generation(self._store)

    def join(self, step: int = -1, after: GenerationRecord | None = None) -> GenerationRecord:
        """Block until a generation that includes this process is decided.

        The generation announced for may be stale (decided without us meanwhile): its record says so and the
        loop moves on. After a store restart the announcement is lost and its number is never decided there: the
        process announces itself again, for the next number of the new epoch.

        Args:
            step: the last step this process committed (-1: none).
            after: the generation this process was a member of and saw interrupted: the next one is announced
                for at once, with no read before (one request, the announcement; then the wait).

        Raises:
            JobFinished: the job completed while we waited (a spare's normal end).
            QuorumTimeout: too few processes joined within barrier_timeout.
            Superseded: a newer incarnation of this slot registered, or the newest leader fenced this one and its
                launcher will kill it; this process must exit.
        """
        if after is not None:
            generation, previous = next_generation(self._store, after.generation), after
        else:
            current = self.current()
            generation, previous = next_generation(self._store, current), self.record(current)
        fast = after is not None
        while True:
            if not fast:  # a member rejoining interrupts nobody (ftcoord.leader.duty filters a ghost's announcement)
                self._raise_if_failed()
                self.raise_if_superseded()  # a ghost neither interrupts nor announces, however long it waited
            fast = False
            self._interrupt_if_needed(previous)
            if previous is not None:
                self._on_waiting_after(previous)
            announced_in = instance_number(self._store)
            self._announce(generation, step)
            self._on_announced(generation)
            pausepoints.reached(pausepoints.JOIN_ANNOUNCED)
            record = self._wait_record(generation, announced_in)
            if record is _NEW_INSTANCE:
                # Decided before the restart and written back by a member that read it: this process is one of the
                # members waiting for it at its rendezvous, not a joiner of a later number.
                rebuilt = self.record(generation)
                if rebuilt is None or rebuilt.rank_of(self.slot, self.incarnation) is None:
                    current = self.current()
                    self._log.info("join_again_after_store_restart", generation=generation, current=current)
                    generation, previous = next_generation(self._store, current), self.record(current)
                    continue
                record = rebuilt
            if record is None:  # decided and forgotten while we were paused: catch up with the newest
                self._log.info("generation_forgotten", generation=generation)
                generation, previous = next_generation(self._store, max(generation, self.current())), None
                continue
            # The fatal key is not read again here: a fatal error ends the running generation (the leader interrupts
            # it), and the rejoin that follows finds the job's end where it waits (keys.ENDED, written by the leader
            # that finds the job failed), or, with no leader to write it, after its first slice.
            if record.failed is not None:
                raise QuorumTimeout(record.failed)
            rank = record.rank_of(self.slot, self.incarnation)
            if rank is not None:
                self._log.info("generation_joined", generation=generation, rank=rank,
                               world_size=record.world_size, members=record.members)  # no copy for a log filtered out
                return record
            self._log.info("generation_left_out", generation=generation,
                           spare=record.was_considered(self.slot, self.incarnation))
            # `previous` is interrupted, if it must be, before the next announcement
            generation, previous = next_generation(self._store, generation), record

    def raise_if_superseded(self) -> None:
        """A ghost ends before it interrupts or announces anything, so it cannot interrupt every generation that
        lists its slot, nor ask the members to grow for it.

        A launcher kills a fenced process once it reads the fence, but a node paused or cut off as a whole wakes
        with its launcher, and the ghost may wake first: left out of the generation decided without it, it would
        ask the members to grow for it, and they would change generation for nothing. With no launcher to carry
        out its fence (started by hand, by SLURM), a fenced process that wakes takes part again: the job grows back.

        Raises:
            Superseded: a newer incarnation of this slot registered, or the newest leader fenced this one and a
                launcher will kill it.
        """
        store, slot, incarnation = self._store, self.slot, self.incarnation
        reason = superseded(store, slot, incarnation)
        if reason is None and self._fence_ends_it:
            reason = fenced(store, slot, incarnation)
        if reason is not None:
            raise Superseded(f"{reason}; it exits without taking part again")

    def record(self, generation: int) -> GenerationRecord | None:
        return read_record(self._store, generation) if generation > 0 else None

    def interrupt(self, generation: int, reason: str) -> str:
        """End a generation for every member (first reason wins); the reason that won, ours or an earlier one.

        Never with an empty reason (ValueError): a member's watch reads an empty interrupt key as one not set
        (ftcoord.store.client.wait_get)."""
        if not reason:
            raise ValueError("a generation is interrupted with a reason (got an empty one)")
        won = self._store.compare_set(keys.interrupt(generation), "", reason).decode()
        self._log.info("generation_interrupt_requested", generation=generation, reason=reason,
                       **({"ended_by": won} if won != reason else {}))
        return won

    def is_interrupted(self, generation: int) -> bool:
        return bool(self._store.check([keys.interrupt(generation)]))

    def finish(self, record: GenerationRecord, stopping: bool = False) -> bool:
        """Report that the function returned here; wait until every member did.

        Args:
            stopping: the function returned because a stop (preemption) was requested:
                the job ends as *stopped* (a relaunch resumes it), not as done.

        Returns:
            True when every member finished; False when the generation was interrupted
            first, so this process must join the next one.
        """
        self._count_finished(self._store, record, stopping)
        while True:
            if wait_for_key(self._store, keys.DONE, self._timing.heartbeat_interval):
                self.is_done()
                return True
            if self.is_stopped():
                return True
            if self.is_interrupted(record.generation):
                self._finished_in = None  # not finished after all: a rebuilt store must not count it
                return False

    def _count_finished(self, store: dist.Store, record: GenerationRecord, stopping: bool) -> None:
        self._finished_in = (record, stopping)
        ended = tally.finish(store, record.generation, self.slot, record.members, stopping)
        if ended is not None:
            if ended == "stop":
                store.set(keys.STOPPED, str(record.generation))
                self._log.info("job_stopped", generation=record.generation)
            else:
                store.set(keys.DONE, str(record.generation))
                self._log.info("job_done", generation=record.generation)
            mark_ended(store, next_generation(store, record.generation))  # a hot spare waits for that record

    def rebuild(self, store: dist.Store) -> None:
        """Tell a restarted store what this process knows of the job's end (ftcoord.protocol.restore)."""
        restore.ended(store, self._seen.get(keys.DONE), self._seen.get(keys.STOPPED), self._seen.get(keys.FATAL))
        if self._finished_in is not None:
            self._count_finished(store, *self._finished_in)

    def _raise_if_failed(self) -> None:
        fatal = get_or_none(self._store, keys.FATAL)
        if fatal is not None:
            self._seen[keys.FATAL] = fatal
            raise JobFailed(fatal.decode())

    def fail(self, message: str) -> None:
        """End the whole job with a fatal error (first message wins)."""
        self._store.compare_set(keys.FATAL, "", message)

    def is_done(self) -> bool:
        done = get_or_none(self._store, keys.DONE)
        if done is not None:
            self._seen[keys.DONE] = done
        return done is not None

    def is_stopped(self) -> bool:
        """Every member of some generation of this run returned through should_stop."""
        stopped = get_or_none(self._store, keys.STOPPED)
        if stopped is not None and stopped != self.stale_stopped:
            self._seen[keys.STOPPED] = stopped
            return True
        return False

    def _announce(self, generation: int, step: int) -> None:
        join = JoinRequest(generation, self.slot, self.incarnation, step)
        self._store.append(keys.joiners(generation), join.to_json() + "\n")  # its lines are the count the leader polls

    def _interrupt_if_needed(self, record: GenerationRecord | None) -> None:
        """Catch-up rule: bring the members back together when our arrival changes things.

        A record that lists an older incarnation of our slot has a dead member; one that
        is below its target size and never saw us could grow. A record that considered us
        and left us out (a hot spare) is not interrupted: that would loop forever.
        """
        if record is None or record.failed is not None:
            return
        if record.was_considered(self.slot, self.incarnation):
            return
        if self.slot in record.members:
            self.interrupt(record.generation, f"rejoin:slot={self.slot}")
        elif record.world_size < record.target_world_size:
            self.interrupt(record.generation, f"grow:slot={self.slot}")

    def _wait_record(self, generation: int, announced_in: int) -> GenerationRecord | None | object:
        """Wait for the record of `generation`; None when it was decided and forgotten already (this process was
        paused meanwhile), or its number was ended by an earlier run of this job; _NEW_INSTANCE when the store
        restarted meanwhile.

        What ends the wait is written where it waits: the record; keys.ENDED when the job ended (done, stopped or
        failed: then this raises; the last member to finish writes it, and so does a leader that finds the job done
        or failed); a restarted store ends it too (the wait is pinned to the store instance it was announced in).
        The rest is looked at between slices of the wait, which grow from one heartbeat timeout to two: the job's
        end written by a process that died before it marked it, a generation forgotten while this process was
        paused, no leader deciding. Each is a fallback that a few seconds do not change (the deadline below is
        barrier_timeout long), so a hot spare waits for hours at about one request a second. The first slice is a
        whole heartbeat timeout: members whose record takes longer (a decision that waits for a silent member,
        thousands of members announcing) must not load the store with these looks while the leader decides.

        No deadline while the previous generation still runs (a hot spare may wait for
        hours); once it ended, a leader must decide within barrier_timeout plus the time
        to notice a dead leader, or this raises.
        """
        key = keys.record(generation)
        deadline: float | None = None
        slice_s = self._timing.heartbeat_timeout
        longest = 2 * slice_s
        while True:
            try:  # a record is never empty: b"" is a wake that found none
                raw = wait_get(self._store, key, slice_s, pinned=announced_in)
            except StoreRestarted:
                return _NEW_INSTANCE
            if is_end(raw):
                self._raise_if_ended(generation)
                return None  # ended by an earlier run of this job (a stop, and this is its relaunch): catch up
            if raw:
                return parse_record(raw)  # None: a tombstone (decided and forgotten)
            if (raw is not None or slice_s >= longest) and is_forgotten(self._store, generation):
                return None  # paused through more than TOMBSTONE_SPAN generations (or deleted as we woke): catch up
            slice_s = min(2 * slice_s, longest)
            if instance_number(self._store) != announced_in:
                return _NEW_INSTANCE
            self._raise_if_ended(generation)
            if deadline is None and self._previous_ended(generation):
                t = self._timing
                deadline = time.monotonic() + t.barrier_timeout + 2 * t.heartbeat_timeout + t.join_timeout
            if deadline is not None and time.monotonic() > deadline:
                raise QuorumTimeout(
                    f"no leader decided generation {generation} within barrier_timeout="
                    f"{self._timing.barrier_timeout}s (+ heartbeat and join timeouts); is the "
                    f"store server healthy and are other processes of this job running?"
                )

    def _raise_if_ended(self, generation: int) -> None:
        """JobFailed or JobFinished when the job ended (failed; done or stopped) while this process waited."""
        self._raise_if_failed()
        if self.is_done() or self.is_stopped():
            raise JobFinished(f"job finished while slot {self.slot} waited for generation {generation}")

    def _previous_ended(self, generation: int) -> bool:
        previous = generation - 1
        if previous == 0 or self.is_interrupted(previous):  # a check, before a read of a record of every member
            return True
        record = self.record(previous)
        return record is None or record.failed is not None
