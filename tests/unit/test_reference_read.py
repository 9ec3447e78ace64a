"""A cached reference is checked each time it is read: a damaged or altered entry is refused, never trusted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from chaos.errors import ReferenceUnusable
from chaos.report.reference import reference_model
from chaos.scenario import load
from training.state import state_digest

pytestmark = pytest.mark.timeout(60)


def cached(tmp_path: Path) -> tuple[Path, dict[str, Any], Any]:
    """A reference entry as ensure_reference leaves it: the summary and rank 0's final parameters."""
    scenario = load("kill-boundary")
    ref = tmp_path / "ref"
    (ref / "logs").mkdir(parents=True)
    state = {"weight": torch.arange(6, dtype=torch.float32).reshape(2, 3), "count": torch.tensor(4)}
    torch.save(state, ref / "logs" / "final_params.pt")
    summary = {"final_digest": state_digest(state), "replay_verified": True, "plan": [[2, "fixed", [1, 1]]],
               "trajectory_key": scenario.job.trajectory_key(), "steps": scenario.job.steps}
    (ref / "summary.json").write_text(json.dumps(summary))
    return ref, summary, scenario


def test_an_intact_reference_is_read(tmp_path: Path) -> None:
    ref, summary, scenario = cached(tmp_path)
    model, plan = reference_model(ref, summary, scenario)
    assert model.digest == summary["final_digest"] and model.state is not None and plan[0].world_size == 2


@pytest.mark.parametrize("damage, says", [
    ("final file altered", "are not the ones it was verified with"),
    ("final file missing", "cannot be read"),
    ("final file torn", "cannot be read"),
    ("digest altered", "are not the ones it was verified with"),
    ("another job's key", "was made for another job"),
    ("other steps", "was made for another job"),
])
def test_a_damaged_reference_is_refused(tmp_path: Path, damage: str, says: str) -> None:
    ref, summary, scenario = cached(tmp_path)
    params = ref / "logs" / "final_params.pt"
    if damage == "final file altered":
        state = torch.load(params, weights_only=True)
        state["weight"][0, 0] += 1e-6
        torch.save(state, params)
    elif damage == "final file missing":
        params.unlink()
    elif damage == "final file torn":
        params.write_bytes(params.read_bytes()[:100])
    elif damage == "digest altered":
        summary["final_digest"] = "0" * len(summary["final_digest"])
    elif damage == "another job's key":
        summary["trajectory_key"] = "someone-else"
    elif damage == "other steps":
        summary["steps"] += 1
    with pytest.raises(ReferenceUnusable, match=says) as refused:
        reference_model(ref, summary, scenario)
    assert f"delete {ref}" in str(refused.value)
