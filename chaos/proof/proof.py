"""The verifier's two checks together, for any directory of ledgers: data exactly once, model right.

`chaos.report.report` uses it for scenario runs; tests and users can call it on any run of
`python -m training` whose ledgers they kept (`--log-dir`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chaos.proof.expected import DataExpectation
from chaos.proof.model_check import (
    ExpectedModel,
    ModelCheck,
    check_model,
    expected_model,
    parameter_names,
    step_plan,
)
from chaos.proof.replay import StepPlan
from chaos.proof.verify import Verdict, verify_ledger
from training.config import TrainConfig
from training.ledger import LedgerScan, scan_ledgers

FINAL_PARAMS = "final_params.pt"


@dataclass
class Proof:
    verdict: Verdict
    model: ModelCheck
    scan: LedgerScan

    @property
    def problems(self) -> list[str]:
        return self.verdict.problems + self.model.problems

    @property
    def passed(self) -> bool:
        return not self.problems and self.model.passed


def prove(logs: Path, config: TrainConfig, steps: int, *, dead_pids: set[int] | None = None,
          reference: tuple[ExpectedModel, list[StepPlan]] | None = None,
          expect: DataExpectation | None = None) -> Proof:
    """Verify the ledgers under `logs` (rank 0 leaves `final_params.pt` there) against `config`.

    Args:
        reference: a verified fault-free run (its model and schedule), used when the run kept its
            schedule; otherwise the run's schedule is replayed.
    """
    expect = expect or DataExpectation(config.dataset, config.global_batch, config.seed)
    scan = scan_ledgers(logs)
    verdict = verify_ledger(scan, expect, steps, dead_pids, config_hash=config.config_hash())
    return Proof(verdict, _model(scan, verdict, config, expect, reference, logs / FINAL_PARAMS), scan)


def _model(scan: LedgerScan, verdict: Verdict, config: TrainConfig, expect: DataExpectation,
           reference: tuple[ExpectedModel, list[StepPlan]] | None, final_params: Path) -> ModelCheck:
    if verdict.committed != verdict.steps:
        return ModelCheck(problems=[f"model not checked: only {verdict.committed} of {verdict.steps} steps were "
                                    f"committed"])
    plan, problems = step_plan(scan.records, verdict, config.grad_reduction)
    if problems:
        return ModelCheck(problems=[f"model not checked: {p}" for p in problems])
    ref_model, ref_plan = reference if reference is not None else (None, None)
    try:
        expected = expected_model(config, plan, ref_model, ref_plan, expect)
    except ValueError as exc:  # a replay that cannot be made (chaos.proof.replay): a failure, with its reason
        return ModelCheck(problems=[f"model not checked: {exc}"])
    return check_model(scan.records, verdict, plan, expected, final_params, parameter_names(config, expect))
