"""Imports run one way between the layers (import-linter's contracts in pyproject.toml), and the check can fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.timeout(120)


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=100)


def test_every_layer_imports_only_the_layers_below_it() -> None:
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


@pytest.mark.parametrize(("module", "planted", "contract"), [
    ("ftcoord/protocol/slots.py", "from ftcoord.leader.judge import Judge", "ftcoord's layers"),
    ("ftcoord/store/link.py", "from ftcoord.protocol import keys", "ftcoord's layers"),
    ("chaos/proof/verify.py", "from chaos.run.runner import ChaosRunner", "chaos's layers"),
    ("ftcoord/wrapper/call.py", "import training.ledger", "ftcoord uses neither"),
])
def test_a_lower_layer_importing_a_higher_one_breaks_the_contract(tmp_path: Path, module: str, planted: str,
                                                                  contract: str) -> None:
    for package in ("ftcoord", "training", "chaos"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    # Inside a function, as the lazy imports of this code base are: the contract must see those too.
    target.write_text(target.read_text() + f"\n\ndef _planted() -> None:\n    {planted}  # noqa\n")
    done = _lint(tmp_path)
    assert done.returncode != 0, done.stdout
    broken = [line for line in done.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(contract in line for line in broken), done.stdout
