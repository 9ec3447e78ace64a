"""The verifier's ledger checks: every sample trained exactly once, and the evidence is complete.

It compares each committed step's records (the commit the final model carries: chaos.proof.lineage) with
`chaos.proof.expected`, written from the specification apart from the sampler: the ids that came back with each
rank's batch and a digest of the bytes it fed the model, re-read from the dataset here. It checks the generation
lines against the steps committed (a re-committed step follows a generation that started at or before it, and a
generation's steps run contiguously from its start), and counts duplicated, missing and extra samples per epoch.
Missing evidence is a problem, never filled in. The one gap a fault explains is the step a generation ended on:
ranks one step short of its last step are expected (a peer died inside the collective), and their shard counts as
trained, because the all-reduce that let any rank commit included every rank's gradient.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos.proof.expected import DataExpectation
from chaos.proof.lineage import effective_generations
from training.ledger import LedgerScan


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
    schedule: list[int] = field(default_factory=list)
    """The world size that committed each step (what the model check replays)."""
    final_digests: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


@dataclass
class _Generation:
    """What the ranks of one generation said when they started it."""

    number: int
    lines: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its generation line
    steps: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))  # rank -> committed steps
    # step -> when its ranks committed it (one host's clock)
    monos: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))

    @property
    def world_size(self) -> int | None:
        sizes = {line["world_size"] for line in self.lines.values()}
        return sizes.pop() if len(sizes) == 1 else None

    @property
    def start_step(self) -> int | None:
        starts = {line["start_step"] for line in self.lines.values()}
        return starts.pop() if len(starts) == 1 else None

    @property
    def members(self) -> list[int]:
        for line in self.lines.values():
            return list(line["members"])
        return []

    def committed(self) -> set[int]:
        return set().union(*self.steps.values()) if self.steps else set()


def verify_ledger(scan: LedgerScan, expect: DataExpectation, steps: int, dead_pids: set[int] | None = None,
                  config_hash: str | None = None) -> Verdict:
    """Check a run's ledger (see the module docstring).

    Args:
        dead_pids: processes known to have died abnormally (a torn last line of theirs is expected).
        config_hash: the configuration the run must have trained (None: not checked here).
    """
    verdict = Verdict(steps=steps)
    verdict.problems += _torn_lines(scan, dead_pids or set())
    generations: dict[int, _Generation] = {}
    commits: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for record in scan.records:
        if record["kind"] == "generation":
            gen = generations.setdefault(record["generation"], _Generation(record["generation"]))
            if record["rank"] in gen.lines:
                verdict.problems.append(f"generation {record['generation']}: rank {record['rank']} started it "
                                        f"twice (slots {gen.lines[record['rank']]['slot']} and {record['slot']})")
            gen.lines[record["rank"]] = record
            if config_hash is not None and record.get("config_hash") != config_hash:
                verdict.problems.append(f"generation {record['generation']}: rank {record['rank']} trained "
                                        f"configuration {record.get('config_hash')}, the scenario's is {config_hash}")
        elif record["kind"] == "step":
            commits[record["step"]][record["generation"]].append(record)
            generations.setdefault(record["generation"], _Generation(record["generation"]))
            generations[record["generation"]].steps[record["rank"]].add(record["step"])
            generations[record["generation"]].monos[record["step"]].append(record["mono"])
    verdict.problems += _check_generations(generations)
    verdict.problems += _check_generation_order(generations)
    carried = effective_generations(scan.records)  # the commit of each step the final model carries
    trained: dict[int, list[int]] = defaultdict(list)
    for step in range(steps):
        if step not in commits:
            verdict.problems.append(f"step {step} was never committed (skipped)")
            continue
        verdict.committed += 1
        verdict.replayed_steps += len(commits[step]) - 1
        number = carried[step]
        gen = generations[number]
        world = gen.world_size or commits[step][number][0]["world_size"]
        verdict.schedule.append(world)
        verdict.problems += _check_step(step, gen, world, commits[step][number], expect, trained)
    extra_steps = sorted(s for s in commits if s >= steps)
    if extra_steps:
        verdict.problems.append(f"steps beyond the run were committed: {extra_steps[:5]}")
    verdict.world_sizes = sorted(set(verdict.schedule))
    owed: Counter[int] = Counter(expect.epoch_of(step) for step in range(steps))
    for epoch in sorted(owed):
        _count_epoch(verdict, epoch, trained.get(epoch, []), owed[epoch], expect)
    _check_final(verdict, scan.records)
    return verdict


def _torn_lines(scan: LedgerScan, dead_pids: set[int]) -> list[str]:
    problems = []
    for torn in scan.torn:
        if torn.last and torn.pid in dead_pids:
            continue  # killed inside its write: the line was never committed
        where = "its last line" if torn.last else "a line in the middle"
        why = "and that process is not known to have died" if torn.last else "(only a death mid-write tears a line)"
        problems.append(f"ledger {torn.path.name}: line {torn.line} is torn ({where}) {why}")
    return problems


def _check_generations(generations: dict[int, _Generation]) -> list[str]:
    """Every generation that committed steps was started by each member, from a consistent state,
    and committed its steps contiguously from its start (a replay follows a rollback)."""
    problems = []
    for number, gen in sorted(generations.items()):
        committed = gen.committed()
        if not committed:
            continue
        if not gen.lines:
            problems.append(f"generation {number} committed steps {_span(committed)}, but no rank recorded "
                            f"starting it (missing generation lines)")
            continue
        world, start = gen.world_size, gen.start_step
        if world is None or start is None:
            problems.append(f"generation {number}: its ranks disagree on the world size or start step "
                            f"{sorted((r, s['world_size'], s['start_step']) for r, s in gen.lines.items())}")
            continue
        members = gen.members
        for rank in range(world):
            if rank not in gen.lines:
                slot = members[rank] if rank < len(members) else "?"
                problems.append(f"generation {number} committed steps {_span(committed)}, but rank {rank} "
                                f"(slot {slot}) left no record of it (a missing or truncated ledger)")
        if min(committed) < start:
            problems.append(f"generation {number} started at step {start} but committed step {min(committed)}: "
                            f"a replay that no rollback explains")
        expected = set(range(start, max(committed) + 1))
        if committed != expected:
            problems.append(f"generation {number} started at step {start} and skipped steps "
                            f"{_span(expected - committed)} of the steps it committed")
    return problems


def _check_generation_order(generations: dict[int, _Generation]) -> list[str]:
    """Generation numbers are unique and increase with time, across store restarts too: every step of a
    generation was committed before any step of a higher-numbered one (a number decided twice, or a
    restarted store that reused a lower number, shows as steps out of order). A chaos run's ranks share
    one host, so their monotonic clocks compare.

    A step is committed when its collectives completed, so when its first rank wrote it: a member stopped right
    after them (a node partitioned, then healed) writes its line when it runs again, seconds into the next
    generation, and that late line of a step its peers committed in time orders nothing."""
    trained = sorted((n, min(min(m) for m in g.monos.values()), min(g.monos[max(g.monos)]))
                     for n, g in generations.items() if g.monos)
    return [f"generation {later} committed a step at mono {first:.3f}, before generation {earlier}'s last step at "
            f"{last:.3f}: generation numbers must increase with time"
            for (earlier, _, last), (later, first, _) in zip(trained, trained[1:], strict=False) if first < last]


def _check_step(step: int, gen: _Generation, world: int, records: list[dict[str, Any]], expect: DataExpectation,
                trained: dict[int, list[int]]) -> list[str]:
    problems = []
    epoch = expect.epoch_of(step)
    by_rank: dict[int, dict[str, Any]] = {}
    for record in records:
        rank = record["rank"]
        if record["world_size"] != world:
            problems.append(f"step {step}: rank {rank} recorded world size {record['world_size']}, its "
                            f"generation {gen.number} has {world}")
        if rank in by_rank:
            problems.append(f"step {step}: rank {rank} committed it twice in generation {gen.number}")
        by_rank[rank] = record
    last_of_generation = step == max(gen.committed())
    for rank in range(world):
        expected = expect.shard(step, rank, world)
        if expected is None:
            problems.append(f"step {step}: world size {world} cannot split global batch {expect.global_batch}")
            return problems
        record = by_rank.get(rank)
        if record is None:
            if last_of_generation:
                trained[epoch] += expected  # a peer died inside this step's collectives (module docstring)
            else:
                problems.append(f"step {step}: rank {rank} of generation {gen.number} left no record, yet the "
                                f"generation went on past it (missing evidence)")
            continue
        ids = list(record["shard_ids"])
        if ids != expected:
            problems.append(f"step {step}: rank {rank} of {world} trained ids {_ids(ids)}, expected {_ids(expected)}")
        elif record.get("batch_hash") != expect.batch_hash(ids):
            problems.append(f"step {step}: rank {rank} fed the model other bytes than samples {_ids(ids)} hold "
                            f"(batch digest {record.get('batch_hash')}, expected {expect.batch_hash(ids)})")
        trained[epoch] += ids
    return problems


def _count_epoch(verdict: Verdict, epoch: int, ids: list[int], owed_steps: int, expect: DataExpectation) -> None:
    """Compare what an epoch trained with what it owed (all of it, or the steps the run reached)."""
    owed = set(expect.epoch_samples(epoch)[: owed_steps * expect.global_batch])
    counts = Counter(ids)
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    extra = sum(1 for i in counts if i not in owed)
    missing = len(owed - set(counts))
    if owed_steps == expect.steps_per_epoch:
        verdict.epochs_checked += 1
    verdict.duplicates += duplicates
    verdict.missing += missing
    verdict.extra += extra
    if duplicates or missing or extra:
        verdict.problems.append(f"epoch {epoch}: {duplicates} duplicated, {missing} missing, {extra} extra samples")


def _check_final(verdict: Verdict, records: list[dict[str, Any]]) -> None:
    finals = [r for r in records if r["kind"] == "final" and r["step"] == verdict.steps]
    verdict.final_digests = sorted({r["digest"] for r in finals})
    if not finals:
        verdict.problems.append("no rank reported final parameters (the run did not complete)")
    elif len(verdict.final_digests) > 1:
        verdict.problems.append(f"ranks finished with different parameters: {verdict.final_digests}")


def _span(steps: set[int]) -> str:
    ordered = sorted(steps)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return str(ordered[:8]) + (" ..." if len(ordered) > 8 else "")


def _ids(ids: list[int]) -> str:
    return f"{ids[:3]}{'...' if len(ids) > 3 else ''} ({len(ids)} ids)"
