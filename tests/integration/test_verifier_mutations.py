"""The verifier cannot be fooled: real run directories, tampered, and real planted training bugs, all FAIL.

One real `kill-boundary` run (real processes, a real SIGKILL-like exit) is made once; each test copies
its directory, damages it the way a bug, a lost file or a forger would, and runs `chaos verify` on
the copy. Every damage must fail the verdict with a problem line that names it. The planted bug
(chaos.run.planted, through chaos's training hook) runs whole scenarios with one optimizer step
applied twice after a resume.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import chaos.report.reference
from chaos.cli import _verify_or_report, main, run_scenario
from chaos.errors import ReferenceUnusable
from chaos.report.reference import reference_dir, summarize_reference
from chaos.run.planted import DOUBLE_STEP_AFTER_RESUME, PLANTED_BUG_ENV
from chaos.scenario import load

pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def good_run(reference_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mutations") / "kill-boundary"
    report = run_scenario("kill-boundary", out, quiet=True)
    assert report["verdict"] == "pass", report["problems"]
    return out


@pytest.fixture
def copy_of(good_run: Path, tmp_path: Path) -> Iterator[Callable[[], Path]]:
    def make() -> Path:
        target = tmp_path / "run"
        shutil.copytree(good_run, target)
        return target

    yield make


def ledger_lines(run: Path) -> dict[Path, list[dict[str, Any]]]:
    paths = sorted((run / "logs").glob("ledger-*"))
    return {p: [json.loads(line) for line in p.read_text().splitlines()] for p in paths}


def rewrite(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def fails_naming(run: Path, *words: str) -> dict[str, Any]:
    report = _verify_or_report(run, write=False)
    assert report["verdict"] == "fail", "the tampered run passed"
    text = "\n".join(report["problems"])
    assert all(w in text for w in words), text
    assert main(["verify", str(run)]) == 1
    return report


def test_the_untouched_run_verifies(good_run: Path, copy_of: Callable[[], Path]) -> None:
    report = _verify_or_report(copy_of(), write=False)
    assert report["verdict"] == "pass", report["problems"]
    assert report["model_check"]["bit_identical"] is True


def test_replaced_final_model_fails(copy_of: Callable[[], Path]) -> None:
    run = copy_of()
    params = run / "logs" / "final_params.pt"
    state = torch.load(params, weights_only=True)
    torch.save({k: v + 0.01 if v.is_floating_point() else v for k, v in state.items()}, params)
    fails_naming(run, "final_params.pt holds other parameters than the ranks reported")


def test_forged_final_model_and_digests_fail_the_model_check(copy_of: Callable[[], Path]) -> None:
    """A forger who changes the parameters *and* every digest the ranks reported still fails."""
    from training.state import state_digest

    run = copy_of()
    params = run / "logs" / "final_params.pt"
    forged = {k: v * 1.001 if v.is_floating_point() else v for k, v in torch.load(params, weights_only=True).items()}
    torch.save(forged, params)
    for path, records in ledger_lines(run).items():
        rewrite(path, [{**r, "digest": state_digest(forged)} if r["kind"] == "final" else r for r in records])
    report = fails_naming(run, "differ from the fault-free reference")
    assert report["model_check"]["bit_identical"] is False


def test_a_deleted_ledger_fails(copy_of: Callable[[], Path]) -> None:
    run = copy_of()
    victim = next(p for p, records in ledger_lines(run).items() if any(r["kind"] == "step" and r["rank"] == 1
                                                                        for r in records))
    victim.unlink()
    fails_naming(run, "rank 1", "left no record")


def test_steps_replayed_without_a_rollback_fail(copy_of: Callable[[], Path]) -> None:
    """Steps 40-44 committed again in a new generation that says it started at step 45."""
    run = copy_of()
    path, records = next(iter(ledger_lines(run).items()))
    top = max(r["generation"] for r in records if "generation" in r)
    start = next(r for r in records if r["kind"] == "generation")
    replay = [{**start, "generation": top + 1, "start_step": 45, "mono": 1e9}]
    replay += [{**r, "generation": top + 1, "mono": 1e9 + r["step"]} for r in records
               if r["kind"] == "step" and 40 <= r["step"] < 45]
    rewrite(path, records + replay)
    fails_naming(run, f"generation {top + 1} started at step 45 but committed step 40",
                 "a replay that no rollback explains")


def test_a_swapped_sample_id_fails(copy_of: Callable[[], Path]) -> None:
    run = copy_of()
    path, records = next(iter(ledger_lines(run).items()))
    target = next(r for r in records if r["kind"] == "step" and r["step"] == 12)
    target["shard_ids"] = [target["shard_ids"][1], target["shard_ids"][0], *target["shard_ids"][2:]]
    rewrite(path, records)
    fails_naming(run, f"step 12: rank {target['rank']} of 2 trained ids")


def test_a_torn_line_in_the_middle_fails(copy_of: Callable[[], Path]) -> None:
    run = copy_of()
    path = next(iter(ledger_lines(run)))
    lines = path.read_text().splitlines()
    lines[3] = lines[3][: len(lines[3]) // 2]
    path.write_text("\n".join(lines) + "\n")
    fails_naming(run, f"{path.name}: line 4 is torn (a line in the middle)")


def test_a_run_that_did_not_complete_fails_on_verify_too(copy_of: Callable[[], Path]) -> None:
    run = copy_of()
    outcome = json.loads((run / "outcome.json").read_text())
    outcome.update(completed=False, error="launchers exited with {0: 3}")
    (run / "outcome.json").write_text(json.dumps(outcome))
    fails_naming(run, "the run did not complete: launchers exited with {0: 3}")
    (run / "outcome.json").unlink()
    fails_naming(run, "the run's outcome is unknown")


def test_a_fault_that_reached_no_process_fails(copy_of: Callable[[], Path]) -> None:
    run = copy_of()
    (run / "faults.jsonl").write_text("")
    fails_naming(run, "planned fault kill-boundary at step 30 (slot 1) never fired")


def test_a_reference_without_its_digest_fails(copy_of: Callable[[], Path]) -> None:
    run = copy_of()
    summary_path = reference_dir(load("kill-boundary")) / "summary.json"
    original = summary_path.read_text()
    try:
        summary = json.loads(original)
        del summary["final_digest"]
        summary_path.write_text(json.dumps(summary))
        fails_naming(run, "the reference cannot be used", "no verified final digest")
    finally:
        summary_path.write_text(original)


@pytest.mark.parametrize("scenario", ["kill-boundary", "elastic"])
def test_a_planted_training_bug_fails_the_run(scenario: str, reference_cache: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """One optimizer step applied twice after a resume: the ledger looks perfect, the ranks agree with
    each other, and the world size changed (elastic): only the model check can see it, and must."""
    monkeypatch.setenv(PLANTED_BUG_ENV, DOUBLE_STEP_AFTER_RESUME)
    report = run_scenario(scenario, tmp_path / scenario, quiet=True)
    assert report["verdict"] == "fail"
    c = report["correctness"]
    assert c["duplicates"] == c["missing"] == c["extra"] == 0  # the data was exactly once
    assert report["model_check"]["checked"] and report["model_check"]["bit_identical"] is False
    assert report["model_check"]["first_divergence"] is not None
    assert any("differ from the fault-free" in p and "the losses first differ at step" in p
               for p in report["problems"]), report["problems"]


ALLREDUCE_ON_THREE = """name = "allreduce-3"
description = "three ranks, DDP's built-in all-reduce (summed in gloo's order), rank 1 killed"
[job]
nproc = 3
steps = 40
global_batch = 24
dataset = "synthetic:768"
step_time = 0.02
ckpt_strategy = "none"
grad_reduction = "allreduce"

