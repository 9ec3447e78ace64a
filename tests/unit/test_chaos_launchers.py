"""The launchers of a chaos run (chaos.run.launchers): which node a scenario's slot is on, which code they and their
ranks
run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.run.launchers import Launchers
from chaos.scenario import parse
from tests.helpers.decoy import decoy_checkout
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(120)


def test_a_hot_spares_slot_is_on_the_first_node(tmp_path: Path) -> None:
    """A scenario numbers the spares after the workers (slots nproc..), and the first node's launcher runs them: a
    lose, partition, replace or standby fault aimed at a spare's slot stopped the run with a bare StopIteration."""
    job = parse('name = "x"\ndescription = "d"\n[job]\nnproc = 2\nspares = 1\nglobal_batch = 8\n'
                'nodes = [[0], [1]]\n', "spare.toml").job
    launchers = Launchers(job, "127.0.0.1:1", "job", tmp_path, [], None, tmp_path / "launchers.out")
    assert launchers.node_of(2) is launchers.nodes[0]
    assert launchers.node_of(1) is launchers.nodes[1]
    assert launchers.node_of(0) is launchers.nodes[0]


def test_a_runs_launchers_and_ranks_run_this_checkout_wherever_the_run_was_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`chaos run` started in a directory that holds another checkout's `ftcoord` and `training` still tests this
    checkout's launcher and ranks (`python -m` puts the working directory first: sabotage, the launchers' commands
    without `-P`, runs the decoys), and their relative paths mean the run's directory."""
    job = parse('name = "x"\ndescription = "d"\n[job]\nnproc = 2\nglobal_batch = 8\n', "x.toml").job
    monkeypatch.chdir(decoy_checkout(tmp_path / "other", "ftcoord.launcher.main", "training.__main__"))
    launchers = Launchers(job, "127.0.0.1:1", "job", Path("out"), [], None, tmp_path / "launchers.out")
    command = launchers.command(launchers.nodes[0])
    rank = command[command.index("--") + 1:]
    for program in (command[:command.index("ftcoord.launcher.main") + 1], rank[:rank.index("training") + 1]):
        done = subprocess.run([*program, "--help"], env=launchers.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "--steps" in done.stdout or "--nproc" in done.stdout, done.stdout
    assert "out/ckpt" in rank, rank


def test_a_launchers_restart_budget_covers_every_fault_the_scenario_plans(tmp_path: Path) -> None:
    """A schedule that kills one slot more than 20 times is a schedule, not a crash loop: with the old fixed
    `--max-restarts 20` its launcher gave up on the 21st death (exit 3, 'restarts exhausted') and the run failed on
    steps never committed. The budget is the planned faults plus a crash-loop net."""
    job = parse('name = "x"\ndescription = "d"\n[job]\nnproc = 2\nglobal_batch = 8\n', "x.toml").job
    for faults in (0, 25, 300):
        launchers = Launchers(job, "127.0.0.1:1", "job", tmp_path, [], None, tmp_path / "launchers.out",
                              faults=faults)
        command = launchers.command(launchers.nodes[0])
        budget = int(command[command.index("--max-restarts") + 1])
        assert budget >= faults + 20, (faults, budget)


def test_a_pause_that_ends_inside_a_partition_of_its_node_leaves_the_process_stopped(tmp_path: Path) -> None:
    """A rank (or a launcher) paused, then its node partitioned before the pause ended: the pause's SIGCONT woke
    that one process inside a node that answers nothing. The partition now holds it, and the partition's heal
    continues the whole node. Real processes in a session of their own, as a node's launcher is."""
    from chaos.run.runner import ChaosRunner
    from ftcoord.host.process_state import stopped

    scenario = parse('name = "x"\ndescription = "d"\n[job]\nnproc = 2\nglobal_batch = 8\nnodes = [[0], [1]]\n',
                     "x.toml")
    launchers = Launchers(scenario.job, "127.0.0.1:1", "job", tmp_path, [], None, tmp_path / "launchers.out")
    runner = ChaosRunner(scenario, tmp_path / "run", quiet=True)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    partitioned, other = (launchers.nodes[i] for i in (1, 0))
    try:
        for node in (partitioned, other):
            node.process = subprocess.Popen(sleeper, start_new_session=True)
            os.kill(node.process.pid, signal.SIGSTOP)  # a pause of it
            pid = node.process.pid
            wait_until(lambda pid=pid: stopped(pid), 10, "the pause took hold")
            runner._pending_conts.append((0.0, pid))  # ... over now
        launchers.stop(partitioned)  # its node partitioned meanwhile
        runner._resume_stopped(1.0, launchers)
        wait_until(lambda: not stopped(other.process.pid), 10, "a pause that ended outside any partition ended")
        assert stopped(partitioned.process.pid), "the pause's SIGCONT woke a process its partition holds"
        launchers.resume(partitioned)
        wait_until(lambda: not stopped(partitioned.process.pid), 10, "the partition's heal continued it")
    finally:
        for node in (partitioned, other):
            if node.process is not None:
                node.process.kill()
                node.process.wait(10)
