"""Every bundled chaos scenario, end to end with real processes, passes its verdict."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from chaos.cli import run_scenario
from chaos.report.metrics import read_logs

pytestmark = pytest.mark.timeout(420)


@pytest.fixture(autouse=True)
def _cache(reference_cache: Path) -> None:
    """Scenarios with the same job share a reference (see conftest)."""


def run(name: str, tmp_path: Path) -> dict:
    report = run_scenario(name, tmp_path / Path(name).stem, quiet=True)
    name = Path(name).stem
    assert report["verdict"] == "pass", json.dumps(report, indent=1)
    assert json.loads((tmp_path / name / "report.json").read_text())["verdict"] == "pass"
    for plot in ("loss.png", "timeline.png", "goodput.png"):
        assert (tmp_path / name / plot).stat().st_size > 1000
    c = report["correctness"]
    assert c["duplicates"] == c["missing"] == c["extra"] == 0 and c["epochs_checked"] >= 2
    assert c["model_checked"] and c["bit_identical"] is True, report["model_check"]  # every run, every size
    return report


def test_kill_boundary(tmp_path: Path) -> None:
    report = run("kill-boundary", tmp_path)
    assert report["correctness"]["bit_identical"] is True and report["restarts"] == 1
    assert report["faults"][0]["recover_s"] is not None
    # The survivor measured what the kill cost, and its stall covers the fault's recovery (it starts at the
    # last commit before the fault, the recovery at the fault itself).
    [incident] = report["incidents"]
    assert incident["witness"] != report["faults"][0]["slot"] and incident["lost_steps"] == 0
    assert incident["stall_s"] >= report["faults"][0]["recover_s"] - 0.05


def test_batchnorm_statistics_stay_exact_when_rank_0_dies(tmp_path: Path) -> None:
    """The survivor's forward of the step that never committed moved its BatchNorm statistics;
    they are rolled back, so the run ends bit-identical to the reference (buffers included)."""
    spec = tmp_path / "bn-kill.toml"
    spec.write_text('name = "bn-kill"\ndescription = "BatchNorm model, rank 0 killed after a step"\n[job]\n'
                    'nproc = 2\nsteps = 16\nglobal_batch = 8\nmodel = "small-cnn"\ndataset = "fakedata:64"\n'
                    'ckpt_every = 5\n[[faults]]\nkind = "kill-boundary"\nslot = 0\nstep = 6\n')
    report = run(str(spec), tmp_path)
    assert report["correctness"]["bit_identical"] is True and report["restarts"] == 1


def test_kill_midstep(tmp_path: Path) -> None:
    report = run("kill-midstep", tmp_path)
    assert report["correctness"]["bit_identical"] is True
    assert [f["kind"] for f in report["faults"]] == ["kill-midstep", "kill"]


def test_kill_leader(tmp_path: Path) -> None:
    """Its launcher's dead mark is evidence: a successor leads at once, no heartbeat timeout (2 s here)."""
    report = run("kill-leader", tmp_path)
    assert report["correctness"]["bit_identical"] is True
    elected = read_logs(tmp_path / "kill-leader" / "logs", ("leader_elected",))
    assert len(elected) >= 2
    assert report["faults"][0]["full_recover_s"] < 1.0, report["faults"]


@pytest.mark.slow  # 27 s; test_launcher's stopped-standby and killed-standby tests are in the default set
def test_standby_faults(tmp_path: Path) -> None:
    """The node's warm standby stopped while a rank dies: the replacement starts as a new interpreter at once (no
    wait on the stopped standby) and the woken standby forks nothing for it; the standby killed: no rank with it."""
    report = run("standby", tmp_path)
    _, kill, _ = report["faults"]
    logs = tmp_path / "standby" / "logs"
    [failed] = read_logs(logs, ("standby_fork_failed",))
    assert "stopped" in failed["reason"], failed
    [killed_at] = [f["mono"] for f in map(json.loads, (tmp_path / "standby" / "faults.jsonl").read_text().splitlines())
                   if f["kind"] == "kill"]
    assert failed["mono"] - killed_at < 1.0, "the launcher waited for its stopped standby (it stays stopped 5 s)"
    started = [e for e in read_logs(logs, ("child_started",)) if e["slot"] == kill["slot"]]
    assert [e["from_standby"] for e in started] == [True, False], started  # the first, then the cold start
    assert report["restarts"] == 1, "a rank died with the killed standby"
    assert len(read_logs(logs, ("standby_started",))) == 2, "no new standby after the kill"


