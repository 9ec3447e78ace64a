"""A helper process runs the code of the process that starts it (ftcoord.host.interpreter).

Real processes: a trainer started with `-P` from a directory that holds another checkout's `training` saves with the
overlapped and flash strategies, whose writer and persister are processes of their own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.decoy import decoy_checkout
from training.checkpoint import atomic

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]

SAVE = """
import os, sys
from tests.unit.test_checkpoint import make_state
from training.checkpoint.base import make_strategy
ckpt = make_strategy(sys.argv[1], sys.argv[2], config_hash="abc", keep=2, job_id=f"interpreter-{os.getpid()}")
state = make_state(5)
ckpt.save(state, world_size=1)
ckpt.flush()
ckpt.close(finished=True)
print("saved", flush=True)
"""


@pytest.mark.parametrize("strategy", ["overlapped", "flash"])
def test_a_checkpoint_helper_runs_the_trainers_code_wherever_the_trainer_runs(strategy: str, tmp_path: Path) -> None:
    """`python -m` puts the working directory first: a trainer started with `-P` (as `chaos run` starts its ranks)
    in a directory holding another checkout started that checkout's writer (sabotage: the helpers started with a plain
    `-m` fail this with the decoy's message, or a save that never lands)."""
    decoy = decoy_checkout(tmp_path / "other", "training.checkpoint.writer", "training.checkpoint.persister")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-P", "-c", SAVE, strategy, str(tmp_path / "ckpt")], cwd=decoy, env=env,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0 and "saved" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert [step for step, _ in atomic.step_dirs(tmp_path / "ckpt")] == [5]


def test_a_child_gets_the_path_options_of_its_parent() -> None:
    """-P and -I are carried (they decide where a child finds its modules); a plain interpreter, a plain command."""
    code = "from ftcoord.host.interpreter import module_command; print(module_command('m', 'a')[1:])"
    for options, expected in (([], "['-m', 'm', 'a']"), (["-P"], "['-P', '-m', 'm', 'a']")):
        done = subprocess.run([sys.executable, *options, "-c", code], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
        assert done.stdout.strip() == expected, done.stdout + done.stderr
