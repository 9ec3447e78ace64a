"""Healing end to end: rank 0's process is SIGKILLed and nothing is lost (the README's quickstart, and the
training package with Adam). Real launcher, real warm standby, real kill."""

from __future__ import annotations

import os
import signal
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from chaos.report.metrics import read_logs
from ftcoord import StoreServer
from tests.helpers.script_runs import ScriptRun, slot_pid
from tests.helpers.train_runs import TrainingRun, train_args
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(240)


PROGRESS = r"step (\d+): loss"
STARTS = r"generation (\d+): rank (\d+) of (\d+) \(pid \d+\) starts at step (\d+)"


def test_quickstart_survives_the_death_of_rank_0_with_nothing_lost(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """The quickstart restarted both ranks at step 0 when rank 0 died: the fresh replacement broadcast its
    fresh weights over the survivor's. With call.heal the survivor is the source."""
    steps = 1000
    args = ["--steps", str(steps), "--save", "final.pt"]
    reference = ScriptRun(tmp_path / "ref", store_server.address, f"{job_id}-ref", "examples/quickstart.py", args)
    reference.wait()
    run = ScriptRun(tmp_path / "run", store_server.address, job_id, "examples/quickstart.py", args)
    wait_until(lambda: any(s >= 400 for s, in run.printed(PROGRESS)), 90, "rank 0 to pass step 400")
    os.kill(slot_pid(run.logs, 0), signal.SIGKILL)  # slot 0 holds rank 0
    run.wait()
    progress = [s for s, in run.printed(PROGRESS)]
    assert progress == sorted(set(progress)) and progress[-1] == steps, f"a step went backwards: {progress}"
    starts = run.printed(STARTS)
    assert {(g, r) for g, r, *_ in starts} >= {(2, 0), (2, 1)}, f"rank 0's death never made a generation 2: {starts}"
    assert all(start >= 400 for g, _, world, start in starts if g >= 2), starts
    healed = [e for e in read_logs(run.logs, ("state_healed",)) if e["generation"] == 2]
    assert healed and all(e["source"] == 1 and e["receivers"] == [0] for e in healed), healed
    ours, theirs = (torch.load(r.out / "final.pt", weights_only=True) for r in (run, reference))
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), "final parameters differ from the fault-free run"


def test_a_training_job_with_adam_loses_nothing_when_rank_0_is_killed(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    steps = 60
    args = train_args(steps, "--optimizer", "adam", "--step-time", "0.03")
    reference = TrainingRun.launch(tmp_path / "ref", store_server.address, f"{job_id}-ref", args)
    code, out = reference.wait()
    assert code == 0, out[-2000:]
    run = TrainingRun.launch(tmp_path / "run", store_server.address, job_id, args)
    run.wait_step(20)
    os.kill(slot_pid(run.out / "logs", 0), signal.SIGKILL)
    code, out = run.wait()
    assert code == 0, out[-2000:]
    by_slot: dict[int, list[int]] = defaultdict(list)
    for record in run.records():
        if record["kind"] == "step":
            by_slot[record["slot"]].append(record["step"])
    for slot, seen in by_slot.items():
        assert all(a < b for a, b in zip(seen, seen[1:], strict=False)), f"slot {slot} went backwards: {seen}"
    generations = [r for r in run.records() if r["kind"] == "generation" and r["generation"] > 1]
    assert generations and all(r["heal_source"] == 1 and r["heal_receivers"] == [0] for r in generations), generations
    assert run.final_digest() == reference.final_digest(), "final parameters differ from the fault-free run"
    proof = run.verify(steps, optimizer="adam")
    assert proof.passed, proof.problems
    assert proof.model.bit_identical is True