def test_hang(tmp_path: Path) -> None:
    report = run("hang", tmp_path)
    assert read_logs(tmp_path / "hang" / "logs", ("rank_fenced_killed",)), "the hung rank should be fenced"
    detect = report["faults"][0]["detect_s"]
    assert detect is not None and detect < 2.0 + 0.2 + 1.5  # heartbeat timeout + interval + slack


def test_pause_in_every_role(tmp_path: Path) -> None:
    """A leader paused briefly is ridden through (no generation change); a spare, a member and the leader
    paused past the heartbeat timeout are fenced and replaced (the spare without interrupting anyone, the
    leader's duties taken over); exactly-once and the model hold."""
    report = run("pause", tmp_path)
    spare, brief, member, leader = report["faults"]
    assert spare["slot"] >= 100_000 and spare["detect_s"] is None and brief["detect_s"] is None, report["faults"]
    assert member["detect_s"] is not None and leader["detect_s"] is not None, report["faults"]
    assert report["world_sizes"] == [3], report["faults"]
    # Nothing to recover from, and the report says why where it shows the None (ridden through; a spare hit).
    assert brief["recover_s"] is None and brief["note"] and spare["note"], report["faults"]
    faults_table = (tmp_path / "pause" / "report.md").read_text()
    assert f"| {brief['note']} |" in faults_table and f"| {spare['note']} |" in faults_table, faults_table
    logs = tmp_path / "pause" / "logs"
    fenced = read_logs(logs, ("rank_fenced_killed",))
    assert sorted(e["slot"] for e in fenced) == sorted([spare["slot"], member["slot"], leader["slot"]]), fenced
    assert len(read_logs(logs, ("leader_elected",))) >= 2


@pytest.mark.slow  # waits out the 24 s default; a short progress_timeout is in the default set
def test_stuck_training_thread_is_caught_by_the_default_progress_timeout(tmp_path: Path) -> None:
    """Rank 0's training thread stops (its heartbeat runs on); no progress_timeout is set, the default
    (12 heartbeat timeouts) and the culprit rule fence it, and only it."""
    report = run("stuck", tmp_path)
    declared = read_logs(tmp_path / "stuck" / "logs", ("member_declared_dead",))
    assert [(e["reason"], e["slot"]) for e in declared] == [("hung", report["faults"][0]["slot"])], declared
    assert 12 * 2.0 <= report["faults"][0]["detect_s"] < 12 * 2.0 + 3.0, report["faults"]


def test_a_stuck_rank_is_fenced_as_the_culprit_before_its_peers_collective_times_out(tmp_path: Path) -> None:
    """The default progress timeout stays below pg_timeout (Timing.progress_timeout_below): with collectives that time
    out after 9 s, a rank stuck in its step is fenced at 6 s and replaced, and its peer never raises. Sabotage: the
    default left at 12 heartbeat timeouts (24 s here) lets gloo end it at 9 s: an exception in the peer, the stuck
    rank left out alive (at the library's defaults both were 60 s; random schedule seed 33042)."""
    spec = tmp_path / "stuck-pg.toml"
    spec.write_text('name = "stuck-pg"\ndescription = "a rank stuck, collectives that time out after 9 s"\n[job]\n'
                    'nproc = 2\nsteps = 80\nglobal_batch = 24\ndataset = "synthetic:768"\nstep_time = 0.03\n'
                    'ckpt_strategy = "none"\npg_timeout = 9.0\n'
                    '[[faults]]\nkind = "stuck"\nrank = 1\nstep = 30\n')
    report = run(str(spec), tmp_path)
    (stuck,) = report["faults"]
    declared = read_logs(tmp_path / "stuck-pg" / "logs", ("member_declared_dead",))
    assert [(e["reason"], e["slot"]) for e in declared] == [("hung", stuck["slot"])], declared
    assert 6.0 <= stuck["detect_s"] < 9.0 and stuck["full_recover_s"] < 9.0, stuck
    assert report["world_sizes"] == [2], report["world_sizes"]
    # Before the fence, the culprit logged where it stood (ftcoord.liveness.still_stack: half the progress timeout); its
    # peer, blocked in the step's all-reduce, logged nothing. The report shows it.
    (still,) = report["still_threads"]
    assert still["slot"] == stuck["slot"] and still["at"].endswith(" in _fire") and "chaos/run/inject.py" in still["at"]
    assert 3.0 <= still["still_s"] < 6.0, still
    assert re.fullmatch(rf"{still['pid']} [^:]+: S in \w+, [0-9.]+ s of CPU", still["thread"]), still  # the sleep
    assert f"`{still['at']}`" in (tmp_path / "stuck-pg" / "report.md").read_text()


