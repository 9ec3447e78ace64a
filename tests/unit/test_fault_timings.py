"""chaos.report.metrics.fault_timings: a pause that came during another fault's re-form is timed, not called ridden
through.

Seen in a random schedule (seed 99991): a rank raised at step 164 and another was SIGSTOPped 17 ms later, after the
interrupt. The re-form waited a heartbeat timeout for the paused one and left it out; the report gave the raise that
2 s and the hang no recovery at all, as if it had been ridden through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.report.metrics import fault_timings


def _step(mono: float, generation: int, pid: int, world_size: int = 3) -> dict[str, Any]:
    return {"kind": "step", "step": int(mono), "mono": mono, "generation": generation, "pid": pid,
            "world_size": world_size}


def _faults() -> list[dict[str, Any]]:
    return [{"kind": "raise-midstep", "slot": 0, "step": 164, "mono": 100.0, "pid": 10, "generation": 9},
            {"kind": "hang", "slot": 1, "step": 165, "mono": 100.017, "pid": 11, "generation": 9}]


def _logs(tmp_path: Path) -> Path:
    (tmp_path / "slot0.jsonl").write_text(json.dumps(
        {"event": "generation_interrupted", "mono": 100.001, "generation": 9, "reason": "exception:slot=0"}) + "\n")
    return tmp_path


def test_a_pause_left_out_of_a_re_form_under_way_is_timed_with_a_note(tmp_path: Path) -> None:
    steps = [_step(99.9, 9, pid) for pid in (10, 11, 12)] + [_step(102.05, 10, pid) for pid in (20, 12, 30)]
    raised, hung = fault_timings(_faults(), steps, _logs(tmp_path), target_world_size=3)
    assert raised["detect_s"] is not None and raised["recover_s"] == 2.05
    assert hung["detect_s"] is None
    assert hung["recover_s"] == 2.033 and hung["full_recover_s"] == 2.033
    assert "left it out" in hung["note"]


def test_a_pause_ridden_through_still_has_nothing_to_recover_from(tmp_path: Path) -> None:
    """The paused process commits again (its pause was shorter than the heartbeat timeout): ridden through."""
    steps = [_step(99.9, 9, pid) for pid in (10, 11, 12)] + [_step(100.4, 10, pid) for pid in (20, 11, 12)]
    _, hung = fault_timings(_faults(), steps, _logs(tmp_path), target_world_size=3)
    assert hung["detect_s"] is None and hung["recover_s"] is None and hung["full_recover_s"] is None
    assert hung["note"].startswith("ridden through"), hung  # the report says why, never a bare None


def test_a_hot_spare_paused_is_not_taken_for_a_member_left_out(tmp_path: Path) -> None:
    """A spare commits no step before its pause or after it (the bundled `pause` scenario's first fault): it was never
    in a re-form to be left out of, and a later generation's first step is not its recovery."""
    spare = {"kind": "pause", "slot": 100000, "step": 5, "mono": 100.0, "pid": 99, "generation": 1}
    steps = [_step(99.9, 1, pid) for pid in (10, 11, 12)] + [_step(110.3, 2, pid) for pid in (10, 11, 12)]
    (timed,) = fault_timings([spare], steps, tmp_path, target_world_size=3)
    assert timed["recover_s"] is None and timed["note"].startswith("ridden through"), timed


def test_a_standby_fault_has_nothing_to_recover_from(tmp_path: Path) -> None:
    """The ranks train on through their standby's pause or death: a generation that changes after it is a later
    fault's (the bundled `standby` scenario kills a rank while its standby is stopped), not the standby fault's."""
    paused = {"kind": "pause-standby", "slot": 0, "step": 30, "mono": 100.0, "pid": 50, "generation": 1}
    killed = {"kind": "kill", "slot": 1, "step": 35, "mono": 100.2, "pid": 11, "generation": 1}
    (tmp_path / "slot0.jsonl").write_text(json.dumps(
        {"event": "generation_interrupted", "mono": 100.21, "generation": 1, "reason": "exception:slot=0"}) + "\n")
    steps = [_step(99.9, 1, pid) for pid in (10, 11)] + [_step(103.0, 2, pid) for pid in (10, 20)]
    pause, kill = fault_timings([paused, killed], steps, tmp_path, target_world_size=2)
    assert pause["detect_s"] is None and pause["recover_s"] is None and pause["full_recover_s"] is None
    assert "a standby fault ends no generation" in pause["note"], pause
    assert kill["recover_s"] == 2.8 and kill["note"] == ""


def test_a_fault_that_hit_a_hot_spare_has_nothing_to_recover_from(tmp_path: Path) -> None:
    """The random schedule re-seeded to 31006: the spare, which led, was paused then killed (pause-leader,
    kill-leader), and 80 ms later a rank's training thread stuck. Each of the spare's faults was timed at the stuck
    rank's recovery, 25 s: the members never stopped for the spare. A fault at a member is timed as before."""
    spare = {"kind": "kill-leader", "slot": 100000, "step": 86, "mono": 100.0, "pid": 50, "generation": 1,
             "member": False}
    stuck = {"kind": "stuck", "slot": 1, "step": 88, "mono": 100.08, "pid": 11, "generation": 1, "member": True}
    (tmp_path / "slot0.jsonl").write_text(json.dumps(
        {"event": "member_declared_dead", "mono": 124.7, "generation": 1, "reason": "stuck"}) + "\n")
    steps = [_step(99.9, 1, pid) for pid in (10, 11)] + [_step(125.0, 2, pid) for pid in (10, 20)]
    kill, hung = fault_timings([spare, stuck], steps, tmp_path, target_world_size=2)
    assert kill["detect_s"] is None and kill["recover_s"] is None and kill["full_recover_s"] is None, kill
    assert "hot spare" in kill["note"]
    assert hung["recover_s"] == 24.92


def test_a_whole_job_restart_is_the_detection_under_the_job_policy(tmp_path: Path) -> None:
    """restart_policy job: the launcher that saw the death restarts every process before any of them interrupts a
    generation, so the first interrupt is the next generation's, once the new processes started (seen: a kill-boundary
    "detected" in 3.2 s; the launcher restarted the job 25 ms after it). Sabotage: job_restart not read fails it."""
    killed = {"kind": "kill-boundary", "slot": 1, "step": 120, "mono": 100.0, "pid": 10, "generation": 3}
    (tmp_path / "launcher.jsonl").write_text(json.dumps({"event": "job_restart", "mono": 100.025, "number": 2}) + "\n")
    (tmp_path / "slot2.jsonl").write_text(json.dumps(
        {"event": "generation_interrupted", "mono": 103.2, "generation": 3, "reason": "gone:slot=0"}) + "\n")
    steps = [_step(99.9, 3, pid) for pid in (10, 11, 12)] + [_step(103.7, 4, pid) for pid in (20, 21, 22)]
    (timed,) = fault_timings([killed], steps, tmp_path, target_world_size=3)
    assert timed["detect_s"] == 0.025 and timed["recover_s"] == 3.7, timed


def test_a_store_fault_is_not_given_the_detection_of_a_fault_of_its_step(tmp_path: Path) -> None:
    """A store-hang of 3 s and a kill-follower 0.5 s into it, at the same step (so in one window): the runner fires the
    kill once the store answers, and the hang was timed at the kill's interrupt, 3 s, as if a store fault had ended
    a generation. Sabotage: store faults timed like any other fails it."""
    hung = {"kind": "store-hang", "slot": 0, "step": 120, "mono": 100.0, "pid": 5, "generation": 2}
    killed = {"kind": "kill-follower", "slot": 1, "step": 120, "mono": 103.0, "pid": 11, "generation": 2}
    (tmp_path / "slot0.jsonl").write_text(json.dumps(
        {"event": "generation_interrupted", "mono": 103.02, "generation": 2, "reason": "exception:slot=0"}) + "\n")
    steps = [_step(102.9, 2, pid) for pid in (10, 11)] + [_step(103.2, 3, pid) for pid in (10, 20)]
    hang, kill = fault_timings([hung, killed], steps, tmp_path, target_world_size=2)
    assert hang["detect_s"] is None and hang["recover_s"] is None and hang["full_recover_s"] is None, hang
    assert "a store fault ends no generation" in hang["note"], hang
    assert kill["detect_s"] == 0.02 and kill["recover_s"] == 0.2, kill
