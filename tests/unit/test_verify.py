"""The verifier catches what it exists to catch: planted faults in a ledger fail the verdict, by name.

Ledgers here are built from the specification (chaos.proof.expected), as a correct run would write them,
then damaged the way a bug or a lost file would damage them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from chaos.proof.expected import DataExpectation
from chaos.proof.verify import verify_ledger
from training.ledger import LedgerScan, scan_ledgers
from training.sampler import ResumableGlobalBatchSampler

pytestmark = pytest.mark.timeout(60)

STEPS, BATCH, WORLD, SEED = 20, 8, 2, 5
EXPECT = DataExpectation("synthetic:64", BATCH, SEED)  # 8 steps per epoch


def generation_line(generation: int, rank: int, world: int, start: int, pid: int) -> dict[str, Any]:
    return {"kind": "generation", "generation": generation, "rank": rank, "slot": rank, "pid": pid,
            "world_size": world, "members": list(range(world)), "start_step": start, "config_hash": "cfg",
            "grad_reduction": "fixed", "threads": 1, "mono": 0.0}


def step_line(step: int, generation: int, rank: int, world: int, pid: int, mono: float) -> dict[str, Any]:
    ids = EXPECT.shard(step, rank, world)
    assert ids is not None
    return {"kind": "step", "step": step, "generation": generation, "rank": rank, "slot": rank, "pid": pid,
            "world_size": world, "shard_ids": ids, "batch_hash": EXPECT.batch_hash(ids), "loss": 1.0, "mono": mono}


def clean_records(world: int = WORLD, generation: int = 1, start: int = 0, end: int = STEPS) -> list[dict[str, Any]]:
    records = [generation_line(generation, r, world, start, 100 + r) for r in range(world)]
    mono = float(generation * 10_000 + start * world)  # a later generation trains later, as on one host
    for step in range(start, end):
        for rank in range(world):
            mono += 1
            records.append(step_line(step, generation, rank, world, 100 + rank, mono))
    return records


def finals(digest: str = "abc", world: int = WORLD) -> list[dict[str, Any]]:
    return [{"kind": "final", "step": STEPS, "digest": digest, "rank": r, "mono": 1e6 + r} for r in range(world)]


def verify(records: list[dict[str, Any]], **kwargs: Any):  # noqa: ANN201
    return verify_ledger(LedgerScan(records=sorted(records, key=lambda r: r["mono"])), EXPECT, STEPS, **kwargs)


def test_the_expectation_agrees_with_the_sampler_it_was_written_apart_from() -> None:
    sampler = ResumableGlobalBatchSampler(64, BATCH, SEED)
    for step in range(STEPS):
        assert EXPECT.window(step) == sampler.window(step).tolist()
        for world in (1, 2, 4, 8):
            for rank in range(world):
                assert EXPECT.shard(step, rank, world) == sampler.shard(step, rank, world).tolist()


def test_a_clean_ledger_passes() -> None:
    verdict = verify(clean_records() + finals(), config_hash="cfg")
    assert verdict.passed, verdict.problems
    assert (verdict.duplicates, verdict.missing, verdict.extra, verdict.epochs_checked) == (0, 0, 0, 2)
    assert verdict.schedule == [WORLD] * STEPS and verdict.final_digests == ["abc"]


def test_duplicated_window_fails_and_is_named() -> None:
    records = clean_records() + finals()
    for r in records:
        if r["kind"] == "step" and r["step"] == 5:  # step 5 trained step 4's data again
            r["shard_ids"] = EXPECT.shard(4, r["rank"], WORLD)
            r["batch_hash"] = EXPECT.batch_hash(r["shard_ids"])
    verdict = verify(records)
    assert not verdict.passed
    assert verdict.duplicates == BATCH and verdict.missing == BATCH
    assert any(p.startswith("step 5: rank 0 of 2 trained ids") for p in verdict.problems)
    assert any("epoch 0: 8 duplicated, 8 missing" in p for p in verdict.problems)


def test_skipped_step_fails_and_is_named() -> None:
    records = [r for r in clean_records() + finals() if not (r["kind"] == "step" and r["step"] == 7)]
    verdict = verify(records)
    assert not verdict.passed and verdict.missing == BATCH
    assert "step 7 was never committed (skipped)" in verdict.problems


def test_a_swapped_sample_id_fails_and_is_named() -> None:
    records = clean_records() + finals()
    target = next(r for r in records if r["kind"] == "step" and r["step"] == 3 and r["rank"] == 1)
    outside = next(i for i in range(64) if i not in EXPECT.window(3))
    target["shard_ids"] = [outside] + target["shard_ids"][1:]
    verdict = verify(records)
    assert not verdict.passed
    assert any(p.startswith("step 3: rank 1 of 2 trained ids") for p in verdict.problems)


def test_other_bytes_under_the_right_ids_fail() -> None:
    """The loop logged the right ids but fed the model something else: only the batch digest shows it."""
    records = clean_records() + finals()
    target = next(r for r in records if r["kind"] == "step" and r["step"] == 9 and r["rank"] == 0)
    target["batch_hash"] = EXPECT.batch_hash(EXPECT.shard(10, 0, WORLD))
    verdict = verify(records)
    assert any("step 9: rank 0 fed the model other bytes" in p for p in verdict.problems)


def test_a_replay_after_a_rollback_is_superseded_not_duplicated() -> None:
    records = clean_records(end=14) + clean_records(generation=2, start=10) + finals()
    verdict = verify(records)
    assert verdict.passed, verdict.problems
    assert verdict.replayed_steps == 4 and verdict.duplicates == 0


def test_a_replay_that_no_rollback_explains_fails() -> None:
    """Generation 2 says it started at step 14 (no rollback) but re-commits steps 10-13."""
    records = clean_records(end=14) + clean_records(generation=2, start=10) + finals()
    for r in records:
        if r["kind"] == "generation" and r["generation"] == 2:
            r["start_step"] = 14
    verdict = verify(records)
    assert any("generation 2 started at step 14 but committed step 10" in p for p in verdict.problems)


def test_steps_of_a_generation_nobody_started_fail() -> None:
    records = clean_records(end=14) + [r for r in clean_records(generation=2, start=10) if r["kind"] == "step"]
    verdict = verify(records + finals())
    assert any("generation 2 committed steps 10-19, but no rank recorded starting it" in p
               for p in verdict.problems)


def test_a_member_without_records_mid_generation_is_missing_evidence() -> None:
    records = [r for r in clean_records() + finals() if not (r["kind"] == "step" and r["step"] == 9
                                                              and r["rank"] == 1)]
    verdict = verify(records)
    assert not verdict.passed
    assert any("step 9: rank 1 of generation 1 left no record" in p for p in verdict.problems)


def test_a_rank_that_stopped_on_its_generations_last_step_is_explained() -> None:
    """A peer died inside step 9's collectives: rank 0 committed it, rank 1 never did; generation 2 went
    on from step 10. Rank 1's gradient was in the all-reduce, so its shard counts as trained."""
    first = [r for r in clean_records(end=10) if not (r["kind"] == "step" and r["step"] == 9 and r["rank"] == 1)]
    verdict = verify(first + clean_records(generation=2, start=10) + finals())
    assert verdict.passed, verdict.problems