@pytest.mark.slow  # 31 s; the rule (a fenced process is not awaited past its launcher's answer) is unit-tested
def test_a_paused_launcher_delays_only_what_it_must_do_itself(tmp_path: Path) -> None:
    """A node's launcher SIGSTOPped for 10 s: its ranks train on. A rank killed meanwhile is decided without at once
    and replaced when the launcher wakes; a rank stuck meanwhile is fenced at progress_timeout (4 s) and decided
    without once its launcher is past due, though that launcher kills it only when it wakes. Sabotage: a fenced
    process counted alive by its heartbeat (before Judge.fenced_alive) held that decision for join_timeout, 3.2 s."""
    report = run("pause-launcher", tmp_path)
    pause, kill, stuck = report["faults"]
    assert kill["recover_s"] < 1.0 and pause["full_recover_s"] >= 10.0, report["faults"]  # replaced once awake
    assert 4.0 <= stuck["detect_s"] < 5.0 and stuck["recover_s"] - stuck["detect_s"] < 1.5, stuck
    logs = tmp_path / "pause-launcher" / "logs"
    [killed] = read_logs(logs, ("rank_fenced_killed",))
    [fenced] = [e for e in read_logs(logs, ("rank_fenced",)) if e.get("reason") == "hung"]
    assert killed["mono"] - fenced["mono"] > 2.0, (fenced, killed)  # its launcher killed it only once awake
    assert report["world_sizes"] == [1, 2, 3], report["world_sizes"]


@pytest.mark.slow  # 30 s; the fence rules of ftcoord.leader.readiness are unit-tested by default
def test_a_leader_that_takes_over_does_not_wait_for_a_member_its_predecessor_fenced(tmp_path: Path) -> None:
    """A member paused past its heartbeat timeout is fenced and decided without, and its launcher, paused too, does
    not kill it; then the leader is killed. The next leader never watched that member's silence: it read it alive
    by its heartbeat and waited for it (2.68 s here, its heartbeat timeout from the takeover). The deciding leader
    now writes the processes it fenced into the record's left_out (ftcoord.leader.readiness.still_left_out), as it does
    those it left out at a last call or on evidence. Sabotage: without them, the kill-leader's recovery waits."""
    spec = tmp_path / "fenced-then-leader.toml"
    spec.write_text('name = "fenced-then-leader"\ndescription = "a member fenced, its launcher paused, then the leader '
                    'killed"\n[job]\nnproc = 3\nnodes = [[0], [1, 2]]\nsteps = 200\nglobal_batch = 24\n'
                    'dataset = "synthetic:768"\nstep_time = 0.03\nckpt_strategy = "none"\n'
                    '[[faults]]\nkind = "pause-launcher"\nslot = 1\nstep = 30\nduration = 12.0\n'
                    '[[faults]]\nkind = "pause"\nslot = 2\nstep = 32\nduration = 10.0\n'
                    '[[faults]]\nkind = "kill-leader"\nstep = 60\n')
    report = run(str(spec), tmp_path)
    _, paused, leader = report["faults"]
    assert paused["detect_s"] < 3.0, paused  # fenced for its silence (heartbeat_timeout 2 s)
    assert leader["recover_s"] < 1.0, leader


