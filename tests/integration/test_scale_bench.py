"""`chaos bench --scale` end to end at a small size: it runs from the README's command and measures everything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


@pytest.mark.slow  # the whole bench at 32 (55 s); its refusals and its workers' deaths are in the default set
def test_the_scale_bench_measures_every_figure_at_a_small_size(tmp_path: Path) -> None:
    out = tmp_path / "scale"
    result = subprocess.run([sys.executable, "-m", "chaos", "bench", "--scale", "--sizes", "32", "--quick",
                             "--generations", "120", "--out", str(out)], capture_output=True, text=True, timeout=280)
    assert result.returncode in (0, 1), result.stderr[-2000:]  # 1: a target missed (said in scale.md)
    report = json.loads((out / "scale.json").read_text())["sizes"][0]
    assert (out / "scale.md").read_text().startswith("# ftcoord at scale")
    assert (out / "scale.png").stat().st_size > 0
    assert report["participants"] == 32 and report["false_positives"] == 0, report["problems"]
    assert report["advance_s"]["median"] > 0 and report["reform_marked_s"] > 0
    assert report["detect_silent_s"] is not None, "the silent kill was never detected"
    assert 0 < report["ops_per_participant_s"]["total"] <= report["ops_budget"], report["ops_per_participant_s"]
    assert report["memory"]["keys_growth"] <= 0, report["memory"]
    # An advance's cost: each participant's announcement (append) and record wait are in it, and CPU was used.
    assert report["requests_per_advance"]["trainer/append"] >= 0.9, report["requests_per_advance"]
    # The store's share: its CPU is counted in clock ticks, and at this size a few advances may take less than one
    # tick of it; a share above one core would be a wrong measure (the store is one thread).
    busy = report["cores_busy_during_advance"]
    assert 0 <= busy["store"] <= 1.2 and busy["clock_tick_s"] > 0, busy
    assert report["cores_busy_during_advance"]["participants"] > 0, report["cores_busy_during_advance"]
    # What bare clients take on this machine, beside the advance (chaos.scale.floor): every variant measured.
    floor = report["floor_s"]
    assert all(floor[variant]["median"] > 0 for variant in ("least", "critical_path", "ftcoord_requests",
                                                          "every_request")), floor
    assert "bare store clients" in (out / "scale.md").read_text()


def test_a_size_too_busy_to_simulate_still_measures_its_floor_alone() -> None:
    """A size refused for its steady state (its participants' heartbeats would take the cores) still gets what this
    machine allows any protocol at that size: bare clients keep no steady state up (chaos.scale.floor). Its record is
    sized from the largest size measured before it, and the report sets the floor beside the refusal."""
    from chaos.scale.bench import _floor_beyond
    from chaos.scale.layout import WorkerMemory
    from chaos.scale.report import markdown, targets_missed

    refused = "16 participants would keep ~1.8 of this machine's 2 cores busy"
    result = {"participants": 16, "not_measured": refused,
              **_floor_beyond(16, WorkerMemory(), 2, [{"participants": 8, "record_bytes": 300}], "threads")}
    assert result["record_bytes_estimated"] == 600 and result["run_as"] == "threads", result
    floor = result["floor_s"]
    assert set(floor) == {"least", "critical_path", "ftcoord_requests", "every_request"}, floor
    assert all(f["median"] > 0 for f in floor.values()), floor
    misses = targets_missed([result])
    assert misses[0].startswith(f"N=16: not measured: {refused} (bare clients on this machine, floor: least "), misses
    text = markdown([result], misses)
    assert ("- N=16: not simulated (above), its floor alone, with a record estimated at 600 bytes. The same number "
            "of bare store clients") in text, text


def test_the_scale_bench_refuses_bad_sizes_with_a_clear_error() -> None:
    result = subprocess.run([sys.executable, "-m", "chaos", "bench", "--scale", "--sizes", "4,x"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--sizes '4,x'" in result.stderr and "e.g. 64,256,1024" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_participants_beat_on_the_timing_the_bench_was_given(tmp_path: Path) -> None:
    """`--heartbeat-interval` reaches every simulated participant: at one beat a second, half the default's rate (a
    job of thousands of ranks may beat less often; the report says which timing ran). A bench that measured its
    figures on the default timing while it said another would claim what it never ran."""
    from chaos.scale.bench import scale_timing
    from chaos.scale.swarm import Swarm
    from ftcoord.store.server import StoreProcess

    timing = scale_timing(1.0)
    assert (timing.heartbeat_interval, timing.heartbeat_timeout) == (1.0, 10.0)
    server = StoreProcess.start("127.0.0.1", 0)
    with (tmp_path / "workers.log").open("w") as log:
        swarm = Swarm(server.address, "slow-beats", 6, log, step_s=2.0, per_process=4, timing=timing)
        try:
            swarm.wait_for(lambda: swarm.everyone_in(0, set(range(6))) is not None, 120, "6 participants formed")
            before, _ = swarm.counts()
            started = time.monotonic()
            time.sleep(4.0)  # a window of four beats
            after, _ = swarm.counts()
            rate = (after["heartbeat/add"] - before["heartbeat/add"]) / 6 / (time.monotonic() - started)
            assert 0.6 <= rate <= 1.4, f"{rate:.2f} heartbeats per participant per s, at one beat a second"
        finally:
            swarm.close()
            server.stop()


def test_the_scale_bench_refuses_a_heartbeat_interval_it_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    from chaos import cli

    for argv, said in ((["--scale", "--heartbeat-interval", "0"], "heartbeat_interval=0.0 must be a positive"),
                       (["--scale", "--heartbeat-interval", "12"], "must be below 12.0s: its timeout, ten intervals"),
                       (["--heartbeat-interval", "2"], "give it with --scale")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["bench", *argv, "--sizes", "64", "--out", "/nonexistent/never"])
        assert exit_.value.code == 2, argv
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, (argv, err)


def test_a_worker_that_dies_fails_the_wait_at_once_and_names_its_slots(tmp_path: Path) -> None:
    """A worker process that exits (here: SIGKILLed behind the driver's back) takes dozens of participants with it:
    the driver says which and stops waiting, instead of waiting out its deadline (minutes at large sizes)."""
    from chaos.scale.swarm import Swarm
    from ftcoord.store.server import StoreProcess

    server = StoreProcess.start("127.0.0.1", 0)
    with (tmp_path / "workers.log").open("w") as log:
        swarm = Swarm(server.address, "died", 8, log, step_s=2.0, per_process=4)
        try:
            bulk = next(w for w in swarm.workers if w.count > 1)
            bulk.process.kill()
            started = time.monotonic()
            with pytest.raises(RuntimeError, match=r"the worker process of slots 1-4 exited with -9"):
                swarm.wait_for(lambda: False, 120, "never")
            assert time.monotonic() - started < 5
        finally:
            swarm.close()
            server.stop()


def test_a_floor_worker_that_dies_is_said_at_once() -> None:
    """The floor's workers (chaos.scale.floor) are bare store clients; one that exits (here: refused its variant)
    fails the measure at once, naming its exit code, instead of the driver waiting out its deadline."""
    from chaos.scale import floor

    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"a floor worker exited with 2 before saying 'ready'"):
        floor.measure(4, 2, 1, 16, "no-such-variant", timeout_s=120)
    assert time.monotonic() - started < 30


def test_each_simulated_host_is_scheduled_on_its_own_and_a_stragglers_threads_can_be_seen(tmp_path: Path) -> None:
    """The store and every worker process run in a session of their own, so the kernel shares the CPU between them
    as between hosts (autogroups): in one session, the store's one thread was one among ~6,000 at 1,024, left
    unscheduled for seconds at an advance (its clients' calls went unanswered for op_timeout, whole workers
    reconnected, advances took 20-40 s). A straggling participant's threads are shown where they wait, with what
    its interrupt watch holds (what the bench records for an advance slower than STRAGGLING_S)."""
    from chaos.scale.swarm import Swarm
    from ftcoord.store.server import StoreProcess

    server = StoreProcess.start("127.0.0.1", 0, own_session=True)
    with (tmp_path / "workers.log").open("w") as log:
        swarm = Swarm(server.address, "hosts", 6, log, step_s=2.0, per_process=2)
        try:
            for process in [server.process] + [w.process for w in swarm.workers]:
                assert os.getsid(process.pid) == process.pid, "not in a session of its own"
            swarm.wait_for(lambda: swarm.everyone_in(0, set(range(6))) is not None, 120, "6 participants formed")
            found = swarm.stacks([3])
            assert found["state-3"]["generation"] >= 1 and found["state-3"]["fired"] is False, found["state-3"]
            watch = found["ftcoord-monitor-3"]
            assert any("interrupt_watch.py" in frame for frame in watch), watch
            assert "sim-trainer-3" in found and not any(name.endswith("-2") for name in found), sorted(found)
        finally:
            swarm.close()
            server.stop()


def test_an_advance_is_timed_only_when_it_was_the_one_change_asked_for(tmp_path: Path) -> None:
    """`chaos.scale.bench.advance` (the bench's advances, and scripts/scale-advances'): an interrupt someone else won
    before the bench asked is said with its reason (a change nobody asked for: its time is not the bench's), and a
    clean advance says nothing and moves everyone exactly one generation on."""
    from chaos.scale.bench import advance
    from chaos.scale.swarm import Swarm
    from ftcoord.protocol import keys
    from ftcoord.store.link import StoreLink
    from ftcoord.store.server import StoreProcess

    server = StoreProcess.start("127.0.0.1", 0, own_session=True)
    link = StoreLink(server.address, "advance", connect_timeout=30)
    store = link.connect()
    everyone = set(range(4))
    with (tmp_path / "workers.log").open("w") as log:
        swarm = Swarm(server.address, "advance", 4, log, step_s=2.0, per_process=2)
        try:
            swarm.wait_for(lambda: swarm.everyone_in(0, everyone) is not None, 120, "4 participants formed")
            generation = swarm.everyone_in(0, everyone)
            assert generation is not None
            stragglers: list[dict[str, object]] = []
            unasked: list[dict[str, object]] = []
            step = advance(swarm, store, generation, everyone, stragglers, unasked)
            assert step.generation == generation + 1 and not unasked, unasked
            assert len(step.times) == 4 and all(t > 0 for t in step.times), step
            assert step.started <= step.announced <= step.decided, step
            store.compare_set(keys.interrupt(step.generation), "", "test:not-the-bench")
            again = advance(swarm, store, step.generation, everyone, stragglers, unasked)
            assert again.generation > step.generation, again
            assert unasked and unasked[0]["reasons"] == {step.generation: "test:not-the-bench"}, unasked
        finally:
            swarm.close()
            link.close()
            server.stop()


@pytest.mark.slow  # both kinds of participant compared (40 s); the bench itself is in the default set
def test_event_loop_participants_cost_the_store_what_thread_participants_cost(tmp_path: Path) -> None:
    """`--participants events` runs the same ftcoord code on greenlets with chaos.scale.wire_store's clients: its bulk
    workers say so once started, and a participant's requests per advance, operation by operation, are those of
    participants that run on threads (a drift would mean the bench measures some other protocol). The leader's
    share is left out: what it deletes per advance depends on when the old generations' members all arrived."""
    from chaos.scale.bench import run_size

    results = {}
    with (tmp_path / "workers.log").open("w") as log:
        for participants in ("threads", "events"):
            results[participants] = run_size(12, repetitions=4, generations=0, window_s=3.0, step_s=2.0,
                                             per_process=5, log=log, say=lambda text: None,
                                             participants=participants)
    for participants, result in results.items():
        assert result["run_as"] == participants
        assert result["false_positives"] == 0 and not result["problems"], (participants, result["problems"])
        assert result["advance_s"]["median"] > 0, (participants, result["advance_s"])
    assert results["events"]["bulk_clients"] == ["wire_on_loop"], results["events"]["bulk_clients"]
    assert results["threads"]["bulk_clients"] == ["tcpstore_client"], results["threads"]["bulk_clients"]
    threads, events = (
        {op: n for op, n in results[p]["requests_per_advance"].items() if op.split("/")[0] in ("trainer", "monitor")}
        for p in ("threads", "events"))
    assert threads.get("trainer/append", 0) >= 0.9, threads
    for op in sorted(set(threads) | set(events)):
        assert abs(threads.get(op, 0.0) - events.get(op, 0.0)) <= 0.25, (op, threads, events)
    # The floor's `every_request` is what a participant asks per advance: the same requests, operation by operation
    # (the floor once kept a read of the stop key, a status write and a read of the probe the protocol had dropped).
    measured: Counter[str] = Counter()
    for role_op, n in threads.items():
        measured[role_op.split("/")[1]] += n
    floor = _floor_requests_per_round("every_request")
    for op in sorted(set(measured) | set(floor)):
        assert abs(measured.get(op, 0.0) - floor.get(op, 0)) <= 0.25, (op, dict(measured), dict(floor))


def _floor_requests_per_round(variant: str) -> Counter[str]:
    """One bare participant's requests in one round of the floor (chaos.scale.floor), counted as StoreLink counts
    a participant's (TCPStore's get is two), against a real store whose keys let the round run straight through."""
    from chaos.scale import floor
    from ftcoord.store.client import connect
    from ftcoord.store.link import _REQUESTS
    from ftcoord.store.server import StoreProcess

    class Counting:
        def __init__(self, store: object) -> None:
            self.store, self.requests = store, Counter[str]()

        def __getattr__(self, name: str) -> object:
            self.requests[name] += _REQUESTS.get(name, 1)
            return getattr(self.store, name)

    server = StoreProcess.start("127.0.0.1", 0)
    try:
        store = connect(server.address)
        for name in ("interrupt", "record", "probe"):
            store.set(f"floor/{variant}/0/{name}", "x")
        counting = Counting(store)
        floor._client_rounds(counting, variant, 1, [0.0], 0)
        return counting.requests
    finally:
        server.stop()


def test_event_loop_participants_without_gevent_get_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    from chaos import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gevent" else real(name, *a))
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--scale", "--sizes", "64", "--participants", "events", "--out", "/nonexistent/never"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "gevent is not installed" in err and "pip install gevent" in err and "--participants threads" in err


@pytest.mark.parametrize("installed", [True, False])
def test_the_participants_run_as_events_where_gevent_is_installed_and_as_threads_where_not(
        installed: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's command (no --participants) measures with event-loop participants where gevent is installed (as
    `make setup` installs it): thousands of thread participants on a few cores measure the kernel switching them. Where
    it is not, the bench runs with threads and says why its figures may be slow, rather than refusing to run."""
    import importlib.util

    from chaos import cli
    from chaos.scale import bench

    real = importlib.util.find_spec
    if not installed:
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gevent" else real(name, *a))
    ran: dict[str, object] = {}
    monkeypatch.setattr(bench, "run_scale_bench", lambda out, sizes, **kwargs: ran.update(kwargs) or 0)
    assert cli.main(["bench", "--scale", "--sizes", "64", "--out", "/nonexistent/never"]) == 0
    err = capsys.readouterr().err
    assert ran["participants"] == ("events" if installed else "threads"), ran
    assert ("gevent is not installed" in err) == (not installed), err
