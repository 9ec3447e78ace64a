"""The model check compares every run with a fault-free run of its own schedule, and names a divergence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from chaos.proof.model_check import (
    TOLERANCE_RELATIVE_L2,
    ExpectedModel,
    check_model,
    expected_model,
    parameter_names,
    step_plan,
)
from chaos.proof.replay import StepPlan, replay
from chaos.proof.verify import Verdict
from training.config import TrainConfig
from training.state import state_digest

pytestmark = pytest.mark.timeout(120)

CONFIG = TrainConfig(steps=12, global_batch=12, dataset="synthetic:96", ckpt_strategy="none")
SCHEDULE = [2] * 4 + [1] * 4 + [3] * 4  # an elastic run: 2 -> 1 -> 3 ranks
PARAMS = parameter_names(CONFIG)


def plan_of(schedule: list[int], reduction: str = "fixed") -> list[StepPlan]:
    return [StepPlan(world, reduction, (1,) * world) for world in schedule]


def run_records(schedule: list[int], losses: list[list[float]], reduction: str = "fixed") -> list[dict[str, Any]]:
    """The ledger of a run that trained `schedule`, one generation per world size."""
    records: list[dict[str, Any]] = []
    generation, previous, mono = 0, None, 0.0
    for step, world in enumerate(schedule):
        if world != previous:
            generation, previous = generation + 1, world
            records += [{"kind": "generation", "generation": generation, "rank": r, "world_size": world,
                         "start_step": step, "grad_reduction": reduction, "threads": 1, "mono": mono}
                        for r in range(world)]
        for rank in range(world):
            mono += 1
            records.append({"kind": "step", "step": step, "generation": generation, "rank": rank,
                            "world_size": world, "loss": losses[step][rank], "mono": mono})
    return records


def verdict_of(schedule: list[int], digest: str) -> Verdict:
    return Verdict(steps=len(schedule), committed=len(schedule), schedule=list(schedule), final_digests=[digest])


@pytest.fixture(scope="module")
def elastic() -> Any:
    return replay(CONFIG, plan_of(SCHEDULE))


def test_a_run_that_matches_its_schedule_is_bit_identical(elastic: Any, tmp_path: Path) -> None:
    torch.save(elastic.state, tmp_path / "final_params.pt")
    records = run_records(SCHEDULE, elastic.losses)
    plan, problems = step_plan(records, verdict_of(SCHEDULE, elastic.digest))
    assert not problems and plan == plan_of(SCHEDULE)
    expected = expected_model(CONFIG, plan, None, None)
    assert expected.source == "replay" and expected.digest == elastic.digest  # the replay is deterministic
    check = check_model(records, verdict_of(SCHEDULE, elastic.digest), plan, expected, tmp_path / "final_params.pt",
                        PARAMS)
    assert check.passed and check.bit_identical is True and check.param_l2 == 0.0, check.problems


def test_the_schedule_matters(elastic: Any) -> None:
    """A constant-size run of the same steps ends elsewhere: an elastic run needs its own reference."""
    assert replay(CONFIG, plan_of([2] * 12)).digest != elastic.digest


def test_a_drifted_model_fails_with_its_first_divergent_step(elastic: Any, tmp_path: Path) -> None:
    drifted = {k: v.clone() for k, v in elastic.state.items()}
    next(iter(drifted.values())).add_(1e-3)
    torch.save(drifted, tmp_path / "final_params.pt")
    losses = [list(per_rank) for per_rank in elastic.losses]
    losses[9][1] += 1e-6  # the run's loss first differs at step 9, rank 1
    records = run_records(SCHEDULE, losses)
    check = check_model(records, verdict_of(SCHEDULE, state_digest(drifted)), plan_of(SCHEDULE),
                        expected_model(CONFIG, plan_of(SCHEDULE), None, None), tmp_path / "final_params.pt",
                        PARAMS)
    assert not check.passed and check.bit_identical is False
    assert check.first_divergence is not None and check.first_divergence["step"] == 9
    assert any("losses first differ at step 9 (rank 1" in p for p in check.problems)


def test_final_parameters_that_are_not_what_the_ranks_reported_fail(elastic: Any, tmp_path: Path) -> None:
    other = {k: torch.zeros_like(v) for k, v in elastic.state.items()}
    torch.save(other, tmp_path / "final_params.pt")
    check = check_model(run_records(SCHEDULE, elastic.losses), verdict_of(SCHEDULE, elastic.digest),
                        plan_of(SCHEDULE), expected_model(CONFIG, plan_of(SCHEDULE), None, None),
                        tmp_path / "final_params.pt", PARAMS)
    assert any("final_params.pt holds other parameters than the ranks reported" in p for p in check.problems)


def test_missing_final_parameters_are_a_problem_not_a_pass(elastic: Any, tmp_path: Path) -> None:
    check = check_model(run_records(SCHEDULE, elastic.losses), verdict_of(SCHEDULE, elastic.digest),
                        plan_of(SCHEDULE), expected_model(CONFIG, plan_of(SCHEDULE), None, None),
                        tmp_path / "final_params.pt", PARAMS)
    assert not check.passed and any("final_params.pt" in p and "missing" in p for p in check.problems)


def test_the_reference_is_used_only_for_its_own_schedule(elastic: Any) -> None:
    reference = ExpectedModel("reference", "ref-digest", None, {})
    same = expected_model(CONFIG, plan_of([2] * 12), reference, plan_of([2] * 12))
    assert same is reference
    assert expected_model(CONFIG, plan_of(SCHEDULE), reference, plan_of([2] * 12)).source == "replay"


def test_inexact_reductions_are_held_to_the_stated_tolerance(tmp_path: Path) -> None:
    """DDP's built-in all-reduce with 3 ranks is not exact: a few ulps pass, a real drift does not."""
    schedule = [3] * 6
    config = TrainConfig(steps=6, global_batch=12, dataset="synthetic:96", ckpt_strategy="none",
                         grad_reduction="allreduce")
    result = replay(config, plan_of(schedule, "allreduce"))
    expected = expected_model(config, plan_of(schedule, "allreduce"), None, None)
    for scale, passes in ((1e-7, True), (1e-3, False)):
        moved = {k: v * (1 + scale) if v.is_floating_point() else v for k, v in result.state.items()}
        torch.save(moved, tmp_path / "final_params.pt")
        records = run_records(schedule, result.losses, "allreduce")
        check = check_model(records, verdict_of(schedule, state_digest(moved)), plan_of(schedule, "allreduce"),
                            expected, tmp_path / "final_params.pt", PARAMS)
        assert not check.exact and check.tolerance_relative_l2 == TOLERANCE_RELATIVE_L2
        assert check.passed is passes, (scale, check.problems)