def test_preempt(tmp_path: Path) -> None:
    report = run("preempt", tmp_path)
    assert report["correctness"]["bit_identical"] is True and report["replayed_steps"] == 0


def test_ckpt_crash(tmp_path: Path) -> None:
    report = run("ckpt-crash", tmp_path)
    assert report["replayed_steps"] > 0  # resumed from the checkpoint before the torn one
    assert report["correctness"]["bit_identical"] is True


def test_early_restart(tmp_path: Path) -> None:
    report = run("early-restart", tmp_path)
    assert report["world_sizes"] == [2], "the restarted rank should make the same next generation"
    assert report["correctness"]["bit_identical"] is True


def test_elastic(tmp_path: Path) -> None:
    report = run("elastic", tmp_path)
    assert report["world_sizes"] == [1, 2]
    assert report["model_check"]["expected_from"] == "replay"  # the run's own 2 -> 1 -> 2 schedule
    lose, replace = report["faults"]
    assert replace["full_recover_s"] is not None, "the replaced node must bring the world back to size"


def test_spare(tmp_path: Path) -> None:
    report = run("spare", tmp_path)
    assert report["world_sizes"] == [2]


@pytest.mark.slow  # 35 s; 24 random schedules (test_random_schedules.py) and the demo are in the default set
def test_random(tmp_path: Path) -> None:
    report = run("random", tmp_path)
    assert len(report["faults"]) >= 1


def test_demo(tmp_path: Path) -> None:
    """The demo keeps world size 3 through every fault, the hang included: the hung rank's launcher says
    a replacement is coming as it kills it, so the leader waits for it instead of shrinking."""
    report = run("demo", tmp_path)
    assert len(report["faults"]) == 4 and report["world_sizes"] == [3], report["faults"]
    # Each change is put down to the slot the fault hit, not to the survivor whose collective failed first.
    causes = [i["cause"] for i in sorted(report["incidents"], key=lambda i: i["generation"])]
    assert len(causes) == 4, report["incidents"]
    for fault, cause in zip(sorted(report["faults"], key=lambda f: f["step"]), causes, strict=True):
        assert cause.startswith(f"slot {fault['slot']} "), (fault, causes)


def test_raise(tmp_path: Path) -> None:
    """Exceptions restart every rank in-process: no process restart, the world size kept."""
    report = run("raise", tmp_path)
    assert report["world_sizes"] == [3] and report["restarts"] == 0 and report["in_process_restarts"] >= 6
    assert all(f["recover_s"] is not None and f["recover_s"] < 2.0 for f in report["faults"]), report["faults"]


def test_lose_node(tmp_path: Path) -> None:
    """No launcher is left to report the lost ranks: the survivors' failed collectives are the evidence, and
    the job re-forms well before the heartbeat timeout (2 s); the survivor busy with a 0.6 s step beats on
    and is kept (one generation change, world 4 -> 2)."""
    report = run("lose-node", tmp_path)
    assert report["world_sizes"] == [2, 4] and report["generations"] == 2
    lose = next(f for f in report["faults"] if f["kind"] == "lose")
    assert lose["recover_s"] < 1.5, report["faults"]


def test_partition(tmp_path: Path) -> None:
    """A node stops answering (stopped: no connection closes). The survivors stood in a collective with its ranks
    until pg_timeout (60 s: recovery 60.1 s), deaf to the interrupt the leader wrote for them after the heartbeat
    timeout (2 s here); now that interrupt releases them (ftcoord.liveness.group_release). When the node runs again, its
    ranks
    write the line of the step they had finished (the verifier's order of generations reads a step's first line)
    and their launcher replaces them: the job grows back."""
    report = run("partition", tmp_path)
    assert report["world_sizes"] == [2, 4] and report["generations"] == 3
    [partition] = report["faults"]
    assert partition["recover_s"] < 5.0 and partition["full_recover_s"] is not None, report["faults"]
    released = read_logs(tmp_path / "partition" / "logs", ("process_group_released_early",))
    assert {0, 1} <= {e["slot"] for e in released}, released  # the survivors (and a resumed rank of the node, may)