def test_a_deleted_ledger_fails_by_name() -> None:
    records = [r for r in clean_records() + finals() if r.get("rank") != 1 or r["kind"] == "final"]
    verdict = verify(records)
    assert any("rank 1 (slot 1) left no record of it" in p for p in verdict.problems)


def test_a_configuration_other_than_the_scenarios_fails() -> None:
    verdict = verify(clean_records() + finals(), config_hash="other")
    assert any("trained configuration cfg, the scenario's is other" in p for p in verdict.problems)


def test_ranks_finishing_with_different_parameters_fail() -> None:
    records = clean_records() + finals()
    records[-1] = {**records[-1], "digest": "xyz"}
    assert "ranks finished with different parameters" in " ".join(verify(records).problems)


def test_generation_numbers_must_increase_with_time() -> None:
    """A number decided twice, or a restarted store reusing a lower number, shows as a higher generation
    committing steps before a lower one's last step."""
    records = clean_records(end=10) + clean_records(generation=2, start=10) + finals()
    for r in records:
        if r["kind"] == "step" and r["generation"] == 2:
            r["mono"] -= 20_000  # generation 2 "trained" before generation 1
    verdict = verify(records)
    assert any("generation 2 committed a step at mono" in p and "before generation 1's last step" in p
               for p in verdict.problems), verdict.problems


def test_a_late_line_of_a_step_its_peers_committed_in_time_orders_nothing() -> None:
    """A member stopped right after a step's collectives (its node partitioned) writes its line of that step when it
    runs again, after the next generation started: its peers committed the step in time (partition-heals scenario).
    Sabotage: a generation's last step timed by its last line fails this."""
    records = clean_records(end=10) + clean_records(generation=2, start=10) + finals()
    late = next(r for r in records if r["kind"] == "step" and r["generation"] == 1 and r["step"] == 9
                and r["rank"] == 1)
    late["mono"] = 20_000 + 50  # written once generation 2 had trained a few steps
    verdict = verify(records)
    assert verdict.passed, verdict.problems


