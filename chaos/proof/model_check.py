"""The model check: is the run's model what a fault-free run of the same schedule makes?

Every run is checked, whatever happened to its world size. The expected model comes from a fault-free run with the
same world size at every step: the cached real reference when the run kept the reference's size throughout,
otherwise `chaos.proof.replay` (the run's own schedule replayed in one process). Compared: the final parameters
(`final_params.pt`, which must match the digest the ranks reported) tensor by tensor, and every committed step's
loss on every rank: a loss that departs fails the run, named by the first step where it shows. Exact (`torch.equal`,
every parameter and buffer) wherever the arithmetic is fixed: the fixed-order reduction (training's default) at any
world size, DDP's built-in all-reduce up to 2 ranks. A run that used the built-in all-reduce with 3+ ranks is held
to `TOLERANCE_RELATIVE_L2` over its floating-point parameters, and over its floating-point buffers apart; integer
buffers must be equal. The gradient reduction is the scenario's, and every generation's ranks must have used it.
A check that cannot be made is a problem, never a pass.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from chaos.proof.expected import DataExpectation
from chaos.proof.lineage import effective_generations
from chaos.proof.replay import StepPlan, replay
from chaos.proof.verify import Verdict
from training.config import TrainConfig
from training.models import build_model
from training.state import state_digest

TOLERANCE_RELATIVE_L2 = 1e-5
"""Final floating-point parameters this close (L2 of the difference / L2 of the expected, over the parameters only)
pass when the run's arithmetic is not exact (DDP's built-in all-reduce on 3+ ranks): far above what gloo's summation
order moves a run, far below what a planted bug (an optimizer step applied twice) moves one. Floating-point buffers
(BatchNorm's running statistics) are held to the same bound apart."""
LOSS_RELATIVE_TOLERANCE = 1e-4


@dataclass
class ExpectedModel:
    """A fault-free run's outcome: final digest, parameters and per-step, per-rank losses."""

    source: str
    """"reference" (the real fault-free run) or "replay"."""
    digest: str
    state: dict[str, torch.Tensor] | None
    losses: dict[int, dict[int, float]]
    seconds: float = 0.0


@dataclass
class ModelCheck:
    checked: bool = False
    bit_identical: bool | None = None
    exact: bool = True
    """Whether the run's arithmetic allows a bit-identical comparison (else the tolerance applies)."""
    tolerance_relative_l2: float | None = None
    within_tolerance: bool | None = None
    expected_from: str | None = None
    first_divergence: dict[str, Any] | None = None
    param_l2: float | None = None
    param_l2_relative: float | None = None
    """Over the floating-point parameters."""
    buffer_l2_relative: float | None = None
    """Over the floating-point buffers (None: the model has none)."""
    differing: list[str] = field(default_factory=list)
    """The tensors that are not equal to the expected ones."""
    replay_s: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.checked and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def step_plan(records: list[dict[str, Any]], verdict: Verdict,
              reduction: str | None = None) -> tuple[list[StepPlan], list[str]]:
    """How the run committed each step: world size, gradient reduction and each rank's threads; `reduction`: the
    gradient reduction the scenario asks for, which every generation's ranks must have recorded (None: any)."""
    lines: dict[int, dict[int, dict[str, Any]]] = {}
    effective = effective_generations(records)
    for r in records:
        if r["kind"] == "generation":
            lines.setdefault(r["generation"], {})[r["rank"]] = r
    plan, problems = [], []
    for step in range(verdict.steps):
        if step not in effective:
            return [], [f"step {step} was never committed"]
        generation = effective[step]
        ranks = lines.get(generation, {})
        world = verdict.schedule[step]
        reductions = {line.get("grad_reduction") for line in ranks.values()}
        if len(reductions) != 1 or None in reductions:
            return [], [f"generation {generation}: its ranks did not record one gradient reduction ({reductions})"]
        if reduction is not None and reductions != {reduction}:
            return [], [f"generation {generation}: its ranks recorded the gradient reduction {reductions.pop()!r}, "
                        f"the scenario asks for {reduction!r}"]
        threads = tuple(ranks[r].get("threads", 0) if r in ranks else 0 for r in range(world))
        if 0 in threads:
            # a rank without a generation line is already a ledger problem; replay it like rank 0
            known = [t for t in threads if t]
            threads = tuple(t or (known[0] if known else torch.get_num_threads()) for t in threads)
        devices = {line.get("device", "cpu") for line in ranks.values()}  # ledgers from before devices: the CPU
        if len(devices) != 1:
            return [], [f"generation {generation}: its ranks trained on different devices ({sorted(devices)})"]
        plan.append(StepPlan(world, reductions.pop(), threads, devices.pop()))
    return plan, problems


def run_losses(records: list[dict[str, Any]]) -> dict[int, dict[int, float]]:
    """Per step, each rank's loss as the generation whose commit of it the final model carries recorded it
    (chaos.proof.lineage)."""
    best = effective_generations(records)
    losses: dict[int, dict[int, float]] = {}
    for r in records:
        if r["kind"] == "step" and r["generation"] == best[r["step"]]:
            losses.setdefault(r["step"], {})[r["rank"]] = r["loss"]
    return losses


def expected_model(config: TrainConfig, plan: list[StepPlan], reference: ExpectedModel | None,
                   reference_plan: list[StepPlan] | None, expect: DataExpectation | None = None) -> ExpectedModel:
    """The reference when it ran this very schedule, else a replay of it."""
    if reference is not None and reference_plan is not None and _same_arithmetic(plan, reference_plan):
        return reference
    result = replay(config, plan, expect)
    losses = {step: dict(enumerate(per_rank)) for step, per_rank in enumerate(result.losses)}
    return ExpectedModel("replay", result.digest, result.state, losses, result.seconds)


def _same_arithmetic(a: list[StepPlan], b: list[StepPlan]) -> bool:
    return len(a) == len(b) and all(x.world_size == y.world_size and x.reduction == y.reduction
                                    and x.threads == y.threads and x.device == y.device
                                    for x, y in zip(a, b, strict=True))


def exact_arithmetic(plan: list[StepPlan]) -> bool:
    """Whether a replay of `plan` can match a real run bit for bit (see the module docstring)."""
    return all(p.reduction == "fixed" or p.world_size <= 2 for p in plan)


def parameter_names(config: TrainConfig, expect: DataExpectation | None = None) -> frozenset[str]:
    """The names of `config`'s model's state_dict that are parameters (the others are buffers). The model is built
    on the meta device (no memory) and the random generator is left as it was."""
    expect = expect or DataExpectation(config.dataset, config.global_batch, config.seed)
    dataset = expect.dataset
    shape, classes = tuple(dataset[0][0].shape), dataset.classes  # type: ignore[attr-defined]
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = build_model(config.model, shape, classes, config.seed)
    return frozenset(name for name, _ in model.named_parameters())


@dataclass
class StateComparison:
    """Two final states, tensor by tensor (compare_states)."""

    differing: list[str]
    """Tensors not equal (dtype, shape or any element)."""
    integers_differ: list[str]
    """Of those, the integer tensors (a count, which no reduction order moves)."""
    param_l2: float | None
    param_l2_relative: float | None
    """Over the floating-point parameters."""
    buffer_l2_relative: float | None
    """Over the floating-point buffers (None: there are none)."""

    def within(self, tolerance: float) -> bool:
        """Integer tensors equal, floating-point parameters and buffers each within `tolerance` (relative L2)."""
        return (not self.integers_differ and self.param_l2_relative is not None
                and self.param_l2_relative <= tolerance and (self.buffer_l2_relative or 0.0) <= tolerance)


def compare_states(run: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                   parameters: frozenset[str]) -> StateComparison:
    """`run` against `expected` (the same keys: check first); `parameters`: the names that are parameters."""
    differing = [k for k in expected if not _equal(run[k], expected[k])]
    floats = {k for k, v in expected.items() if v.is_floating_point()}
    param_l2, param_relative = parameter_l2(run, expected, floats & parameters)
    buffers = floats - parameters
    return StateComparison(differing, [k for k in differing if k not in floats], param_l2, param_relative,
                           parameter_l2(run, expected, buffers)[1] if buffers else None)


def check_model(records: list[dict[str, Any]], verdict: Verdict, plan: list[StepPlan], expected: ExpectedModel,
                final_params: Path, parameters: frozenset[str]) -> ModelCheck:
    """Compare the run with the expected model (see the module docstring); `parameters`: the state_dict's names
    that are parameters (parameter_names)."""
    check = ModelCheck(expected_from=expected.source,
                       replay_s=round(expected.seconds, 2) if expected.source == "replay" else None)
    check.exact = exact_arithmetic(plan)
    if not check.exact:
        check.tolerance_relative_l2 = TOLERANCE_RELATIVE_L2
    if not verdict.final_digests:
        check.problems.append("model not checked: no rank reported its final parameters")
        return check
    run_state, problem = read_final_params(final_params, verdict.final_digests)
    if problem is not None:
        check.problems.append(problem)
    if run_state is None or expected.state is None:
        if expected.state is None:
            check.problems.append(f"model not checked: the fault-free {expected.source} has no final parameters")
        return check
    if run_state.keys() != expected.state.keys():
        check.problems.append(f"model not checked: the final state holds other tensors than the fault-free "
                              f"{expected.source} (run only: {sorted(run_state.keys() - expected.state.keys())[:3]}, "
                              f"{expected.source} only: {sorted(expected.state.keys() - run_state.keys())[:3]})")
        return check
    check.checked = True
    compared = compare_states(run_state, expected.state, parameters)
    check.differing = compared.differing
    check.bit_identical = not compared.differing
    check.param_l2, check.param_l2_relative = compared.param_l2, compared.param_l2_relative
    check.buffer_l2_relative = compared.buffer_l2_relative
    check.first_divergence = _first_divergence(run_losses(records), expected.losses, check.exact)
    where = _divergence_text(check.first_divergence)
    if check.exact:
        if not check.bit_identical:
            check.problems.append(f"final parameters differ from the fault-free {expected.source} of the same "
                                  f"schedule in {len(check.differing)} of {len(expected.state)} tensors, e.g. "
                                  f"{check.differing[:3]}{where}")
    else:
        check.within_tolerance = compared.within(TOLERANCE_RELATIVE_L2)
        if compared.integers_differ:
            check.problems.append(f"integer buffers {compared.integers_differ[:3]} differ from the fault-free "
                                  f"{expected.source}: no reduction order moves a count{where}")
        elif not check.within_tolerance:
            check.problems.append(f"final parameters are {check.param_l2_relative} (relative L2; buffers "
                                  f"{check.buffer_l2_relative}) from the fault-free {expected.source}, beyond the "
                                  f"tolerance {TOLERANCE_RELATIVE_L2} for inexact reductions{where}")
    if check.first_divergence is not None and not check.problems:
        check.problems.append(f"the final parameters match, but the run's losses depart from the fault-free "
                              f"{expected.source}{where}")
    return check


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def read_final_params(path: Path, digests: list[str]) -> tuple[dict[str, torch.Tensor] | None, str | None]:
    """Rank 0's final parameters (`final_params.pt`), and why they are not the ranks' own when they are not: the
    file is missing or unreadable (no parameters then), or holds other parameters than the ranks reported."""
    if not path.is_file():
        return None, f"model not fully checked: {path} (rank 0's final parameters) is missing"
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # unreadable evidence is a problem, named
        return None, f"model not fully checked: {path} cannot be read ({exc})"
    digest = state_digest(state)
    if digest not in digests:
        return state, f"{path.name} holds other parameters than the ranks reported ({digest} vs {digests})"
    return state, None


def parameter_l2(run: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                 names: set[str] | frozenset[str] | None = None) -> tuple[float | None, float | None]:
    """L2 of the difference of two states over `names` (None: every tensor), and that relative to `expected`'s L2
    over them (None, None: the states hold other keys)."""
    if run.keys() != expected.keys():
        return None, None
    keys = [k for k in expected if names is None or k in names]
    total = sum(float((run[k].double() - expected[k].double()).pow(2).sum()) for k in keys)
    norm = math.sqrt(sum(float(expected[k].double().pow(2).sum()) for k in keys))
    return round(math.sqrt(total), 10), (float(f"{math.sqrt(total) / norm:.3g}") if norm else None)


def _first_divergence(run: dict[int, dict[int, float]], expected: dict[int, dict[int, float]],
                      exact: bool) -> dict[str, Any] | None:
    for step in sorted(expected):
        for rank, want in sorted(expected[step].items()):
            got = run.get(step, {}).get(rank)
            if got is None:
                continue  # a missing record is the ledger check's problem
            same = got == want if exact else abs(got - want) <= LOSS_RELATIVE_TOLERANCE * max(abs(want), 1e-12)
            if not same:
                return {"step": step, "rank": rank, "loss": got, "expected_loss": want}
    return None


def _divergence_text(divergence: dict[str, Any] | None) -> str:
    if divergence is None:
        return ""
    return (f"; the losses first differ at step {divergence['step']} (rank {divergence['rank']}: "
            f"{divergence['loss']!r} vs {divergence['expected_loss']!r})")