@pytest.mark.slow  # a 12 s partition, then a kill (40 s); test_partition and test_two_at_once are in the default set
def test_a_node_silent_while_another_reason_ends_the_generation_releases_its_peers(tmp_path: Path) -> None:
    """A node stops answering; half a second later, while the others stand in a collective with it, a rank elsewhere
    is killed and its replacement's rejoin ends the generation. A rejoin was not read as a death, so nobody's group
    was cut, and the members blocked behind the silent node stood still until it came back (8.1 s for a node back
    after 8 s; pg_timeout, 60 s, for one that never is). The leader then came to declare the silent ranks dead to
    that generation when it fences them (keys.released, a heartbeat timeout after they fell silent: still how a
    stop, a raise or a newcomer's interrupt releases them; tests/unit/test_release.py); a rejoin now names a member
    gone and cuts at once. Either way the untouched members are back within 4 s of the partition. The node comes
    back after the job's end: the run waits for it, and its launcher finds the job done."""
    scenario = tmp_path / "partition-then-kill.toml"
    scenario.write_text(
        'name = "partition-then-kill"\ndescription = "a node silent, then a kill elsewhere"\n[job]\nnproc = 6\n'
        'steps = 120\nglobal_batch = 24\ndataset = "synthetic:768"\nstep_time = 0.03\nckpt_strategy = "blocking"\n'
        'ckpt_every = 20\nnodes = [[0, 1], [2, 3], [4, 5]]\n'
        '[[faults]]\nkind = "partition"\nslot = 2\nstep = 30\nduration = 12.0\n'
        '[[faults]]\nkind = "kill"\nslot = 4\nstep = 30\nafter = 0.5\n')
    report = run(str(scenario), tmp_path)
    assert [f["kind"] for f in report["faults"]] == ["partition", "kill"]
    fired = [json.loads(line)["mono"] for line in (tmp_path / "partition-then-kill" / "faults.jsonl").open()]
    assert fired[1] - fired[0] >= 0.5, fired  # `after`: the kill came while the others stood in the collective
    # The recovery figure counts the first step of any newer generation (the kill's replacement alone, from the
    # checkpoint, was one): what shows the release is when the untouched members joined a newer generation.
    joined = read_logs(tmp_path / "partition-then-kill" / "logs", ("generation_joined",))
    back = {slot: min(e["mono"] for e in joined if e["slot"] == slot and e["generation"] > 1) - fired[0]
            for slot in (0, 1, 5)}
    assert max(back.values()) < 4.0, back


@pytest.mark.slow  # a stuck rank, then the leader killed (35 s); each alone is in the default set
def test_a_member_replaced_while_its_peers_wait_on_a_stuck_rank_releases_them(tmp_path: Path) -> None:
    """A rank's training thread stops (its heartbeat runs, its connections stay open); 0.3 s later the leader is
    killed. Its replacement's rejoin wins the interrupt before anyone declares the death, and the two live members
    stood in their all-reduce with the stuck rank until it was fenced as stuck (progress_timeout, 4 s here; 24 s at
    the scenario default), while the replacement trained alone from the checkpoint: world 1, 10 steps replayed. A
    rejoin names a member gone (its incarnation was replaced): their groups are cut at once, the three rejoin, the
    stuck rank is left out at the last call and replaced once fenced. (Should the leader itself be the rank that
    stops, its kill closes the connections: nobody is blocked, and the run passes the same checks.)"""
    scenario = tmp_path / "stuck-then-leader.toml"
    scenario.write_text(
        'name = "stuck-then-leader"\ndescription = "a rank stuck, then the leader killed"\n[job]\nnproc = 4\n'
        'steps = 200\nglobal_batch = 24\ndataset = "synthetic:768"\nstep_time = 0.03\nckpt_strategy = "blocking"\n'
        'ckpt_every = 20\nprogress_timeout = 4.0\n'
        '[[faults]]\nkind = "stuck"\nrank = 3\nstep = 30\n'
        '[[faults]]\nkind = "kill-leader"\nstep = 30\nafter = 0.3\n')
    report = run(str(scenario), tmp_path)
    assert min(report["world_sizes"]) >= 3 and report["replayed_steps"] == 0, report
    assert all(f["full_recover_s"] is not None for f in report["faults"]), report["faults"]