CNN = TrainConfig(steps=80, global_batch=12, dataset="fakedata:96", model="small-cnn", ckpt_strategy="none",
                  grad_reduction="allreduce")
CNN_SCHEDULE = [3] * 80


@pytest.fixture(scope="module")
def cnn() -> Any:
    """The replay of small-cnn on 3 ranks with DDP's all-reduce: the expected model of the runs below."""
    return expected_model(CNN, plan_of(CNN_SCHEDULE, "allreduce"), None, None)


def _check_cnn(cnn: ExpectedModel, state: dict[str, torch.Tensor], tmp_path: Path, losses: Any = None) -> Any:
    torch.save(state, tmp_path / "final_params.pt")
    plan = plan_of(CNN_SCHEDULE, "allreduce")
    per_rank = losses if losses is not None else [[cnn.losses[s][r] for r in range(3)] for s in range(len(plan))]
    records = run_records(CNN_SCHEDULE, per_rank, "allreduce")
    return check_model(records, verdict_of(CNN_SCHEDULE, state_digest(state)), plan, cnn,
                       tmp_path / "final_params.pt", parameter_names(CNN))


def test_the_tolerance_is_over_the_parameters_so_it_means_what_it_says(cnn: Any, tmp_path: Path) -> None:
    """small-cnn's BatchNorm buffers (running_var, num_batches_tracked) weigh in a whole-state L2: a parameter change
    of twice the stated tolerance looked 20 times smaller after 80 steps (1.0e-6). Over the parameters alone, it
    fails."""
    names = parameter_names(CNN)
    assert names and set(cnn.state) - names, "small-cnn has parameters and buffers"
    moved = {k: v * (1 + 2 * TOLERANCE_RELATIVE_L2) if k in names else v for k, v in cnn.state.items()}
    check = _check_cnn(cnn, moved, tmp_path)
    assert not check.passed and check.within_tolerance is False, check
    assert check.param_l2_relative == pytest.approx(2 * TOLERANCE_RELATIVE_L2, rel=1e-2)
    assert any("beyond the tolerance" in p for p in check.problems), check.problems
    within = {k: v * (1 + TOLERANCE_RELATIVE_L2 / 2) if k in names else v for k, v in cnn.state.items()}
    assert _check_cnn(cnn, within, tmp_path).passed


def test_an_integer_buffer_must_be_equal_even_within_the_tolerance(cnn: Any, tmp_path: Path) -> None:
    counted = {k: v + 1 if not v.is_floating_point() else v for k, v in cnn.state.items()}
    check = _check_cnn(cnn, counted, tmp_path)
    assert not check.passed and any("integer buffers" in p and "num_batches_tracked" in p for p in check.problems)


def test_a_loss_that_departs_fails_even_when_the_parameters_match(cnn: Any, tmp_path: Path) -> None:
    losses = [[cnn.losses[s][r] for r in range(3)] for s in range(len(CNN_SCHEDULE))]
    losses[3][2] *= 1.01
    check = _check_cnn(cnn, cnn.state, tmp_path, losses)
    assert not check.passed and check.within_tolerance is True
    assert any("losses depart" in p and "step 3 (rank 2" in p for p in check.problems), check.problems


def test_exact_mode_compares_every_tensor_not_a_digest(elastic: Any, tmp_path: Path) -> None:
    """One buffer or parameter element off by one ulp is a difference, named by its tensor."""
    off = {k: v.clone() for k, v in elastic.state.items()}
    name = next(iter(off))
    off[name].view(-1)[0] = torch.nextafter(off[name].view(-1)[0], torch.tensor(float("inf")))
    torch.save(off, tmp_path / "final_params.pt")
    check = check_model(run_records(SCHEDULE, elastic.losses), verdict_of(SCHEDULE, state_digest(off)),
                        plan_of(SCHEDULE), expected_model(CONFIG, plan_of(SCHEDULE), None, None),
                        tmp_path / "final_params.pt", PARAMS)
    assert not check.passed and check.bit_identical is False and check.differing == [name], check


def test_the_reduction_the_ranks_recorded_must_be_the_scenarios(elastic: Any) -> None:
    records = run_records(SCHEDULE, elastic.losses, "allreduce")
    plan, problems = step_plan(records, verdict_of(SCHEDULE, elastic.digest), "fixed")
    assert not plan and problems == ["generation 1: its ranks recorded the gradient reduction 'allreduce', the "
                                     "scenario asks for 'fixed'"]
