"""The verifier: proves from the step ledger that every sample was trained exactly once.

For each step it takes the records of the highest generation that committed it (a replay
after a resume supersedes the earlier commit), checks the global window against the
sampler's expected window and each logged shard against the expected shard of its rank,
and counts per epoch: duplicates, missing and extra samples. A committed step trained the
whole window (the gradient all-reduce that let any rank commit included every rank), so
shards of ranks that died before logging are the expected ones.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from training.sampler import ResumableGlobalBatchSampler, ids_hash

REFERENCE_MISMATCH = "differ from the fault-free reference"
"""Words of the problem raised when the final digest differs from the reference's (the report may set
it aside as rounding)."""


@dataclass
class Verdict:
    steps: int
    committed: int = 0
    duplicates: int = 0
    missing: int = 0
    extra: int = 0
    epochs_checked: int = 0
    replayed_steps: int = 0
    world_sizes: list[int] = field(default_factory=list)
    final_digests: list[str] = field(default_factory=list)
    bit_identical: bool | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems and self.bit_identical is not False

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def verify_ledger(records: list[dict[str, Any]], sampler: ResumableGlobalBatchSampler, steps: int,
                  reference_digest: str | None = None, reference_world_size: int | None = None) -> Verdict:
    """Check a run's ledger; `reference_*` enable the bit-identical check."""
    verdict = Verdict(steps=steps)
    commits: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        if record["kind"] == "step":
            commits[record["step"]][record["generation"]].append(record)
    trained_by_epoch: dict[int, list[int]] = defaultdict(list)
    sizes = []
    for step in range(steps):
        if step not in commits:
            verdict.problems.append(f"step {step} was never committed (skipped)")
            continue
        verdict.committed += 1
        verdict.replayed_steps += len(commits[step]) - 1
        generation = max(commits[step])
        verdict.problems += _check_step(step, commits[step][generation], sampler, trained_by_epoch)
        sizes.append(commits[step][generation][0]["world_size"])
    extra_steps = sorted(s for s in commits if s >= steps)
    if extra_steps:
        verdict.problems.append(f"steps beyond the run were committed: {extra_steps[:5]}")
    verdict.world_sizes = sorted(set(sizes))
    owed_steps: dict[int, int] = defaultdict(int)
    for step in range(steps):
        owed_steps[sampler.state(step).epoch] += 1
    for epoch, count in sorted(owed_steps.items()):
        _count_epoch(verdict, epoch, trained_by_epoch.get(epoch, []), count, sampler)
    _check_final(verdict, records, reference_digest, reference_world_size, sizes[-1] if sizes else None)
    return verdict


def _check_step(step: int, records: list[dict[str, Any]], sampler: ResumableGlobalBatchSampler,
                trained_by_epoch: dict[int, list[int]]) -> list[str]:
    problems = []
    world = records[0]["world_size"]
    if any(r["world_size"] != world for r in records):
        problems.append(f"step {step}: ranks disagree on the world size {sorted({r['world_size'] for r in records})}")
    expected_window = sampler.window(step)
    by_rank: dict[int, list[int]] = {}
    for record in records:
        if record["rank"] in by_rank:
            problems.append(f"step {step}: rank {record['rank']} committed it twice in generation "
                            f"{record['generation']}")
        by_rank[record["rank"]] = list(record["shard_ids"])
        if record["window_hash"] != ids_hash(expected_window):
            problems.append(f"step {step}: rank {record['rank']} trained window {record['window_hash']}, "
                            f"expected {ids_hash(expected_window)}")
        expected = sampler.shard(step, record["rank"], world).tolist()
        if record["shard_ids"] != expected:
            problems.append(f"step {step}: rank {record['rank']} of {world} trained the wrong shard "
                            f"({len(record['shard_ids'])} ids, first {record['shard_ids'][:3]}; expected "
                            f"first {expected[:3]})")
    epoch = sampler.state(step).epoch
    for rank in range(world):
        ids = by_rank.get(rank)
        trained_by_epoch[epoch] += ids if ids is not None else sampler.shard(step, rank, world).tolist()
    return problems


def _count_epoch(verdict: Verdict, epoch: int, ids: list[int], owed_steps: int,
                 sampler: ResumableGlobalBatchSampler) -> None:
    """Compare what an epoch trained with what it owed (all of it, or the steps the run reached)."""
    everything = sampler.permutation(epoch)[: sampler.steps_per_epoch * sampler.global_batch].tolist()
    owed = set(everything[: owed_steps * sampler.global_batch])
    counts = Counter(ids)
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    extra = sum(1 for i in counts if i not in owed)
    missing = len(owed - set(counts))
    if owed_steps == sampler.steps_per_epoch:
        verdict.epochs_checked += 1
    verdict.duplicates += duplicates
    verdict.missing += missing
    verdict.extra += extra
    if duplicates or missing or extra:
        verdict.problems.append(f"epoch {epoch}: {duplicates} duplicated, {missing} missing, {extra} extra samples")


def _check_final(verdict: Verdict, records: list[dict[str, Any]], reference_digest: str | None,
                 reference_world_size: int | None, final_world_size: int | None) -> None:
    finals = [r for r in records if r["kind"] == "final" and r["step"] == verdict.steps]
    verdict.final_digests = sorted({r["digest"] for r in finals})
    if not finals:
        verdict.problems.append("no rank reported final parameters (the run did not complete)")
        return
    if len(verdict.final_digests) > 1:
        verdict.problems.append(f"ranks finished with different parameters: {verdict.final_digests}")
    if reference_digest is None:
        return
    if len(verdict.world_sizes) == 1 and verdict.world_sizes[0] == reference_world_size:
        verdict.bit_identical = verdict.final_digests == [reference_digest]
        if not verdict.bit_identical:
            verdict.problems.append(f"final parameters {verdict.final_digests} {REFERENCE_MISMATCH} "
                                    f"{reference_digest} at the same world size")
    else:
        verdict.bit_identical = None  # the world size changed: divergence is expected, and reported
