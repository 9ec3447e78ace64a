"""Scenario files: every bundled one is valid; bad ones get errors naming key and value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chaos.scenario import IN_RANK_ACTIONS, IN_RANK_KINDS, ScenarioError, at_boundary, bundled_names, load, parse

GOOD_JOB = "[job]\nnproc = 2\nsteps = 50\nglobal_batch = 8\n"
NODES_JOB = GOOD_JOB + "nodes = [[0], [1]]\n"


def test_every_bundled_scenario_loads_with_a_description() -> None:
    names = bundled_names()
    for required in ("kill-boundary", "kill-midstep", "kill-leader", "hang", "preempt", "ckpt-crash",
                     "early-restart", "elastic", "spare", "random", "demo"):
        assert required in names
    for name in names:
        scenario = load(name)
        assert scenario.description and scenario.faults, name


def test_random_faults_are_reproducible_from_the_seed() -> None:
    assert load("random").faults == load("random").faults
    text = load("random").path
    other = parse(open(text).read().replace("seed = 7", "seed = 8"), "x")
    assert other.faults != load("random").faults


def test_random_faults_aim_only_at_ranks_the_job_keeps() -> None:
    """Ranks are dense: a job of two nodes of two trains at world size 2 while one node is away (lost), so a random
    fault for rank 2 or 3 may find no such rank and never fire. Drawn among the ranks
    it keeps, it always finds its target; a job of one node keeps all of its ranks (the draws of its seeds are
    unchanged: a fault left out of one but not the other raced another fault aimed at its rank, the test below)."""
    text = ('name = "x"\ndescription = "d"\n[job]\nnproc = 4\nsteps = 400\nglobal_batch = 8\n{nodes}'
            '[random]\nseed = 5\nmtbf_steps = 8\n')
    one_node = parse(text.format(nodes=""), "one.toml")
    two_nodes = parse(text.format(nodes="nodes = [[0, 1], [2, 3]]\n"), "two.toml")
    aimed = [f.rank for f in two_nodes.faults if f.rank is not None]
    assert aimed and max(aimed) < 2, f"a job of two nodes of two drew faults for ranks {sorted(set(aimed))}"
    assert {f.rank for f in one_node.faults if f.rank is not None} == {0, 1, 2, 3}
    one_steps, two_steps = [f.step for f in one_node.faults], [f.step for f in two_nodes.faults]
    assert set(two_steps) <= set(one_steps)
    for step in set(one_steps) - set(two_steps):  # left out: it came at or next to a step aimed at the same rank
        assert any(abs(f.step - step) <= 1 for f in two_nodes.faults if f.rank is not None), step


def test_random_faults_plan_one_fault_per_rank_and_step() -> None:
    """The first ends that rank's step and its peers commit it, so a second never fires (mixed schedule H, seed
    86420: a raise-midstep and a kill-midstep for rank 2 at step 34). The other draws are unchanged."""
    text = ('name = "x"\ndescription = "d"\n[job]\nnproc = 4\nspares = 2\nsteps = 240\nglobal_batch = 24\n'
            '[random]\nseed = 86420\nmtbf_steps = 6\n')
    faults = parse(text, "h.toml").faults
    aimed = [(f.rank, f.step) for f in faults if f.rank is not None]
    assert len(aimed) == len(set(aimed)), f"two faults for one rank at one step: {aimed}"
    assert [(f.kind, f.rank) for f in faults if f.step == 34] == [("raise-midstep", 2)]


def test_random_faults_send_nothing_from_outside_to_a_rank_still_before_its_own_fault() -> None:
    """A fault sent from outside at step s goes once any rank committed step s - 1: the rank it aims at may still be
    in that step, before the point of an in-rank fault planned there, which then never fires (seed 33004, six ranks
    on two nodes: a hang at step 55 stopped rank 1 between step 54's reduction and its raise-midstep). The other
    draws are unchanged."""
    text = ('name = "x"\ndescription = "d"\n[job]\nnproc = 6\nspares = 1\nnodes = [[0, 1, 2], [3, 4, 5]]\n'
            'steps = 200\nglobal_batch = 24\n[random]\nseed = 33004\nmtbf_steps = 8\n')
    faults = parse(text, "r4.toml").faults
    in_rank = {(f.rank, f.step) for f in faults if f.rank is not None and f.kind in IN_RANK_KINDS}
    outside = {(f.rank, f.step) for f in faults if f.rank is not None and f.kind not in IN_RANK_KINDS}
    racing = sorted((r, s) for r, s in outside if (r, s - 1) in in_rank)
    assert not racing, f"faults sent from outside to a rank with an in-rank fault the step before: {racing}"
    assert [(f.kind, f.rank) for f in faults if f.step in (54, 55)] == [("raise-midstep", 1)]
    assert len(faults) == 23


def test_random_faults_plan_no_boundary_fault_right_after_a_fault_inside_the_step_before() -> None:
    """An in-rank fault at the boundary of step s fires after step s - 1 is committed; one inside step s - 1 (after
    the backward, in the reduction) ends that rank's step before its commit, its peers commit it, and nobody holding
    the rank passes that boundary (seed 33019, three ranks and a spare: a kill-midstep of rank 1 at step 164 and a
    raise at step 165, which never fired). The other draws are unchanged."""
    text = ('name = "x"\ndescription = "d"\n[job]\nnproc = 3\nspares = 1\nsteps = 180\nglobal_batch = 24\n'
            '[random]\nseed = 33019\nmtbf_steps = 12\n')
    faults = parse(text, "r33019.toml").faults
    points = {(f.rank, f.step): IN_RANK_ACTIONS[f.kind][1] for f in faults if f.kind in IN_RANK_ACTIONS}
    unfired = sorted((r, s) for (r, s), point in points.items()
                     if point == "at_boundary" and points.get((r, s - 1)) in ("after_backward", "mid_reduction"))
    assert not unfired, f"boundary faults right after a fault inside the same rank's step before: {unfired}"
    assert [(f.kind, f.rank) for f in faults if f.step in (164, 165)] == [("kill-midstep", 1)]
    assert len(faults) == 7


def test_random_faults_plan_no_boundary_fault_at_step_0() -> None:
    """A boundary fault fires once step s - 1 is committed: at step 0 it never fires (seed 33055, four ranks, mtbf
    10: a kill-boundary of rank 1 at step 0, a FAIL for a fault that never fired). The other draws are unchanged."""
    text = ('name = "x"\ndescription = "d"\n[job]\nnproc = 4\nnodes = [[0, 1], [2, 3]]\nmin_world_size = 2\n'
            'steps = 200\nglobal_batch = 24\n[random]\nseed = 33055\nmtbf_steps = 10\n')
    faults = parse(text, "h-c.toml").faults
    assert [(f.kind, f.step) for f in faults if f.step == 0 and at_boundary(f.kind)] == []
    assert [(f.kind, f.step, f.rank) for f in faults[:2]] == [("kill-boundary", 10, 0), ("pause-leader", 20, None)]
    assert len(faults) == 16


def test_random_faults_draw_the_kinds_a_random_table_lists() -> None:
    """`kinds` widens what a seed draws to store faults, a paused launcher or standby, a killed follower: the mixes the
    bundled random schedule never makes. A timed one lasts half or three heartbeat timeouts; a launcher's or standby's
    is a node's of the job. A seed with no `kinds` plans what it planned before `kinds` existed (seed 7, pinned)."""
    assert [(f.kind, f.step, f.rank) for f in load("random").faults] == [
        ("kill", 11, 1), ("kill-midstep", 43, 0), ("kill-boundary", 56, 0), ("raise-midstep", 58, 1),
        ("kill-midstep", 60, 1), ("stuck", 62, 0)]
    more = ["store-restart", "store-hang", "pause-launcher", "kill-standby", "pause-standby", "kill-follower", "kill"]
    text = ('name = "x"\ndescription = "d"\n[job]\nnproc = 3\nsteps = 400\nglobal_batch = 24\nwarm_standby = 1\n'
            f'[random]\nseed = 3\nmtbf_steps = 6\nkinds = {more!r}\n'.replace("'", '"'))
    faults = parse(text, "x.toml").faults
    assert faults == parse(text, "x.toml").faults
    assert {f.kind for f in faults} == set(more), [f.kind for f in faults]
    for fault in faults:
        timed = fault.kind in ("store-restart", "store-hang", "pause-launcher", "pause-standby")
        assert fault.duration in ((1.0, 6.0) if timed else (0.0,)), fault
        assert 0 <= fault.slot < 3 and fault.rank is None if fault.kind != "kill" else fault.rank is not None, fault
    assert {f.slot for f in faults if f.kind == "pause-launcher"} != {0}, "every launcher's slot drawn as 0"


@pytest.mark.parametrize(
    ("kinds", "job", "message"),
    [
        ('["kill", "explode"]', "", r"kinds: 'explode' cannot be drawn; drawn kinds are \['kill-boundary'"),
        ('["lose"]', "", r"kinds: 'lose' cannot be drawn \(it must be ordered with other faults: write it as a "
                         r"\[\[faults\]\] table\)"),
        ('["kill-standby"]', "warm_standby = 0\n", "kinds: kill-standby needs a warm standby: this job has "
                                                   "warm_standby = 0"),
        ('["kill-midreduce"]', 'grad_reduction = "allreduce"\n', "kill-midreduce fires inside the fixed-order"),
        ("[]", "", r"kinds = \[\]: give a non-empty list of fault kinds"),
        ('"kill"', "", r"kinds = 'kill': give a non-empty list"),
        ('["kill", "kill"]', "", "a kind listed twice"),
    ],
)
def test_a_random_table_that_lists_kinds_it_cannot_draw_is_refused(kinds: str, job: str, message: str) -> None:
    text = f'name = "x"\ndescription = "d"\n{GOOD_JOB}{job}[random]\nseed = 1\nmtbf_steps = 5\nkinds = {kinds}\n'
    with pytest.raises(ScenarioError, match=message):
        parse(text, "x.toml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name = "x"\ndescription = "d"\n' + GOOD_JOB + '[[faults]]\nkind = "explode"\nstep = 3\n',
         "unknown fault kind 'explode'; allowed: "),
        ('name = "x"\ndescription = "d"\n' + GOOD_JOB + '[[faults]]\nkind = "kill"\nstep = 50\n',
         r"step = 50 is beyond the run \(steps 0..49\)"),
        ('name = "x"\ndescription = "d"\n' + GOOD_JOB + '[[faults]]\nkind = "kill"\nslot = 2\nstep = 1\n',
         r"slot = 2 is beyond the job \(slots 0..1\)"),
        ('name = "x"\ndescription = "d"\n[job]\nnproc = 3\nglobal_batch = 8\n',
         "global_batch = 8 is not divisible by nproc = 3"),
        ('name = "x"\ndescription = "d"\n[job]\nnprocs = 3\n', r"unknown key\(s\) \['nprocs'\]"),
        ('name = "x"\ndescription = "d"\n' + GOOD_JOB + '[[faults]]\nkind = "hang"\nstep = 1\n',
         "a hang needs duration > 0"),
        ('name = "x"\ndescription = "d"\n' + GOOD_JOB + '[[faults]]\nkind = "lose"\nslot = 1\nstep = 1\n',
         "declare \\[job\\] nodes"),
        ('name = "x"\ndescription = "d"\n[job]\nnproc = 2\nnodes = [[0], [1]]\n[[faults]]\nkind = "partition"\n'
         'slot = 1\nstep = 1\nduration = 1.5\n', r"a partition of duration = 1.5s is ridden through"),
        ('name = "x"\ndescription = "d"\n[job]\nnproc = 2\nnodes = [[0], [1]]\n[[faults]]\nkind = "cut-data"\n'
         'slot = 1\nstep = 1\nduration = 2.0\n',
         r"a cut-data of duration = 2.0s is over before a dead data link can be told from a slow step"),
        ('name = "x"\ndescription = "d"\n[job]\nnproc = 2\nnodes = [[0, 1]]\n[[faults]]\nkind = "cut"\nslot = 1\n'
         'step = 1\n', r"cut cuts a node off from the others; declare two nodes or more"),
        ('name = "x"\ndescription = "d"\n' + NODES_JOB + '[[faults]]\nkind = "cut"\nslot = 1\nstep = 5\n'
         '[[faults]]\nkind = "cut-control"\nslot = 1\nstep = 9\nduration = 3.0\n',
         r"#2: cut-control of node 1 \(slot 1\) at step 9: that node was lost for good at an earlier step"),
        ('name = "x"\ndescription = "d"\n' + GOOD_JOB + '[[faults]]\nkind = "kill"\nstep = 1\nafter = -1\n',
         r"after = -1: give the seconds after its step \(0 or more\)"),
        ('name = "x"\ndescription = "d"\n' + GOOD_JOB + '[[faults]]\nkind = "raise"\nstep = 1\nafter = 0.5\n',
         r"a raise fires inside its rank's step, not 0.5s after it; after works with \['kill'"),
        ('name = "x"\n' + GOOD_JOB, "'description' must be a non-empty string"),
        ('name = "x\n', "not valid TOML"),
        ('name = "x"\ndescription = "d"\n[job]\nmodel = "gpt"\n', "model = 'gpt': choose one of"),
        # Each of these was accepted, or ended in a bare traceback (TypeError, ValueError) before any process started.
        ('name = "x"\ndescription = "d"\n[job]\nnproc = 6\nglobal_batch = 12\nnodes = 3\n',
         r"nodes = 3: give the slots of each node, .* e.g. nodes = \[\[0, 1\], \[2, 3\], \[4, 5\]\]"),
        ('name = "x"\ndescription = "d"\n[job]\nnodes = [[0, "a"], [1]]\n', r"nodes = \[\[0, 'a'\], \[1\]\]: give"),
        ('name = "x"\ndescription = "d"\n[job]\nstep_time = "fast"\n', "step_time = 'fast': must be a number >= 0"),
        ('name = "x"\ndescription = "d"\n[job]\nlr = -1\n', "lr = -1: must be a number > 0"),
        ('name = "x"\ndescription = "d"\n[job]\nheartbeat_interval = 1.0\nheartbeat_timeout = 1.5\n',
         "heartbeat_timeout=1.5s must be at least twice heartbeat_interval=1.0s"),
        ('name = "x"\ndescription = "d"\n[job]\ndataset = "nosuch"\n', "unknown dataset 'nosuch'"),
        ('name = "x"\ndescription = "d"\n[job]\noptimizer = "rmsprop"\n', "'rmsprop': choose sgd or adam"),
        # Started every process, and failed in the reference run, its reason in a file of launcher output.
        ('name = "x"\ndescription = "d"\n[job]\nmodel = "small-cnn"\ndataset = "synthetic:768"\n',
         r"--model small-cnn needs image inputs \(C, H, W\), and --dataset synthetic:768 gives vectors of 32"),
        ('name = "x"\ndescription = "d"\n[job]\nnproc = 2\nmin_world_size = 3\n',
         "min_world_size = 3 is above nproc = 2: the job could never start"),
        ('name = "x"\ndescription = "d"\n' + GOOD_JOB + '[random]\nseed = "x"\nmtbf_steps = 5\n',
         "seed = 'x': must be an integer"),
        ('name = "x"\ndescription = "d"\n' + GOOD_JOB + '[[faults]]\nkind = "stuck"\nslot = 1\nstep = 0\n',
         "a stuck at step 0 never fires: it fires at the boundary before its step, once step - 1 is committed; "
         "give step = 1 or more"),
        ('name = "x"\ndescription = "d"\n[job]\nwarm_standby = false\n',
         r"warm_standby = False: must be an integer >= 0 \(how many warm standbys a launcher keeps: 0 for none\)"),
        # Each fired at nothing, and failed the run only at its end.
        ('name = "x"\ndescription = "d"\n' + NODES_JOB + '[[faults]]\nkind = "replace"\nslot = 1\nstep = 5\n',
         r"#1: replace of node 1 \(slot 1\) at step 5: that node is running then; a replace starts a new launcher"),
        ('name = "x"\ndescription = "d"\n' + NODES_JOB + '[[faults]]\nkind = "lose"\nslot = 1\nstep = 5\n'
         '[[faults]]\nkind = "partition"\nslot = 1\nstep = 9\nduration = 3.0\n',
         r"#2: partition of node 1 \(slot 1\) at step 9: that node was lost for good at an earlier step"),
    ],
)
def test_bad_scenarios_are_refused_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse(text, "bad.toml")