def test_the_steps_that_count_are_those_of_the_branch_the_final_model_carries() -> None:
    """Mixed schedule M2: generation 1 (2 ranks) commits steps 0-9 and stands blocked; generation 2, one new
    process, loads the checkpoint of step 8 and trains steps 8-14 on its own, then sticks too; generation 3 forms
    from generation 1's processes and resumes at step 10 from their own state. Steps 8 and 9 the final model carries
    are generation 1's (2 ranks), not generation 2's, though its number is higher: the replay of the schedule read
    otherwise summed their gradients over one rank and differed from the run by an ulp. Sabotage: the highest
    generation per step makes the schedule [..., 1, 1, ...] here."""
    def line(generation: int, rank: int, world: int, start: int, pid: int, mono: float, **more: Any) -> dict:
        return {**generation_line(generation, rank, world, start, pid), "members": list(range(world)),
                "heal_source": 0, "mono": mono, **more}

    records, mono = [line(1, r, 2, 0, 100 + r, 1.0) for r in range(2)], 10.0
    for step in range(10):
        for rank in range(2):
            records.append(step_line(step, 1, rank, 2, 100 + rank, mono := mono + 1))
        if step == 7:  # the checkpoint of step 8 (8 steps done), saved by generation 1's rank 0
            records.append({"kind": "checkpoint", "generation": 1, "step": 8, "rank": 0, "pid": 100,
                            "mono": mono + 0.5})
    records.append(line(2, 0, 1, 8, 300, 100.0, loaded_from="disk:ckpt/step_00000008"))
    records += [step_line(step, 2, 0, 1, 300, 100.0 + step) for step in range(8, 15)]
    records += [line(3, r, 2, 10, 100 + r, 200.0) for r in range(2)]
    records += [step_line(step, 3, rank, 2, 100 + rank, 200.0 + 2 * step + rank)
                for step in range(10, STEPS) for rank in range(2)]
    verdict = verify(records + finals())
    assert verdict.passed, verdict.problems
    assert verdict.schedule == [2] * STEPS, f"steps counted from the abandoned branch: {verdict.schedule}"
    assert verdict.replayed_steps == 7


def test_a_world_size_change_is_followed_step_by_step() -> None:
    records = clean_records(end=10) + clean_records(world=1, generation=2, start=10) + finals(world=1)
    verdict = verify(records)
    assert verdict.passed, verdict.problems
    assert verdict.world_sizes == [1, 2] and verdict.schedule == [2] * 10 + [1] * 10


def _write(path: Path, records: list[dict[str, Any]], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_torn_lines_are_problems_unless_a_death_explains_the_last_one(tmp_path: Path) -> None:
    records = clean_records() + finals()
    rank0 = [r for r in records if r.get("rank") == 0 and r["kind"] != "final"]
    rank1 = [r for r in records if r.get("rank") == 1 and r["kind"] != "final"]
    _write(tmp_path / "ledger-slot0-100.jsonl", rank0 + finals()[:1], tail='{"kind": "step", "ste')
    _write(tmp_path / "ledger-slot1-101.jsonl", rank1 + finals()[1:])
    assert verify_ledger(scan_ledgers(tmp_path), EXPECT, STEPS, dead_pids={100}).passed
    torn = verify_ledger(scan_ledgers(tmp_path), EXPECT, STEPS, dead_pids=set())
    assert any("ledger-slot0-100.jsonl: line" in p and "its last line" in p for p in torn.problems)
    lines = (tmp_path / "ledger-slot1-101.jsonl").read_text().splitlines()
    lines[5] = lines[5][:20]  # a torn line in the middle: no death explains it
    (tmp_path / "ledger-slot1-101.jsonl").write_text("\n".join(lines) + "\n")
    middle = verify_ledger(scan_ledgers(tmp_path), EXPECT, STEPS, dead_pids={100, 101})
    assert any("line 6 is torn (a line in the middle)" in p for p in middle.problems)


def test_scan_keeps_complete_lines_in_time_order(tmp_path: Path) -> None:
    records = copy.deepcopy(clean_records(end=2))
    _write(tmp_path / "ledger-slot0-7.jsonl", [r for r in records if r["rank"] == 0])
    _write(tmp_path / "ledger-slot1-8.jsonl", [r for r in records if r["rank"] == 1])
    scan = scan_ledgers(tmp_path)
    assert not scan.torn and [r["mono"] for r in scan.records] == sorted(r["mono"] for r in records)


def test_ledgers_are_read_while_checkpoint_directories_come_and_go(tmp_path: Path) -> None:
    """A run directory is read while the run writes into it (CI once failed here: `rglob` raised
    FileNotFoundError for a checkpoint's temporary directory renamed between listing and opening)."""
    import shutil
    import threading

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "ledger-0-1.jsonl").write_text(json.dumps({"kind": "step", "mono": 0.0}) + "\n")
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for i in range(20):
                (tmp_path / "ckpt" / f"step_{i:08d}.tmp" / "a" / "b").mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp_path / "ckpt", ignore_errors=True)

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        for _ in range(300):
            assert len(scan_ledgers(tmp_path).records) == 1
    finally:
        stop.set()
        thread.join(5)