@pytest.mark.slow  # waits out a 10 s progress_timeout (45 s); the judgement and the wait are unit-tested by default
def test_newcomers_asking_in_while_the_members_wait_on_a_stuck_rank_wait_for_the_members(tmp_path: Path) -> None:
    """A node lost (the job trains on at world 2), then rank 0's training thread stops, and the node is replaced: its
    two newcomers ask in while rank 1 stands in its all-reduce with the stuck rank. Their arrival ends the generation,
    for a cause that cuts no collective. Nothing judged a member stuck in a generation that ended, and a last call
    decided the newcomers alone, from the checkpoint (10 steps replayed), and they trained at world 2 to the job's end
    while both members stood still (random schedule seed 33008: a generation of one, 14 steps back). Now the stuck
    rank is fenced at progress_timeout and declared to its generation, rank 1 cuts its collective and rejoins, and the
    newcomers wait for it meanwhile: the state goes on, nothing replayed, the full world after it."""
    scenario = tmp_path / "stuck-newcomers.toml"
    scenario.write_text(
        'name = "stuck-newcomers"\ndescription = "a node lost, a rank stuck, the node replaced"\n[job]\nnproc = 4\n'
        'nodes = [[0, 1], [2, 3]]\nsteps = 120\nglobal_batch = 24\ndataset = "synthetic:768"\nstep_time = 0.03\n'
        'ckpt_strategy = "blocking"\nckpt_every = 20\nprogress_timeout = 10.0\n'
        '[[faults]]\nkind = "lose"\nslot = 2\nstep = 15\n'
        '[[faults]]\nkind = "stuck"\nrank = 0\nstep = 30\n'
        '[[faults]]\nkind = "replace"\nslot = 2\nstep = 30\nafter = 0.3\n')
    report = run(str(scenario), tmp_path)
    assert report["replayed_steps"] == 0 and report["world_sizes"] == [2, 4], report
    assert all(f["full_recover_s"] is not None for f in report["faults"]), report["faults"]


def test_a_node_lost_with_the_hot_spare_on_it_costs_no_heartbeat_timeout(tmp_path: Path) -> None:
    """The node that runs the job's hot spare is lost (its launcher, two ranks and the spare SIGKILLed). The lost
    ranks are gone by their peers' closed connections; the spare's announcement stood and its heartbeat was not
    stale, so the leader seated it and the generation could not form until its heartbeat timed out (2.1-2.7 s at
    the scenario timing, 5 s at the defaults). A spare on the lost ranks' node must now beat after the leader's
    question to be seated: it does not, and the survivors go on alone within evidence_silence."""
    scenario = tmp_path / "lose-spare-node.toml"
    scenario.write_text(
        'name = "lose-spare-node"\ndescription = "the node with the hot spare lost"\n[job]\nnproc = 4\nsteps = 100\n'
        'global_batch = 24\ndataset = "synthetic:768"\nstep_time = 0.03\nckpt_strategy = "none"\n'
        'nodes = [[0, 1], [2, 3]]\nspares = 1\n[[faults]]\nkind = "lose"\nslot = 0\nstep = 30\n')
    report = run(str(scenario), tmp_path)
    # Below the heartbeat timeout (2 s): a spare waited for costs that timeout (2.1-2.7 s), an answer 0.3-0.7 s.
    assert report["world_sizes"] == [2, 4] and report["faults"][0]["recover_s"] < 1.8, report["faults"]


