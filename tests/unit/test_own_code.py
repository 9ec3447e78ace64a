"""A bench's worker processes run the bench's own checkout, in the bench's working directory (chaos.own_code).

Real processes: each test starts a worker and reads what it did.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from chaos.own_code import start_worker
from tests.helpers.decoy import decoy_checkout


@pytest.mark.parametrize("where", ["working directory", "PYTHONPATH"])
def test_a_worker_runs_the_drivers_code_wherever_the_driver_was_started(
        where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker imports the `chaos` and `ftcoord` of the driver's checkout, not the working directory's (`-m` puts it
    first, ahead of PYTHONPATH: an A/B run of two versions started from one checkout timed the same code in both
    arms) nor one named on PYTHONPATH (sabotage: `-m` without `-P` fails the first, PYTHONPATH left as it was the
    second)."""
    other = decoy_checkout(tmp_path / "other", "chaos.scale.worker_events")
    if where == "working directory":
        monkeypatch.chdir(other)
    else:
        monkeypatch.setenv("PYTHONPATH", str(other))
    process = start_worker("chaos.scale.worker_events", ["--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    assert "--first" in out, out  # chaos.scale.worker's usage


def test_a_worker_reads_relative_paths_from_the_drivers_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The paths a bench hands its workers (`--out runs/x`) mean what they meant to the bench: the worker runs where
    it was started (it ran in the checkout before, where `runs/x` is another directory)."""
    monkeypatch.chdir(tmp_path)
    Path("given.json").write_text('{"where": "the driver\'s directory"}')
    process = start_worker("json.tool", ["given.json"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    assert "the driver's directory" in out, out