[[faults]]
kind = "kill-boundary"
rank = 1
step = 20
"""


def test_ddp_allreduce_on_three_ranks_is_held_to_the_tolerance_and_a_planted_bug_still_fails(
        reference_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No replay sums in gloo's order, so the reference's own replay is held to the model check's tolerance, not
    to a digest: every such scenario failed before its first faulted step ("the replay is not faithful")."""
    spec = tmp_path / "allreduce-3.toml"
    spec.write_text(ALLREDUCE_ON_THREE)
    report = run_scenario(str(spec), tmp_path / "good", quiet=True)
    model = report["model_check"]
    assert report["verdict"] == "pass", report["problems"]
    assert model["checked"] and model["exact"] is False and model["within_tolerance"] is True, model
    assert 0 < model["param_l2_relative"] <= model["tolerance_relative_l2"], model
    # The reference's replay was held to the tolerance, against parameters that are the ones its ranks reported.
    scenario = load(str(spec))
    ref = reference_dir(scenario)
    summary = json.loads((ref / "summary.json").read_text())
    assert summary["replay_exact"] is False and 0 < summary["replay_relative_l2"] <= model["tolerance_relative_l2"]
    with monkeypatch.context() as broken:  # no tolerance at all: this replay is not exact, so it is refused
        broken.setattr(chaos.report.reference, "TOLERANCE_RELATIVE_L2", 0.0)
        with pytest.raises(ReferenceUnusable, match="beyond the tolerance"):
            summarize_reference(ref, scenario, 0.0)
    tampered = tmp_path / "tampered-reference"
    shutil.copytree(ref, tampered)
    params = torch.load(tampered / "logs" / "final_params.pt", weights_only=True)
    torch.save({k: v * 1.0000001 if v.is_floating_point() else v for k, v in params.items()},
               tampered / "logs" / "final_params.pt")
    with pytest.raises(ReferenceUnusable, match="not the parameters its ranks reported"):
        summarize_reference(tampered, scenario, 0.0)
    monkeypatch.setenv(PLANTED_BUG_ENV, DOUBLE_STEP_AFTER_RESUME)
    report = run_scenario(str(spec), tmp_path / "planted", quiet=True)
    assert report["verdict"] == "fail" and report["model_check"]["within_tolerance"] is False
    assert any("beyond the tolerance" in p for p in report["problems"]), report["problems"]