def test_a_paused_hot_spare_is_not_seated_in_place_of_a_killed_member(tmp_path: Path) -> None:
    """The hot spare is SIGSTOPped (12 s); a second later a member that does not lead is killed. The spare's
    announcement, made before its pause, stood and its heartbeat was not 10 s old, so the leader seated it and the
    generation could not form until its heartbeat timed out (random schedule 33053 at the defaults: 3.5 s). A spare
    the leader saw silent must now beat after the leader's question to be seated: it does not, and the generation
    waits for the killed member's replacement (a cold start: no warm standby, so that the leader decides before the
    replacement comes, and seated the spare before). Sabotage: the doubt only for a lost node's neighbours, as
    before: the spare seated, the kill cost 9.0 s. The replacement's cold start (2.4-3.4 s measured) is given a
    join_timeout of 10 s: at the 3 s default a slow start made the leader decide a world of one first (once in CI-like
    load), a timing the test is not about."""
    scenario = tmp_path / "spare-paused.toml"
    scenario.write_text(
        'name = "spare-paused"\ndescription = "the hot spare paused, then a member killed"\n[job]\nnproc = 2\n'
        'spares = 1\nwarm_standby = 0\nsteps = 150\nglobal_batch = 24\ndataset = "synthetic:768"\n'
        'step_time = 0.03\nckpt_strategy = "none"\nheartbeat_timeout = 10.0\njoin_timeout = 10.0\n[[faults]]\n'
        'kind = "pause"\nslot = 2\nstep = 60\nduration = 12.0\n[[faults]]\nkind = "kill-follower"\nstep = 60\n'
        'after = 1.0\n')
    report = run(str(scenario), tmp_path)
    decided = read_logs(tmp_path / "spare-paused" / "logs", ("generation_decided",))
    after_kill = sorted((e for e in decided if e["generation"] > 1), key=lambda e: e["generation"])[0]
    assert after_kill["members"] == [0, 1], after_kill  # the killed member's replacement, never the paused spare
    assert report["world_sizes"] == [2], report["faults"]


def test_a_leader_that_dies_after_a_lost_node_is_succeeded_at_once(tmp_path: Path) -> None:
    """The lost node's ranks are left out on evidence, long before their heartbeat timeout (6 s here); then the
    leader dies. Its successor saw none of that evidence and waited for the lost ranks until their heartbeats went
    stale (mixed schedule L: 2.3 s at a 2 s timeout); the record now carries them as left out, and the successor
    decides as soon as the dead leader's replacement announces itself."""
    bundled = Path(__file__).parents[2] / "chaos" / "scenarios" / "lose-node.toml"
    scenario = tmp_path / "lose-node-then-leader.toml"
    text = bundled.read_text().replace('name = "lose-node"', 'name = "lose-node-then-leader"')
    text = text.replace('ckpt_strategy = "none"', 'ckpt_strategy = "none"\nheartbeat_timeout = 6.0')
    scenario.write_text(text + '\n[[faults]]\nkind = "kill-leader"\nstep = 45\n')
    report = run(str(scenario), tmp_path)
    lose, leader = (next(f for f in report["faults"] if f["kind"] == kind) for kind in ("lose", "kill-leader"))
    assert lose["recover_s"] < 1.5 and leader["recover_s"] < 2.5, report["faults"]
    assert report["world_sizes"] == [2, 4] and report["generations"] == 3


def test_two_at_once(tmp_path: Path) -> None:
    """Two replacements at once, both forked by the warm standby: one generation change, the world kept."""
    report = run("two-at-once", tmp_path)
    # Said in full when it fails: once, with both cores busy, 3 generations were seen (not reproduced in 20 runs
    # under the same load); which change was the extra one is in the incidents.
    assert report["world_sizes"] == [3] and report["generations"] == 2, (report["incidents"], report["faults"])
    assert all(f["full_recover_s"] < 1.0 for f in report["faults"]), report["faults"]


@pytest.mark.parametrize("nproc", [2, 3])
def test_kill_midreduce(nproc: int, tmp_path: Path) -> None:
    """SIGKILL inside the gradient reduction, its peer(s) blocked in the collective: 2 ranks take the
    asynchronous all-reduce path, 3 the all-to-all + all-gather path; both recover fast and exactly."""
    bundled = Path(__file__).parents[2] / "chaos" / "scenarios" / "kill-midreduce.toml"
    scenario = tmp_path / f"kill-midreduce-{nproc}.toml"
    scenario.write_text(bundled.read_text().replace("nproc = 2", f"nproc = {nproc}"))
    report = run(str(scenario), tmp_path)
    assert report["world_sizes"] == [nproc] and report["restarts"] == 2
    assert all(f["recover_s"] is not None and f["recover_s"] < 2.0 for f in report["faults"]), report["faults"]