def test_cli_unknown_scenario_is_a_clear_error() -> None:
    result = subprocess.run([sys.executable, "-m", "chaos", "run", "no-such-scenario"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert "no scenario 'no-such-scenario'" in result.stderr and "kill-boundary" in result.stderr


def test_overlapping_pauses_of_one_process_end_with_the_last(tmp_path: Path) -> None:
    """Two pauses of one process overlap (a pause-leader of a leader paused already: a hot spare that won the first
    election and was paused as the spare): it stays stopped until the longer one ends. The shorter one's SIGCONT
    cut the longer short, so the spare was neither fenced nor replaced (test_pause_in_every_role, under load)."""
    import os
    import signal
    import time
    from types import SimpleNamespace

    from chaos.run.launchers import Launchers
    from chaos.run.runner import ChaosRunner

    def state(pid: int) -> str:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while state(child.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        runner = SimpleNamespace(_pending_conts=[(100.0, child.pid), (106.0, child.pid)])
        job = parse('name = "x"\ndescription = "d"\n[job]\nnproc = 2\nglobal_batch = 8\n', "x.toml").job
        launchers = Launchers(job, "127.0.0.1:1", "job", tmp_path, [], None, tmp_path / "launchers.out")
        ChaosRunner._resume_stopped(runner, now=101.0, launchers=launchers)  # type: ignore[arg-type]
        time.sleep(0.2)
        assert state(child.pid) == "T", "the shorter pause's end resumed a process still paused by the longer"
        ChaosRunner._resume_stopped(runner, now=106.0, launchers=launchers)  # type: ignore[arg-type]
        deadline = time.monotonic() + 5
        while state(child.pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state(child.pid) != "T" and runner._pending_conts == []
    finally:
        child.kill()
        child.wait(10)


@pytest.mark.parametrize("faults", [
    [("lose", 1, 5, 0.0), ("replace", 1, 9, 0.0)],
    [("partition", 1, 5, 0.0), ("replace", 1, 9, 0.0), ("lose", 1, 20, 0.0), ("replace", 1, 30, 0.0)],
    [("partition", 1, 5, 3.0), ("replace", 1, 6, 0.0)],  # replaced while it is still partitioned, maybe
    [("partition", 1, 5, 3.0), ("partition", 1, 20, 3.0)],  # healed between the two
    [("lose", 1, 5, 0.0), ("preempt", 0, 9, 0.0), ("lose", 1, 20, 0.0)],  # the relaunch started it again
    [("lose", 2, 5, 0.0), ("replace", 0, 9, 0.0)],  # a hot spare's slot is the first node's
    [("cut", 1, 5, 0.0), ("replace", 1, 9, 0.0)],  # a node cut off for good, replaced
    [("cut-data", 1, 5, 3.0), ("replace", 1, 6, 0.0), ("cut-control", 1, 20, 0.0)],
])
def test_node_faults_in_a_possible_order_are_accepted(faults: list[tuple[str, int, int, float]]) -> None:
    text = 'name = "x"\ndescription = "d"\n' + NODES_JOB + "spares = 1\n"
    for kind, slot, step, duration in faults:
        text += f'[[faults]]\nkind = "{kind}"\nslot = {slot}\nstep = {step}\n'
        text += f"duration = {duration}\n" if duration else ""
    assert [f.kind for f in parse(text, "ok.toml").faults] == [kind for kind, *_ in faults]
