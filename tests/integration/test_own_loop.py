"""A user's own loop (examples/own_loop.py, the DDP tutorial's Trainer): exactly once through a kill of rank 0
and through a world-size change; under torchrun a clear refusal; a missing store said at once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from chaos.proof.samples import check_samples, read_samples
from chaos.report.metrics import read_logs
from ftcoord import StoreServer
from ftcoord.launcher.main import parse_config
from tests.helpers.cluster import REPO, Forker
from tests.helpers.script_runs import CPU, ScriptRun, slot_pid
from tests.helpers.train_runs import child_env
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(240)

SIZE, EPOCHS = 2048, 20  # 32 steps an epoch on 2 ranks (batch 32 each), 64 on one
SCRIPT = "examples/own_loop.py"
STARTS = r"generation (\d+): rank (\d+) of (\d+) at epoch (\d+), sample (\d+) of \d+ \(step (\d+)\)"


def args(*extra: str) -> list[str]:
    return [str(EPOCHS), "10", "--dataset-size", str(SIZE), "--sample-log", "samples", *extra]


def test_rank_0_killed_mid_epoch_every_sample_once_and_bit_identical(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    reference = ScriptRun(tmp_path / "ref", store_server.address, f"{job_id}-ref", SCRIPT, args("--save", "final.pt"))
    reference.wait()
    run = ScriptRun(tmp_path / "run", store_server.address, job_id, SCRIPT, args("--save", "final.pt"))
    wait_until(lambda: read_samples(run.out / "samples")[0], 60, "the first step")
    rank_0 = slot_pid(run.logs, 0)  # slot 0 holds rank 0; read now, not between the sight of the step and the kill
    wait_until(lambda: early_in_an_epoch(run.out / "samples", 8), 90, "the first steps of an epoch from the 8th on")
    killed_at = time.monotonic()
    os.kill(rank_0, signal.SIGKILL)
    run.wait()
    check = check_samples(run.out / "samples", SIZE, EPOCHS)
    assert check.passed, check.problems
    assert len(check.redone) <= 1 and check.world_sizes == [2, 2], (check.redone, check.world_sizes)
    starts = [s for s in run.printed(STARTS) if s[0] == 2]
    assert len(starts) == 2 and len({s[3:] for s in starts}) == 1, f"the members disagree on the position: {starts}"
    _, _, _, epoch, sample, step = starts[0]
    assert epoch >= 8 and 0 < sample < SIZE, f"generation 2 should resume mid-epoch, not at {epoch}/{sample}"
    back = min(r["mono"] for r in read_samples(run.out / "samples")[0] if r["generation"] == 2)
    print(f"\nrank 0 killed at epoch {epoch}: generation 2 resumed at sample {sample} (step {step}), "
          f"first step {back - killed_at:.2f} s after the kill, {len(check.redone)} step(s) redone")
    ours, theirs = (torch.load(r.out / "final.pt", weights_only=True) for r in (run, reference))
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs), "final parameters differ from the fault-free run"


def early_in_an_epoch(samples: Path, first_epoch: int) -> bool:
    """The newest step logged is one of the first ten of an epoch from `first_epoch` on, so a kill now lands mid-epoch
    with 20+ steps to spare. It looks at the newest step, not for a given one: a poll that comes late (a loaded
    machine: 21 steps late, seen) misses the window and waits for the next epoch's, never kills past its end."""
    records = read_samples(samples)[0]
    return bool(records) and records[-1]["epoch"] >= first_epoch and 1 <= records[-1]["step"] % 32 <= 10


