"""The verifier catches what it exists to catch: planted faults in a ledger fail the verdict."""

from __future__ import annotations

import copy

import pytest

from chaos.verify import verify_ledger
from training.sampler import ResumableGlobalBatchSampler, ids_hash

STEPS, BATCH, WORLD = 20, 8, 2
SAMPLER = ResumableGlobalBatchSampler(64, BATCH, seed=5)  # 8 steps per epoch


def clean_ledger(world: int = WORLD) -> list[dict]:
    records, mono = [], 0.0
    for step in range(STEPS):
        for rank in range(world):
            shard = SAMPLER.shard(step, rank, world)
            mono += 1
            records.append({"kind": "step", "step": step, "generation": 1, "rank": rank, "world_size": world,
                            "window_hash": ids_hash(SAMPLER.window(step)), "shard_ids": shard.tolist(),
                            "mono": mono, "loss": 1.0})
    records += [{"kind": "final", "step": STEPS, "digest": "abc", "rank": r, "mono": mono + 1} for r in range(world)]
    return records


def test_a_clean_ledger_passes_bit_identical() -> None:
    verdict = verify_ledger(clean_ledger(), SAMPLER, STEPS, reference_digest="abc", reference_world_size=WORLD)
    assert verdict.passed and verdict.bit_identical is True
    assert (verdict.duplicates, verdict.missing, verdict.extra, verdict.epochs_checked) == (0, 0, 0, 2)


def test_duplicated_window_fails_and_is_named() -> None:
    records = clean_ledger()
    for r in records:
        if r["kind"] == "step" and r["step"] == 5:  # step 5 trained step 4's data again
            r["shard_ids"] = SAMPLER.shard(4, r["rank"], WORLD).tolist()
            r["window_hash"] = ids_hash(SAMPLER.window(4))
    verdict = verify_ledger(records, SAMPLER, STEPS)
    assert not verdict.passed
    assert verdict.duplicates == BATCH and verdict.missing == BATCH
    assert any("step 5" in p and "trained window" in p for p in verdict.problems)
    assert any("epoch 0: 8 duplicated, 8 missing" in p for p in verdict.problems)


def test_skipped_step_fails_and_is_named() -> None:
    records = [r for r in clean_ledger() if not (r["kind"] == "step" and r["step"] == 7)]
    verdict = verify_ledger(records, SAMPLER, STEPS)
    assert not verdict.passed and verdict.missing == BATCH
    assert "step 7 was never committed (skipped)" in verdict.problems


def test_wrong_shard_fails_and_is_named() -> None:
    records = clean_ledger()
    target = next(r for r in records if r["kind"] == "step" and r["step"] == 3 and r["rank"] == 1)
    target["shard_ids"] = SAMPLER.shard(3, 0, WORLD).tolist()  # rank 1 trained rank 0's shard
    verdict = verify_ledger(records, SAMPLER, STEPS)
    assert not verdict.passed and verdict.duplicates > 0
    assert any("step 3: rank 1 of 2 trained the wrong shard" in p for p in verdict.problems)


def test_diverged_parameters_fail_at_the_same_world_size() -> None:
    verdict = verify_ledger(clean_ledger(), SAMPLER, STEPS, reference_digest="other", reference_world_size=WORLD)
    assert not verdict.passed and verdict.bit_identical is False
    assert any("differ from the fault-free reference" in p for p in verdict.problems)


def test_ranks_finishing_with_different_parameters_fail() -> None:
    records = clean_ledger()
    records[-1] = {**records[-1], "digest": "xyz"}
    assert "ranks finished with different parameters" in " ".join(verify_ledger(records, SAMPLER, STEPS).problems)


def test_replayed_steps_are_superseded_not_duplicated() -> None:
    records = clean_ledger()
    replay = [copy.deepcopy(r) for r in records if r["kind"] == "step" and 10 <= r["step"] < 14]
    for r in replay:
        r["generation"] = 2
    verdict = verify_ledger(records + replay, SAMPLER, STEPS)
    assert verdict.passed and verdict.replayed_steps == 4 and verdict.duplicates == 0


def test_world_size_change_is_not_a_failure_and_reports_no_bit_identity() -> None:
    records = [r for r in clean_ledger() if r["kind"] == "step" and r["step"] < 10]
    records += [r for r in clean_ledger(world=1) if r["kind"] == "step" and r["step"] >= 10]
    records += [{"kind": "final", "step": STEPS, "digest": "zzz", "rank": 0, "mono": 1e9}]
    verdict = verify_ledger(records, SAMPLER, STEPS, reference_digest="abc", reference_world_size=WORLD)
    assert verdict.passed and verdict.bit_identical is None and verdict.world_sizes == [1, 2]


@pytest.mark.parametrize("shard_count", [0])
def test_a_rank_that_died_before_logging_still_counts_its_shard(shard_count: int) -> None:
    records = [r for r in clean_ledger() if not (r["kind"] == "step" and r["step"] == 9 and r["rank"] == 1)]
    verdict = verify_ledger(records, SAMPLER, STEPS)
    assert verdict.passed, verdict.problems
