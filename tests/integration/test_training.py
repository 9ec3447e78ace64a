"""Training through faults: bit-identical recovery, elastic resize, resume, preemption."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from ftcoord import StoreServer
from tests.helpers.cluster import Forker
from tests.helpers.train_runs import TrainingRun, child_env, train_args
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(240)


def test_kills_at_a_boundary_and_mid_step_end_bit_identical_to_a_fault_free_run(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    steps = 48
    reference = TrainingRun.launch(tmp_path / "ref", store_server.address, f"{job_id}-ref", train_args(steps))
    code, out = reference.wait()
    assert code == 0, out[-2000:]
    faults = [{"kind": "exit", "point": "at_boundary", "slot": 1, "step": 12},
              {"kind": "exit", "point": "after_backward", "slot": 0, "step": 30}]
    run = TrainingRun.launch(tmp_path / "run", store_server.address, job_id, train_args(steps), faults=faults)
    code, out = run.wait()
    assert code == 0, out[-2000:]
    assert len(list((tmp_path / "run").glob("fault-*"))) == 2, "both faults should have fired"
    # The launcher's warm standby accepted this command line and preloaded torch and the loop (a refusal
    # would leave every replacement to import them itself: seconds per recovery).
    ready = run.logs("standby_ready")
    assert ready and all(e["preloaded"] for e in ready), ready
    proof = run.verify(steps)
    assert proof.passed, proof.problems
    verdict = proof.verdict
    # Back at full size. A generation of 1 in between is allowed: at this test's fast timing a dead leader's
    # peer may judge it gone by evidence (a closed connection, 0.15 s of silence) before its launcher has
    # even reaped it and announced the replacement (seen once in CI; the demo checks [3] at its timing).
    assert proof.model.bit_identical is True and verdict.world_sizes[-1] == 2 and len(verdict.world_sizes) <= 2
    assert verdict.final_digests == [reference.final_digest()]  # the real fault-free run agrees with the replay
    assert verdict.duplicates == verdict.missing == verdict.extra == 0 and verdict.epochs_checked == 3


def test_elastic_two_to_one_to_two_keeps_exactly_once_progress(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    steps = 64
    faults = [{"kind": "exit", "point": "at_boundary", "slot": 1, "step": 10}]
    env = {**child_env(tmp_path, faults), "FTCOORD_STORE": store_server.address, "FTCOORD_JOB_ID": job_id,
           "FTCOORD_WORLD_SIZE": "2", "FTCOORD_LOG_DIR": str(tmp_path / "logs")}
    args = train_args(steps, "--step-time", "0.03", join_timeout=0.5)
    pids = [forker.spawn(args, tmp_path / f"slot{s}.out", "training.__main__", {**env, "FTCOORD_SLOT": str(s)})
            for s in (0, 1)]
    run = TrainingRun(tmp_path)
    wait_until(lambda: any(r["kind"] == "step" and r["world_size"] == 1 and r["step"] >= 30
                           for r in run.records()), 90, "slot 0 to train alone up to step 30")
    pids.append(forker.spawn(args, tmp_path / "slot1-back.out", "training.__main__", {**env, "FTCOORD_SLOT": "1"}))
    wait_until(lambda: all(p in forker.exited() for p in pids), 120, "the job to finish")
    exited = forker.exited()
    assert exited[pids[1]] == 137 and exited[pids[0]] == 0 and exited[pids[2]] == 0
    proof = run.verify(steps)
    assert proof.passed, proof.problems
    verdict = proof.verdict
    assert proof.model.bit_identical is True and proof.model.expected_from == "replay"
    assert verdict.world_sizes == [1, 2] and verdict.epochs_checked == 4
    assert verdict.duplicates == verdict.missing == verdict.extra == 0


@pytest.mark.parametrize("strategy", ["blocking", "flash"])
def test_whole_job_killed_resumes_from_the_latest_checkpoint(
    store_server: StoreServer, job_id: str, tmp_path: Path, strategy: str
) -> None:
    steps = 60
    args = train_args(steps, "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-strategy", strategy,
                      "--ckpt-every", "10", "--step-time", "0.03")
    first = TrainingRun.launch(tmp_path, store_server.address, job_id, args)
    first.wait_step(25)
    first.kill()  # every process of the job, at once
    second = TrainingRun.launch(tmp_path, store_server.address, job_id, args)
    code, out = second.wait()
    assert code == 0, out[-2000:]
    starts = [r for r in second.records() if r["kind"] == "generation" and r["loaded_from"]]
    assert starts, "the relaunch should have loaded a checkpoint"
    source = starts[0]["loaded_from"]
    assert source.startswith("flash:" if strategy == "flash" else "disk:"), source
    assert starts[0]["start_step"] >= 20
    proof = second.verify(steps)
    assert proof.passed, proof.problems
    assert proof.verdict.replayed_steps > 0  # steps after the checkpoint were trained again, and superseded


def test_sigterm_writes_an_emergency_checkpoint_and_the_relaunch_resumes_from_it(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    steps = 400
    args = train_args(steps, "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "1000", "--step-time", "0.02")
    first = TrainingRun.launch(tmp_path, store_server.address, job_id, args)
    first.wait_step(20)
    assert first.proc is not None
    first.proc.send_signal(signal.SIGTERM)
    code, out = first.wait(60)
    assert code == 0, out[-2000:]
    stopped = [r for r in first.records() if r["kind"] == "stopped"]
    assert len(stopped) == 2 and len({r["step"] for r in stopped}) == 1
    stop_step = stopped[0]["step"]
    assert (tmp_path / "ckpt" / f"step_{stop_step:08d}").is_dir()
    second = TrainingRun.launch(tmp_path, store_server.address, job_id, args)
    code, out = second.wait(180)
    assert code == 0, out[-2000:]
    resumed = [r for r in second.records() if r["kind"] == "generation" and r["loaded_from"]]
    assert resumed and resumed[0]["start_step"] == stop_step
    proof = second.verify(steps)
    assert proof.passed, proof.problems
    assert proof.verdict.replayed_steps == 0  # nothing lost: the emergency checkpoint was the last step


def test_changed_config_on_resume_fails_the_job_with_a_clear_error(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    args = train_args(20, "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "10")
    code, out = TrainingRun.launch(tmp_path, store_server.address, job_id, args).wait()
    assert code == 0, out[-2000:]
    changed = TrainingRun.launch(tmp_path / "again", store_server.address, f"{job_id}-2",
                                 [*train_args(40, "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "10"),
                                  "--lr", "0.5"])
    code, out = changed.wait()
    assert code == 1, out[-2000:]
    assert "ConfigMismatch" in out and "--warm-start" in out and "not restarting" in out
    assert os.path.isdir(tmp_path / "ckpt" / "step_00000020")  # nothing was lost