def test_two_to_one_to_two_keeps_every_sample_once(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """Without a launcher: slot 1 is SIGKILLed and not replaced, slot 0 goes on alone (re-sharding the rest of its
    epoch over one rank), then slot 1 comes back as a fresh process and is healed to the position. The one that
    comes back is forked with torch imported (tests/helpers/forker.py), so it joins long before slot 0, alone,
    could finish (30 epochs: ~1,400 steps at world size 1 left when it starts)."""
    env = {**child_env(tmp_path, []), "FTCOORD_STORE": store_server.address, "FTCOORD_JOB_ID": job_id,
           "FTCOORD_WORLD_SIZE": "2", "FTCOORD_LOG_DIR": str(tmp_path / "logs")}
    argv = [str(REPO / SCRIPT), "30", "10", "--dataset-size", str(SIZE), "--sample-log", str(tmp_path / "samples"),
            "--snapshot", str(tmp_path / "snapshot.pt"), *CPU]

    def start(slot: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, *argv], cwd=tmp_path, stderr=subprocess.STDOUT,
                                env={**os.environ, **env, "FTCOORD_SLOT": str(slot)},
                                stdout=open(tmp_path / f"slot{slot}.out", "ab"))

    def trained(world: int, at_least: int) -> bool:
        return sum(r["world_size"] == world for r in read_samples(tmp_path / "samples")[0]) >= at_least

    first, second = start(0), start(1)
    try:
        wait_until(lambda: trained(2, 2 * 100), 90, "100 steps at world size 2")
        second.kill()
        wait_until(lambda: trained(1, 40), 90, "slot 0 to train 40 steps alone")
        back = forker.spawn(argv, tmp_path / "slot1-back.out", "tests.helpers.script_member",
                            {**env, "FTCOORD_SLOT": "1"})
        assert first.wait(180) == 0, (tmp_path / "slot0.out").read_text()[-3000:]  # a plain exit: no abort in teardown
        wait_until(lambda: back in forker.exited(), 60, "slot 1's second process to finish")
        assert forker.exited()[back] == 0, (tmp_path / "slot1-back.out").read_text()[-3000:]
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
    check = check_samples(tmp_path / "samples", SIZE, 30)
    assert check.passed, check.problems
    sizes = [s for i, s in enumerate(check.world_sizes) if i == 0 or s != check.world_sizes[i - 1]]
    assert sizes == [2, 1, 2], check.world_sizes
    healed = [e for e in read_logs(tmp_path / "logs", ("state_healed",)) if e["receivers"]]
    assert healed, "the returning slot should have been healed from the survivor"


def test_under_torchrun_ftcoord_refuses_in_one_line(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).parent / "torchrun"
    result = subprocess.run([str(torchrun), "--nproc-per-node", "1", str(REPO / SCRIPT), "1", "1"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=90,
                            env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"})
    assert result.returncode != 0
    said = [line for line in (result.stdout + result.stderr).splitlines() if "does not run under torchrun" in line]
    assert said, result.stderr[-2000:]
    assert "Traceback" not in result.stdout, "the worker should say one line, not a traceback"
    # Each command it suggests is one the launcher accepts, placeholders filled in.
    suggested = re.findall(r"`(ftcoord-launch [^`]*)`", said[0])
    assert len(suggested) == 2, said[0]
    fill = {"NAME": "j", "N": "2", "P": "2", "I": "1", "HOST:PORT": "127.0.0.1:29600", "SCRIPT": str(REPO / SCRIPT)}
    for command in suggested:
        argv = [fill.get(word, word) for word in command.split()[1:] if word not in ("ARGS", "...")]
        if argv[-1] == "--":
            argv += ["python", str(REPO / SCRIPT)]
        config, _ = parse_config(argv)
        assert config.job_id == "j" and config.nproc == 2, command


def test_a_store_that_is_not_there_is_named_at_once_with_where_its_address_came_from(tmp_path: Path) -> None:
    env = {**os.environ, "FTCOORD_STORE": "127.0.0.1:9", "TORCH_CPP_LOG_LEVEL": "ERROR"}  # nothing listens on 9
    proc = subprocess.Popen([sys.executable, str(REPO / "examples/quickstart.py"), "--steps", "5", *CPU], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and "store_waiting" not in line:
            line = proc.stdout.readline()
        assert "127.0.0.1:9" in line and "from FTCOORD_STORE" in line, line
    finally:
        proc.kill()
        proc.wait()


def test_a_sigterm_stops_every_rank_at_one_step_and_rank_0_saves_where_they_stood(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """SIGTERM to the launcher (a preemption notice): it passes the stop on, every rank leaves at the same step
    boundary (call.should_stop), rank 0 writes the snapshot of that step, and the launcher exits 0. A loop that does
    not look at should_stop trains on until the launcher's 30 s grace runs out and is killed (exit 143)."""
    run = ScriptRun(tmp_path / "run", store_server.address, job_id, SCRIPT,
                    ["100000", "100000", "--dataset-size", str(SIZE), "--sample-log", "samples"])
    wait_until(lambda: len(read_samples(run.out / "samples")[0]) >= 20, 90, "ten steps on each rank")
    os.kill(run.proc.pid, signal.SIGTERM)
    run.wait(timeout=120)  # exit 0, or it fails with the launcher's output
    (stopped,) = run.printed(r"stopped: snapshot saved at step (\d+)")
    snapshot = torch.load(run.out / "snapshot.pt", weights_only=True)
    assert snapshot["STEP"] == stopped[0], (snapshot["STEP"], stopped)
    trained = {r["step"] for r in read_samples(run.out / "samples")[0]}
    # A line is written before its step's forward pass: one at the snapshot's own step is an attempt the stop cut
    # short (the stop ends the generation first); a line beyond it would mean its rank had committed that step.
    assert stopped[0] - 1 <= max(trained) <= stopped[0], (sorted(trained)[-3:], stopped)
