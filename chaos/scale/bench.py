"""`chaos bench --scale`: the coordination protocol among thousands of participants, by simulation.

Real: the store server (`ftcoord-store`, its own process), every participant (an ftcoord Participant with its own
store clients and threads) and SIGKILL. Simulated: the training (a trainer thread per participant pings progress;
no model, no collectives) and the hosts: participants share a few processes of the host the bench runs on, over
loopback. Per size N it measures `advance`, `reform_marked`, `detect_silent`, `false_positives`, the steady state's
store requests, the leader's CPU per advance, what an advance costs in requests and cores, the store's memory and
keys, stragglers and unasked changes, and `floor_s` (bare clients, chaos.scale.floor). `--participants events` runs
the bulk on an event loop (chaos.scale.worker_events). The workers: chaos.scale.swarm; how a size is laid out and
whether it fits: chaos.scale.layout; scale.md, scale.png and the missed targets: chaos.scale.report.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from chaos.bench.recovery import summary
from chaos.scale import floor
from chaos.scale.layout import PARTICIPANT_CORES, DoesNotFit, Machine, WorkerMemory, layout, per_process, status_mb
from chaos.scale.report import markdown, plot, targets_missed
from chaos.scale.swarm import Swarm, process_cpu_s
from ftcoord.config import Timing
from ftcoord.errors import ConfigError
from ftcoord.leader.forgetter import KEEP_GENERATIONS
from ftcoord.liveness.heartbeat import mark_dead
from ftcoord.protocol import keys
from ftcoord.protocol.generations import count_announcements, read_announcements
from ftcoord.store.client import get_if_present
from ftcoord.store.link import StoreLink
from ftcoord.store.server import StoreProcess

HOST = "127.0.0.1"
DEFAULT_SIZES = (64, 256, 1024, 4096)
def between_advances(rng: random.Random, timing: Timing) -> float:
    """The pause before the next advance: half a second, and a random part of two of the leader's ticks, so that an
    advance begins at any moment of the leader's round, as a fault does. A fixed pause would start every advance at
    the same moment of the round; every phase of it (its read of every slot, say, which the leader finishes before
    it hears the interrupt) is a moment a fault can come, so every phase belongs in the figures."""
    return 0.5 + rng.uniform(0.0, 2 * timing.tick)


def run_size(n: int, *, repetitions: int, generations: int, window_s: float, step_s: float, per_process: int,
             log: TextIO, say: Any, participants: str = "threads", timing: Timing | None = None) -> dict[str, Any]:
    """Every measure for one size (see the module docstring), every participant on `timing` (default: the library's)."""
    timing = timing or Timing()
    server = StoreProcess.start(HOST, 0, own_session=True)
    pid = server.process.pid
    job = f"scale-{n}"
    link = StoreLink(server.address, job, connect_timeout=30)
    store = link.connect()
    result: dict[str, Any] = {"participants": n, "run_as": participants,
                              "timing": {"heartbeat_interval": timing.heartbeat_interval,
                                         "heartbeat_timeout": timing.heartbeat_timeout}}
    swarm = Swarm(server.address, job, n, log, step_s, per_process, participants, timing)
    try:
        everyone = set(range(n))
        started = time.monotonic()
        swarm.wait_for(lambda: swarm.everyone_in(0, everyone) is not None, 120 + n / 8, f"{n} participants formed")
        result["form_s"] = round(time.monotonic() - started, 3)
        generation = formed = swarm.everyone_in(0, everyone)
        assert generation is not None
        say(f"  N={n}: formed generation {generation} in {result['form_s']} s")
        result["formation_interrupts"] = _reasons(store, 1, generation)
        result["record_bytes"] = len(store.get(keys.record(generation)))  # what every member reads per change
        result["bulk_clients"] = sorted({w.client for w in swarm.workers if w.count > 1})  # threads' or events'
        memory = swarm.memory()
        result["worker_memory_mb"] = {"per_process": per_process, "process": memory.process_mb,
                                      "participant": memory.participant_mb, "shared": memory.shared_mb}
        time.sleep(2.0)  # settle: every thread in its steady state

        before, _ = swarm.counts()
        t0 = time.monotonic()
        cpu0, workers0 = process_cpu_s(pid), swarm.cpu_s()
        time.sleep(window_s)
        after, _ = swarm.counts()
        elapsed = time.monotonic() - t0
        result["participants_cpu_share"] = round((swarm.cpu_s() - workers0) / elapsed, 3)
        by_role: Counter[str] = Counter()
        for name, count in (after - before).items():
            by_role[name.split("/")[0]] += count
        per = {role: round(count / n / elapsed, 3) for role, count in sorted(by_role.items())}
        result["ops_per_participant_s"] = {"total": round(sum(by_role.values()) / n / elapsed, 3), **per}
        result["ops_by_request"] = {k: round(v / n / elapsed, 3) for k, v in sorted((after - before).items())}
        result["ops_budget"] = round(2 / timing.heartbeat_interval, 3)
        result["store_cpu_share"] = round((process_cpu_s(pid) - cpu0) / elapsed, 3)
        say(f"  N={n}: {result['ops_per_participant_s']['total']} store requests per participant per s "
            f"(budget {result['ops_budget']})")

        steady = after - before  # requests over the steady-state window (elapsed)
        counts_before, cpu_before = swarm.counts()
        loop_t0 = time.monotonic()
        advances, medians, phases, busy = [], [], [], []
        phases_rng = random.Random(n)  # the same gaps in every run of a size
        stragglers: list[dict[str, Any]] = []
        unasked: list[dict[str, Any]] = []  # generation changes nobody asked for (no fault: each a false positive)
        for _ in range(repetitions):
            store_cpu0, workers_cpu0 = process_cpu_s(pid), swarm.cpu_s()
            step = advance(swarm, store, generation, everyone, stragglers, unasked)
            generation, t0 = step.generation, step.started
            times = step.times
            advances.append(max(times))
            medians.append(statistics.median(times))
            phases.append((step.announced - t0, step.decided - step.announced, max(times) - (step.decided - t0)))
            # How busy the machine was meanwhile (the CPU read after the last participant held the record).
            took = time.monotonic() - t0
            busy.append((process_cpu_s(pid) - store_cpu0, swarm.cpu_s() - workers_cpu0, took))
            time.sleep(between_advances(phases_rng, timing))
        counts_after, cpu_after = swarm.counts()
        # What an advance costs beyond the steady state: requests per participant by thread/op, and CPU.
        loop_s = time.monotonic() - loop_t0
        extra = {name: (counts_after[name] - counts_before[name] - steady[name] * loop_s / elapsed) / repetitions / n
                 for name in counts_after}
        result["requests_per_advance"] = {k: round(v, 2) for k, v in sorted(extra.items()) if round(v, 2) > 0}
        # The store is one thread: a share near 1 means it, not the participants, set the pace. The participants'
        # share is out of the host's cores (on a real job each rank has a host's). Over all the advances
        # together: CPU time is counted in clock ticks (10 ms), longer than a small size's whole advance.
        took = sum(b[2] for b in busy)
        result["cores_busy_during_advance"] = {"store": round(sum(b[0] for b in busy) / took, 3),
                                               "participants": round(sum(b[1] for b in busy) / took, 3),
                                               "of": os.cpu_count(), "clock_tick_s": 1 / os.sysconf("SC_CLK_TCK")}
        result["advance_s"] = summary(advances)
        result["stragglers"] = stragglers
        result["unasked_changes"] = unasked
        result["advance_median_participant_s"] = summary(medians)
        # Where an advance's time goes: every participant announced itself (their rejoin: in this simulation,
        # thousands of them share the host's cores), the leader decided (the protocol's own critical path), every
        # participant holds the record (delivery).
        result["advance_phases_s"] = {name: summary([p[i] for p in phases])
                                      for i, name in enumerate(("all_announced", "decided_after", "delivered_after"))}
        if cpu_before is not None and cpu_after is not None:
            result["leader_cpu_per_advance_s"] = round((cpu_after - cpu_before) / repetitions, 4)
        say(f"  N={n}: advance {result['advance_s']}")

        # One participant SIGKILLed and marked dead by "its launcher" (this driver).
        victim = n - 2
        t0 = time.monotonic()
        swarm.kill(victim)
        mark_dead(store, victim, swarm.incarnations[victim])
        everyone -= {victim}
        _await_advance(swarm, store, generation, everyone, t0, 60 + n / 16, stragglers)
        generation = swarm.everyone_in(generation, everyone)
        assert generation is not None
        result["reform_marked_s"] = round(max(swarm.joined[generation].values()) - t0, 4)

        # One SIGKILLed with nobody to mark it: the leader must notice its silence.
        time.sleep(1.0)
        victim = n - 1
        t0 = time.monotonic()
        swarm.kill(victim)
        detected = None
        while time.monotonic() - t0 < 3 * timing.heartbeat_timeout:
            if store.check([keys.interrupt(generation)]):
                detected = time.monotonic() - t0
                break
            time.sleep(0.005)
        everyone -= {victim}
        _await_advance(swarm, store, generation, everyone, t0 + timing.heartbeat_timeout, 60 + n / 16, stragglers)
        generation = swarm.everyone_in(generation, everyone)
        assert generation is not None
        result["detect_silent_s"] = None if detected is None else round(detected, 4)
        result["detect_target_s"] = timing.heartbeat_timeout + timing.heartbeat_interval
        result["reform_silent_s"] = round(max(swarm.joined[generation].values()) - t0, 4)
        # Exactly one generation per change: formation, the advances, the two kills. A live participant
        # wrongly declared dead costs extra generations (it is left out, then rejoins).
        changes = len([g for g in swarm.joined if g > formed])
        result["generation_changes"] = changes
        result["false_positives"] = changes - (repetitions + 2) + len(swarm.problems)
        result["problems"] = swarm.problems[:10]
        result["store_rss_mb"] = status_mb(pid, "VmRSS")
        result["store_keys"] = store.num_keys()

        if generations:
            result["memory"] = _many_generations(swarm, store, generation, everyone, generations, pid, say)
        return result
    finally:
        swarm.close()
        link.close()
        server.stop()


@dataclass(frozen=True)
class Advanced:
    """One advance (`advance`): the generation every participant holds after it, when it was asked (monotonic), when
    every participant had announced itself and when the record was written, and each participant's time to hold it."""

    generation: int
    started: float
    announced: float
    decided: float
    times: list[float]


def advance(swarm: Swarm, store: Any, generation: int, everyone: set[int], stragglers: list[dict[str, Any]],
            unasked: list[dict[str, Any]]) -> Advanced:
    """Interrupt `generation`, with everyone present, and wait until every participant holds a later record. What was
    not this advance's own is said in `unasked`, with the interrupts' reasons (each a false positive): a change
    since the last look (the previous advance's decision was interrupted), an interrupt someone else won, more than
    one change; a change still incomplete STRAGGLING_S after it began, or over 1 s, in `stragglers`."""
    n = len(everyone)
    newest = swarm.everyone_in(generation, everyone)
    if newest is not None:  # advanced since, unasked
        unasked.append({"generation": generation, "to": newest, "reasons": _reasons(store, generation, newest)})
        generation = newest
    t0 = time.monotonic()
    won = store.compare_set(keys.interrupt(generation), "", "bench:advance").decode()
    if won != "bench:advance":
        unasked.append({"generation": generation, "reasons": {generation: won}})
    unannounced = lambda: _note_unannounced(swarm, store, generation, everyone, t0, stragglers)  # noqa: E731
    announced, decided = _watch_decision(store, generation + 1, n, 60 + n / 16, unannounced)
    _await_advance(swarm, store, generation, everyone, t0, 60 + n / 16, stragglers)
    newest = swarm.everyone_in(generation, everyone)
    assert newest is not None
    if newest > generation + 1:  # more than one change: what interrupted the ones between
        unasked.append({"generation": generation, "to": newest, "reasons": _reasons(store, generation, newest)})
    times = [t - t0 for t in swarm.joined[newest].values()]
    if max(times) > 1.0:  # slow: which workers' participants were late, and what the collector did
        by_worker: dict[int, float] = defaultdict(float)
        for slot, t in swarm.joined[newest].items():
            worker = swarm.worker_of(slot)
            by_worker[worker] = max(by_worker[worker], round(t - t0, 3))
        stragglers.append({"generation": newest, "phase": "slow", "took_s": round(max(times), 3),
                           "latest_by_worker": dict(sorted(by_worker.items())),
                           "collections": swarm.collections_since(t0)})
    return Advanced(newest, t0, announced, decided, times)


STRAGGLING_S = 3.0
"""An advance still incomplete this long after its interrupt has stragglers: where their threads are is recorded."""


def _reasons(store: Any, first: int, last: int) -> dict[int, str | None]:
    """Why each generation from `first` up to `last` (excluded) was interrupted (None: its key is gone)."""
    found = {}
    for generation in range(first, last):
        value = get_if_present(store, keys.interrupt(generation))
        found[generation] = None if value is None else value.decode(errors="replace")
    return found


def _await_advance(swarm: Swarm, store: Any, generation: int, everyone: set[int], t0: float, timeout: float,
                   stragglers: list[dict[str, Any]]) -> None:
    """Wait until every participant holds a record after `generation`; past STRAGGLING_S, note which ones do not yet
    and where their threads are (a few of them), in `stragglers`."""
    done = lambda: swarm.everyone_in(generation, everyone) is not None  # noqa: E731
    try:
        swarm.wait_for(done, max(STRAGGLING_S - (time.monotonic() - t0), 0.0), "")
        return
    except TimeoutError:
        pass
    _note(swarm, store, "record", generation, swarm.stragglers(generation, everyone), t0, stragglers)
    swarm.wait_for(done, timeout, f"advance past generation {generation}")


def _note_unannounced(swarm: Swarm, store: Any, generation: int, everyone: set[int], t0: float,
                      stragglers: list[dict[str, Any]]) -> None:
    """The participants not announced for the generation after `generation` yet, and where their threads are."""
    joins, _ = read_announcements(store, generation + 1)
    _note(swarm, store, "announce", generation, sorted(everyone - {j.slot for j in joins}), t0, stragglers)


def _note(swarm: Swarm, store: Any, phase: str, generation: int, late: list[int], t0: float,
          stragglers: list[dict[str, Any]]) -> None:
    """Record a straggling change: who is late (`late`), their workers, the keys of the generations around it, the
    workers' full collections since it began, and where a few of the late ones' threads are."""
    keys_now = {}
    for g in (generation - 1, generation, generation + 1):
        for key in (keys.interrupt(g), keys.probe(g), keys.record(g)):
            value = get_if_present(store, key)
            keys_now[key] = None if value is None else value[:40].decode(errors="replace")
    stragglers.append({"generation": generation, "phase": phase, "after_s": round(time.monotonic() - t0, 3),
                       "slots": late[:20], "count": len(late), "workers": sorted({swarm.worker_of(s) for s in late}),
                       "collections": swarm.collections_since(t0), "keys": keys_now,
                       "threads": swarm.stacks(late[:3])})


def _watch_decision(store: Any, generation: int, n: int, timeout: float,
                    straggling: Callable[[], None] = lambda: None) -> tuple[float, float]:
    """When every participant had announced itself for `generation`, and when its record was written (polled).
    `straggling()`: called once when not everyone announced within STRAGGLING_S."""
    announced = None
    started = time.monotonic()
    deadline, late = started + timeout, started + STRAGGLING_S
    while time.monotonic() < deadline:
        now = time.monotonic()
        if announced is None and count_announcements(store, generation) >= n:
            announced = now
        if announced is None and now > late:
            straggling()
            late = deadline
        if store.check([keys.record(generation)]):
            return (announced or now), now
        time.sleep(0.002)
    raise TimeoutError(f"generation {generation} was not decided within {timeout:.0f}s")


def _many_generations(swarm: Swarm, store: Any, generation: int, everyone: set[int], count: int, pid: int,
                      say: Any) -> dict[str, Any]:
    """Advance `count` times back to back; the store's memory and key count along the way."""
    samples = []
    marks = {10, 100, count // 2, count}  # from 100 on: past the tombstones' span (decisions.TOMBSTONE_SPAN)
    for i in range(1, count + 1):
        store.compare_set(keys.interrupt(generation), "", "bench:advance")
        swarm.wait_for(lambda g=generation: swarm.everyone_in(g, everyone) is not None, 60,
                       f"advance {i} of {count}")
        generation = swarm.everyone_in(generation, everyone) or generation
        with swarm._lock:  # keep the driver's own memory flat too
            for old in [g for g in swarm.joined if g < generation - 2]:
                del swarm.joined[old]
        if i in marks:
            keys_now = _settled_key_count(store, generation, len(everyone))
            samples.append({"advances": i, "store_rss_mb": status_mb(pid, "VmRSS"), "store_keys": keys_now})
            say(f"    after {i} advances: {samples[-1]}")
    settled = next((x for x in samples if x["advances"] >= 100), samples[0])
    return {"samples": samples, "from_advances": settled["advances"],
            "rss_growth_mb": round(samples[-1]["store_rss_mb"] - settled["store_rss_mb"], 1),
            "keys_growth": samples[-1]["store_keys"] - settled["store_keys"]}


def _settled_key_count(store: Any, generation: int, n: int, within_s: float = 15.0) -> int:
    """The store's key count once `generation` (just decided, n members) is settled: the generation KEEP_GENERATIONS
    before it forgotten (its last keys deleted, ftcoord.protocol.generations.forget), and the count unchanged since.
    The leader forgets it only once the new generation's members all arrived (or a heartbeat timeout later:
    ftcoord.leader.forgetter), a round or more after they joined; a count that merely stands still for a moment can
    be read before that, and a store holding one generation's keys more would look like growth."""
    deadline = time.monotonic() + within_s
    old = generation - KEEP_GENERATIONS
    last_keys = [keys.all_arrived(old), keys.gloo_rendezvous(old, n - 1)] if old >= 1 else []
    while time.monotonic() < deadline and any(store.check([key]) for key in last_keys):
        time.sleep(0.05)
    seen = [store.num_keys()]
    while time.monotonic() < deadline and not (len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3]):
        time.sleep(0.1)
        seen.append(store.num_keys())
    return seen[-1]


def parse_sizes(text: str) -> list[int]:
    """`--sizes 64,256`: participant counts of at least 8 (two are the kills' victims), at most 16384."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--sizes {text!r}: give participant counts separated by commas, e.g. 64,256,1024") from None
    bad = [n for n in sizes if not 8 <= n <= 16384]
    if not sizes or bad:
        raise ValueError(f"--sizes {text!r}: each count must be between 8 and 16384 (got {bad or 'none'})")
    return sizes


def run_scale_bench(out: Path, sizes: list[int], quick: bool = False, generations: int | None = None,
                    participants: str = "threads", timing: Timing | None = None) -> int:
    """Every size in `sizes`, then scale.json, scale.md and scale.png in `out`; exit 1 when a target is missed.
    `timing`: every participant's (scale_timing)."""
    out.mkdir(parents=True, exist_ok=True)
    repetitions = 3 if quick else 10
    if generations is None:
        generations = 100 if quick else 1000
    results: list[dict[str, Any]] = []
    with (out / "workers.log").open("w") as log:
        memory, cores, measured_at = WorkerMemory(), PARTICIPANT_CORES, None
        for n in sizes:
            # A measure that could not be made (the size does not fit; its run failed) is said, and is a miss.
            try:
                count = per_process(n, memory, Machine.now(), cores, measured_at, participants)
                print(f"N={n}: starting {n} simulated participants, {count} per worker process", flush=True)
                # The store's memory over many generations is measured at the smallest size (fast advances).
                results.append(run_size(n, repetitions=repetitions, generations=generations if n == min(sizes) else 0,
                                        window_s=12.0, step_s=2.0, per_process=count, log=log,
                                        participants=participants, timing=timing,
                                        say=lambda text: print(text, flush=True)))
            except DoesNotFit as exc:
                print(f"N={n}: not measured: {exc}", flush=True)
                results.append({"participants": n, "not_measured": str(exc),
                                **_floor_beyond(n, memory, repetitions, results, participants)})
            except (RuntimeError, TimeoutError) as exc:
                print(f"N={n}: not measured: the run failed: {exc}", flush=True)
                results.append({"participants": n, "not_measured": f"the run failed: {exc}"})
            if "advance_s" in results[-1]:  # what the host allows any protocol at this size (chaos.scale.floor)
                results[-1]["floor_s"] = _floor(n, count, repetitions, results[-1]["record_bytes"], participants)
            if "worker_memory_mb" in results[-1]:  # the next size is planned on what this one measured
                m = results[-1]["worker_memory_mb"]
                memory = WorkerMemory(m["process"], m["participant"], m["shared"])
                cores, measured_at = results[-1]["participants_cpu_share"] / n, n
            (out / "scale.json").write_text(json.dumps({"machine": _machine(), "sizes": results}, indent=1))
    misses = targets_missed(results)
    (out / "scale.md").write_text(markdown(results, misses))
    plot(results, out / "scale.png")
    print((out / "scale.md").read_text())
    return 1 if misses else 0


def scale_timing(heartbeat_interval: float | None) -> Timing:
    """The simulated participants' timing: the default a user gets, or a heartbeat every `heartbeat_interval` seconds
    with the default's timeout of ten intervals (a job of thousands of ranks may beat less often: its store serves
    2 / heartbeat_interval requests a second per rank for heartbeats alone, and on one host its simulated
    participants' share of the cores is that much more). ConfigError for an interval Timing refuses."""
    if heartbeat_interval is None:
        return Timing()
    most = Timing.barrier_timeout / 10
    if heartbeat_interval >= most:
        raise ConfigError(f"heartbeat_interval={heartbeat_interval}s must be below {most}s: its timeout, ten "
                          f"intervals, must stay below barrier_timeout={Timing.barrier_timeout}s")
    return Timing(heartbeat_interval=heartbeat_interval, heartbeat_timeout=10 * heartbeat_interval)


def _floor(n: int, per_process: int, repetitions: int, record_bytes: int, participants: str) -> dict[str, Any]:
    """Every floor of an advance among n bare clients (chaos.scale.floor.VARIANTS), run as the participants were
    (threads or events); one not measured says why."""
    floors: dict[str, Any] = {}
    for variant in floor.VARIANTS:
        try:
            floors[variant] = floor.measure(n, per_process, repetitions, record_bytes, variant,
                                                  participants=participants)
            print(f"  N={n}: floor, {variant}: {floors[variant]}", flush=True)
        except (RuntimeError, TimeoutError, OSError) as exc:
            floors[variant] = {"not_measured": str(exc)}
            print(f"  N={n}: floor, {variant}: not measured: {exc}", flush=True)
    return floors


def _floor_beyond(n: int, memory: WorkerMemory, repetitions: int, measured: list[dict[str, Any]],
                  participants: str) -> dict[str, Any]:
    """The floor of a size too big to simulate here (chaos.scale.floor: bare clients, no heartbeats, so no steady
    state to keep up): what the host allows any protocol at that size, and whether ftcoord's own requests fit
    the target where the simulation cannot say. Laid out as the size would have been (scale_layout.layout), with a
    record as big per member as the largest size measured before it had (records grow more slowly than that)."""
    sized = [r for r in measured if "record_bytes" in r]
    if not sized:
        return _no_floor("no smaller size was measured before it, to size its record by: put one first in --sizes")
    largest = max(sized, key=lambda r: r["participants"])
    record_bytes = math.ceil(largest["record_bytes"] * n / largest["participants"])
    try:
        count = layout(n, memory, Machine.now())
    except DoesNotFit as exc:
        return _no_floor(f"bare clients do not fit either: {exc}")
    print(f"N={n}: the floor alone, {count} bare clients per process, a record of ~{record_bytes} bytes", flush=True)
    return {"run_as": participants, "record_bytes_estimated": record_bytes,
            "floor_s": _floor(n, count, repetitions, record_bytes, participants)}


def _no_floor(why: str) -> dict[str, Any]:
    """A size's floor not measured, every variant saying why (chaos.scale.report shows the reason once)."""
    return {"floor_s": {variant: {"not_measured": why} for variant in floor.VARIANTS}}


def _machine() -> dict[str, Any]:
    from chaos.bench.suite import machine

    return machine()
