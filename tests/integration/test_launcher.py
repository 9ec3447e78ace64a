"""ftcoord-launch: restarts, warm standby, fencing, spares, preemption (real processes)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftcoord import StoreServer, connect, job_store, pausepoints
from ftcoord.host.process_state import state, stopped
from ftcoord.host.stack_dump import KERNEL_VIEW
from ftcoord.protocol import keys
from ftcoord.protocol.generations import LeaderClaim
from ftcoord.store.client import read_int
from tests.helpers.cluster import REPO
from tests.helpers.runs import JOB_MODULE, AllreduceRun, launch
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(150)


def finish(proc, timeout: float = 90) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def finished_cleanly(proc, out: Path) -> AllreduceRun:
    """The launcher's run, once it exited 0 (killed if it did not end in time)."""
    try:
        code, said = finish(proc)
    finally:
        proc.kill()
    assert code == 0, said[-3000:]
    return AllreduceRun(out)


def standby_pid(run: AllreduceRun) -> int:
    """The node's warm standby, once it is ready."""
    wait_until(lambda: run.logs("standby_ready"), 30, "the standby to be ready")
    [standby] = run.logs("standby_started")
    return standby["pid"]


def running(pid: int) -> bool:
    """The process exists and has not ended (a zombie has)."""
    return state(pid) not in (None, "Z")


def test_sigkill_is_survived_in_process_and_the_slot_comes_back_from_a_warm_standby(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "200", nproc=2)
    run = AllreduceRun(tmp_path)
    try:
        run.wait_step(30)
        survivor, victim = run.pid_of(0), run.pid_of(1)
        wait_until(lambda: run.logs("standby_ready") or True, 1, "")
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == 0, out[-3000:]
    after = [e for e in run.events("generation") if e["mono"] > killed_at]
    assert after, "no generation after the kill"
    assert {e["pid"] for e in after if e["slot"] == 0} == {survivor}  # restarted in-process
    replacement = [e for e in after if e["slot"] == 1]
    assert replacement and replacement[0]["pid"] != victim
    assert replacement[0]["standby"], "the replacement should have come from the warm standby"
    full = min(e["mono"] for e in after if e["world_size"] == 2 and e["slot"] == 1)
    first_step = min(e["mono"] for e in run.events("step") if e["mono"] > killed_at)
    print(f"SIGKILL: next committed step after {1000 * (first_step - killed_at):.0f} ms, "
          f"full size again after {1000 * (full - killed_at):.0f} ms")
    run.assert_correct(200)
    assert [e["result"] for e in run.events("exit")] == ["done", "done"]
    # The killed process could not remove its empty stacks file (ftcoord.host.stack_dump); its launcher did.
    assert not list((tmp_path / "logs").glob("stacks-*")), list((tmp_path / "logs").glob("stacks-*"))
    # The standby started before the launcher imported torch and reached the store (their imports side by side).
    [standby], [launcher] = run.logs("standby_started"), run.logs("launcher_started")
    assert standby["mono"] < launcher["mono"], (standby, launcher)


def test_a_command_with_interpreter_options_has_its_ranks_forked_from_the_warm_standby(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """`python -u -X faulthandler -m JOB`: the launcher said warm_standby_disabled and started every rank cold (each
    importing torch, seconds); the standby now starts with those options and forks the ranks."""
    run = finished_cleanly(launch(tmp_path, store_server.address, job_id, "--steps", "20", nproc=2,
                                  python_options=("-u", "-X", "faulthandler")), tmp_path)
    assert not run.logs("warm_standby_disabled"), run.logs("warm_standby_disabled")
    first = [e for e in run.events("generation") if e["generation"] == min(g["generation"] for g in
                                                                            run.events("generation"))]
    assert {e["slot"] for e in first} == {0, 1} and all(e["standby"] for e in first), first
    run.assert_correct(20)


def test_a_launcher_that_gives_up_before_its_job_starts_leaves_no_standby_behind(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """The standby starts before the launcher reaches the store; a launcher that then refuses (here: its metrics
    port is taken) leaves no standby warming up for nothing (it kills it on its way out; the kernel would too, as the
    standby dies with its launcher: this shows the user's view, not which of the two did it)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = launch(tmp_path, store_server.address, job_id, "--steps", "20",
                      launcher_args=("--metrics-port", str(port)))
        code, out = finish(proc, timeout=60)
    assert code == 2 and str(port) in out, out[-3000:]
    [standby] = AllreduceRun(tmp_path).logs("standby_started")
    wait_until(lambda: not Path(f"/proc/{standby['pid']}").exists(), 10, "the standby to be gone with its launcher")


def test_a_stopped_standby_holds_up_no_fence_and_forks_no_second_process_for_a_slot(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """The launcher asks its standby for a replacement and collects it at a later tick; it never waits for the answer
    in its loop. A standby that stops answering (SIGSTOP here; a starved node alike) must not hold up a fence of
    another slot (the launcher used to wait 5 s in its loop for the fork), and once it wakes it must not fork a
    second process for a slot the launcher started afresh meanwhile (it used to: a ghost the launcher never knew)."""
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "400", nproc=3)
    run = AllreduceRun(tmp_path)
    try:
        run.wait_step(20)
        standby = standby_pid(run)
        store = job_store(connect(store_server.address), job_id)
        leader = LeaderClaim.parse(store.get(keys.LEADER))
        replaced, fenced = [slot for slot in range(3) if slot != leader.slot]
        os.kill(standby, signal.SIGSTOP)
        wait_until(lambda: stopped(standby), 5, "the standby to stop")
        try:
            killed_at = time.monotonic()
            os.kill(run.pid_of(replaced), signal.SIGKILL)
            wait_until(lambda: [e for e in run.logs("slot_restart_scheduled") if e["slot"] == replaced], 10,
                       "the launcher to ask its standby for the replacement")
            victim, incarnation = run.pid_of(fenced), read_int(store, keys.incarnation(fenced))
            fenced_at = time.monotonic()
            store.set(keys.fence(fenced), f"{leader.term}:{incarnation}")
            [killed] = wait_until(lambda: [e for e in run.logs("rank_fenced_killed") if e["pid"] == victim], 15,
                                  "the launcher to carry out the fence")
            wait_until(lambda: [e for e in run.logs("child_started") if e["slot"] == replaced
                                and e["mono"] > killed_at], 15, "the launcher to start the replacement afresh")
        finally:
            os.kill(standby, signal.SIGCONT)
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == 0, out[-3000:]
    assert killed["mono"] - fenced_at < 1.0, f"the fence waited {killed['mono'] - fenced_at:.2f} s for the standby"
    for slot in (replaced, fenced):
        started = {e["pid"] for e in run.logs("child_started") if e["slot"] == slot}
        ran = {e["pid"] for e in run.events("generation") if e["slot"] == slot}
        assert ran <= started, f"slot {slot} was held by a process its launcher never started: {ran - started}"
    run.assert_correct(400)


def test_a_killed_standby_takes_no_rank_with_it(store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    """Every rank of a node is forked from its standby. They used to die with it (a parent-death signal), so the
    standby's death (the kernel's pick when memory runs out, say) cost the node every rank and a cold start. They die
    with their launcher instead: training goes on untouched, and a new standby warms up."""
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "300", nproc=2)
    run = AllreduceRun(tmp_path)
    try:
        run.wait_step(20)
        standby = standby_pid(run)
        ranks = {run.pid_of(0), run.pid_of(1)}
        os.kill(standby, signal.SIGKILL)
        wait_until(lambda: len(run.logs("standby_started")) == 2, 15, "the launcher to start a new standby")
        run.wait_step(run.max_step() + 20)
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == 0, out[-3000:]
    assert not run.logs("child_exited"), "a rank died with the standby"
    assert {e["pid"] for e in run.events("generation")} == ranks
    run.assert_correct(300)


def test_a_killed_launcher_takes_its_ranks_and_standby_with_it(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """No rank outlives its launcher, however it died (SIGKILL here: no handler runs), nor its standby."""
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "100000", nproc=2)
    run = AllreduceRun(tmp_path)
    try:
        run.wait_step(20)
        standby = standby_pid(run)
        left = {run.pid_of(0), run.pid_of(1), standby}
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()  # not read: ranks outliving it would hold it open
    try:
        wait_until(lambda: not [pid for pid in left if running(pid)], 10, "the ranks and the standby to die with it")
    finally:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_hung_rank_is_fenced_by_its_launcher_before_the_gloo_timeout(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "200", "--pg-timeout", "60",
                  "--heartbeat-timeout", "1.0", nproc=3)
    run = AllreduceRun(tmp_path)
    try:
        run.wait_step(30)
        victim = run.pid_of(2)
        stopped_at = time.monotonic()
        os.kill(victim, signal.SIGSTOP)
        recovered = run.seconds_until("generation", stopped_at, 30, "survivors to form a new generation")
        assert recovered < 10, f"took {recovered:.1f}s: the gloo timeout (60 s) must not be what ends it"
        print(f"SIGSTOP: new generation after {recovered * 1000:.0f} ms (heartbeat_timeout 1.0 s)")
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == 0, out[-3000:]
    fenced = run.logs("rank_fenced_killed")
    assert [e["pid"] for e in fenced] == [victim]
    run.assert_correct(200)


def test_a_fence_of_a_deposed_leader_term_is_not_carried_out(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """A leader that woke from a pause after a newer term took over may still write a fence: its
    launcher must not kill a healthy rank on it. The current term's fence is carried out."""
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "400", nproc=2)
    run = AllreduceRun(tmp_path)
    try:
        run.wait_step(20)
        store = job_store(connect(store_server.address), job_id)
        term = LeaderClaim.parse(store.get(keys.LEADER)).term
        victim, incarnation = run.pid_of(1), read_int(store, keys.incarnation(1))
        store.set(keys.fence(1), f"{term - 1}:{incarnation}")
        wait_until(lambda: run.logs("fence_ignored"), 5, "the launcher to ignore the deposed term's fence")
        time.sleep(0.3)
        assert Path(f"/proc/{victim}").exists(), "a healthy rank was killed on a deposed leader's fence"
        store.set(keys.fence(1), f"{term}:{incarnation}")
        wait_until(lambda: [e for e in run.logs("rank_fenced_killed") if e["pid"] == victim], 5,
                   "the launcher to carry out the current term's fence")
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == 0, out[-3000:]
    run.assert_correct(400)


@pytest.mark.parametrize(("point", "where", "reached"), [
    (pausepoints.BEFORE_RENDEZVOUS, "before the rendezvous", "function_started"),
    (pausepoints.IN_RENDEZVOUS, "inside the rendezvous", "process_group_creating"),
])
def test_a_member_dying_at_the_rendezvous_costs_no_process_group_timeout(
    store_server: StoreServer, job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, where: str,
    reached: str,
) -> None:
    """Slot 1 stops at the first generation's rendezvous (a pause point) and is killed there; the other member leaves
    on the leader's interrupt instead of a timeout. Before it: slot 0 waits to meet it. Inside it (every member met,
    slot 1 had not created its process group): slot 0 is blocked in torch's process-group creation, in C++, waiting
    for slot 1's address; its store connection and sockets are cut (seen in a random schedule: a member stuck there
    for 300 s, and every generation after it waiting join_timeout for it)."""
    markers = tmp_path / "pauses"
    markers.mkdir()
    monkeypatch.setenv(pausepoints.PAUSE_AT_ENV, f"{point}@1")
    monkeypatch.setenv(pausepoints.MARKERS_ENV, str(markers))
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "60", "--pg-timeout", "60", nproc=2)
    run = AllreduceRun(tmp_path)
    try:
        marker = markers / point
        wait_until(lambda: marker.exists() and marker.read_text(), 60, f"slot 1 to stop {where}")
        wait_until(lambda: [e for e in run.logs(reached) if e["slot"] == 0], 30, f"slot 0's {reached}")
        killed_at = time.monotonic()
        os.kill(int(marker.read_text()), signal.SIGKILL)
        first = run.seconds_until("step", killed_at, 75, "a step of both slots after the kill",
                                  where=lambda e: e["world_size"] == 2)
        assert first < 10, f"{first:.1f}s: slot 0 must leave on the interrupt, not a 60 or 300 s timeout"
        print(f"member killed {where}: both slots training again after {first * 1000:.0f} ms")
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == 0, out[-3000:]
    run.assert_correct(60)


def test_stalled_training_thread_is_treated_as_hung(store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "120", "--stall-at", "1:20",
                  "--progress-timeout", "1.5", nproc=2)
    try:
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == 0, out[-3000:]
    run = AllreduceRun(tmp_path)
    declared = run.logs("member_declared_dead")
    assert declared and declared[0]["reason"] == "hung" and declared[0]["slot"] == 1
    (fenced,) = run.logs("rank_fenced_killed")
    # Before the kill, the process wrote every stack (ftcoord.host.stack_dump): the training thread's, where it stalled.
    (dumped,) = run.logs("rank_stacks_dumped")
    assert dumped["pid"] == fenced["pid"] and dumped["outcome"] == "dumped", dumped
    stacks = Path(dumped["file"]).read_text()
    assert 'allreduce_job.py", line' in stacks and "in train" in stacks, stacks
    # Below them, the kernel's view of each thread: the stalled main thread asleep (in its sleep's kernel function).
    kernel_view = stacks.partition(KERNEL_VIEW)[2]
    asleep = re.compile(rf"{fenced['pid']} [^:]+: S in \w+, [0-9.]+ s of CPU")
    assert asleep.search(kernel_view), stacks
    assert asleep.fullmatch(dumped["main_thread"]), dumped
    # A process that ended of itself left no empty file (slot 0, and slot 1's replacement).
    assert [p.name for p in (tmp_path / "logs").glob("stacks-*")] == [Path(dumped["file"]).name]
    run.assert_correct(120)


@contextlib.contextmanager
def stuck_outside(tmp_path: Path, address: str, job_id: str, steps: int, progress_timeout: float,
                  launcher_args: tuple[str, ...] = ()) -> Iterator[tuple[subprocess.Popen, AllreduceRun, dict]]:
    """Three slots; slot 2's training thread sticks at step 20 (its heartbeat runs on), then slot 1 is SIGKILLed, so
    the generation ends for that cause and the next is decided without slot 2. Yields (launcher, run, the stall's
    event); the launcher is killed on the way out, whatever happened."""
    proc = launch(tmp_path, address, job_id, "--steps", str(steps), "--stall-at", "2:20",
                  "--progress-timeout", str(progress_timeout), nproc=3, launcher_args=launcher_args)
    try:
        run = AllreduceRun(tmp_path)
        stall = wait_until(lambda: run.events("fault"), 60, "slot 2 to stall")[0]
        os.kill(run.pid_of(1), signal.SIGKILL)
        yield proc, run, stall
    finally:
        proc.kill()


def test_a_rank_stuck_when_its_generation_ended_for_another_cause_is_fenced_and_replaced(
        store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    """Slot 2's training thread sticks at step 20 (its heartbeat runs on); before the progress timeout a peer is
    SIGKILLed, so the generation ends for that cause and the next is decided without slot 2, which never comes
    back to announce itself. Nothing judged it there (random schedule, seed 404): every generation change waited
    join_timeout for it, its capacity was lost, and after the job its launcher waited for it. Now it is fenced
    once outside and still for the progress timeout; its replacement joins and the job ends."""
    progress_timeout = 2.0
    with stuck_outside(tmp_path, store_server.address, job_id, 400, progress_timeout) as (proc, run, stall):
        fenced = wait_until(lambda: [e for e in run.logs("rank_fenced_killed") if e["pid"] == stall["pid"]], 30,
                            "the stuck rank, outside every generation since the kill, to be fenced")[0]
        code, out = finish(proc)
    assert code == 0, out[-3000:]
    judged = run.logs("outsider_stuck")
    assert [e["slot"] for e in judged] == [2], judged
    waited = fenced["mono"] - stall["mono"]
    print(f"stuck outside its generation: fenced {waited:.2f} s after it stuck")
    assert waited <= 2 * progress_timeout + 2.0, f"fenced {waited:.2f} s after it stuck"
    back = [e for e in run.events("generation") if e["slot"] == 2 and e["pid"] != stall["pid"]]
    assert back and back[0]["world_size"] == 3, "the replacement of the stuck rank never joined"
    run.assert_correct(400)


def test_a_child_still_running_after_the_job_is_done_is_ended_after_the_grace_period(
        store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    """As above, with the progress timeout too long to judge the stuck rank before the job ends: the job finishes
    without it, and its launcher, which waits for every child, waited with it (the stall sleeps an hour). Now it
    ends it once the grace period after the job's end ran out, and exits 0: the job is complete."""
    grace = 1.0
    with stuck_outside(tmp_path, store_server.address, job_id, 60, 600, ("--grace", str(grace))) as (proc, run, stall):
        code, out = finish(proc, timeout=60)
    assert code == 0, out[-3000:]
    ended = run.logs("child_ended_after_job_end")
    assert [(e["slot"], e["pid"]) for e in ended] == [(2, stall["pid"])], ended
    done = max(e["mono"] for e in run.logs("child_finished"))
    print(f"the stuck child was ended {ended[0]['mono'] - done:.2f} s after the last child finished")
    assert ended[0]["mono"] - done <= grace + 1.5  # DONE_POLL_S, a tick
    assert not run.logs("outsider_stuck")
    run.assert_correct(60)


def test_a_child_still_running_after_the_job_stopped_is_ended_after_the_grace_period(
        store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    """As above, but the job ends by a stop asked by one rank's own SIGTERM (as a stop asked on another node reaches
    this launcher's members), not by finishing: the launcher is not terminating, its members stop and exit 0, and
    the stuck child kept it waiting (it looked at keys.DONE only). Now a stop of this run ends it the same way."""
    grace = 1.0
    with stuck_outside(tmp_path, store_server.address, job_id, 100_000, 600, ("--grace", str(grace))) as (
            proc, run, stall):
        wait_until(lambda: [e for e in run.events("generation") if e["world_size"] == 2 and e["slot"] == 1], 60,
                   "slot 1's replacement to train without the stuck slot 2")
        os.kill(run.pid_of(0), signal.SIGTERM)
        code, out = finish(proc, timeout=60)
    assert code == 0, out[-3000:]
    assert sorted(e["slot"] for e in run.events("exit") if e["result"] == "stopped") == [0, 1]
    ended = run.logs("child_ended_after_job_end")
    assert [(e["slot"], e["pid"]) for e in ended] == [(2, stall["pid"])], ended
    stopped = max(e["mono"] for e in run.logs("child_finished"))
    print(f"the stuck child was ended {ended[0]['mono'] - stopped:.2f} s after the last child stopped")
    assert ended[0]["mono"] - stopped <= grace + 1.5  # DONE_POLL_S, a tick


def test_a_replacement_stopped_before_it_registered_is_not_waited_for_and_grows_the_job_back_when_continued(
        store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    """Slot 1 is SIGKILLed; its replacement stops itself (SIGSTOP) before it registers. Its launcher kept saying it
    was on its way, so the survivors waited for it up to barrier_timeout (20 s here, 120 s by default; a chaos hang
    that hit a replacement in its first moments cost its job 6 s, as long as it was stopped). A stopped child is on
    nobody's way: the survivors go on without it a heartbeat timeout later, and it grows the job back once
    continued."""
    heartbeat_timeout = 1.0
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "300", "--stop-replacement-of", "1",
                  "--heartbeat-timeout", str(heartbeat_timeout), nproc=3)
    run = AllreduceRun(tmp_path)
    try:
        run.wait_step(20)
        victim = run.pid_of(1)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        stopped = wait_until(lambda: [e for e in run.events("fault") if e["fault"] == "stop-before-register"], 30,
                             "slot 1's replacement to stop itself before it registers")[0]
        smaller = wait_until(lambda: [e for e in run.events("step") if e["world_size"] == 2], 30,
                             "the survivors to train without the stopped replacement")[0]
        os.kill(stopped["pid"], signal.SIGCONT)
        wait_until(lambda: [e for e in run.events("generation") if e["pid"] == stopped["pid"]], 30,
                   "the continued replacement to join")
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == 0, out[-3000:]
    waited = smaller["mono"] - killed
    print(f"trained without the stopped replacement {waited:.2f} s after the kill")
    assert waited <= 2 * heartbeat_timeout + 1.5, f"waited {waited:.2f} s for a stopped replacement"
    back = [e for e in run.events("generation") if e["pid"] == stopped["pid"]]
    assert back[0]["world_size"] == 3, back
    run.assert_correct(300)


def test_a_leader_paused_while_its_peer_is_killed_is_fenced_before_the_next_decision_not_after(
        store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    """Two slots: the leader (slot 0) is SIGSTOPped and slot 1 SIGKILLed at once (a random schedule: a 6 s
    pause-leader with a kill at one step). Slot 1's replacement ends the generation (it rejoins) before anyone
    judged slot 0; once slot 0 is silent it leads. No member of the ended generation is alive, so a decision waits
    for the job's target size; slot 0, a member of a generation no longer running, was fenced only after a
    generation was decided without it: join_timeout later (5 s here), then grown back. Now it is fenced as soon as
    it is silent, its replacement is awaited, and the job goes on at full size in one change."""
    join_timeout = 5.0
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "300", "--heartbeat-timeout", "1.0",
                  "--join-timeout", str(join_timeout), nproc=2)
    run = AllreduceRun(tmp_path)
    try:
        run.wait_step(20)
        paused, killed = run.pid_of(0), run.pid_of(1)
        os.kill(paused, signal.SIGSTOP)
        os.kill(killed, signal.SIGKILL)
        t0 = time.monotonic()
        full = wait_until(lambda: [e for e in run.events("step") if e["world_size"] == 2
                                   and e["pid"] not in (paused, killed)], 60,
                          "both replacements to train together")[0]
        code, out = finish(proc)
    finally:
        proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(paused, signal.SIGKILL)  # fenced and killed by its launcher, unless the test failed first
    assert code == 0, out[-3000:]
    took = full["mono"] - t0
    print(f"back to full size {took:.2f} s after the pause and the kill")
    assert took < join_timeout, f"{took:.2f} s: waited join_timeout for the paused member"
    assert not [e for e in run.events("step") if e["world_size"] == 1 and e["mono"] > t0], "decided without it"
    run.assert_correct(300)


def test_a_process_left_out_at_a_last_call_is_not_waited_for_at_every_later_change(
        store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    """Slot 2 is stuck outside every generation (as above; the progress timeout too long to fence it in this test).
    The change after slot 1's first kill waits join_timeout for it, as for any slow process; the change after the
    second kill did too (random schedule, seed 777: four changes in a row, 3 s each). Now it does not."""
    join_timeout = 3.0
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "500", "--stall-at", "2:20",
                  "--progress-timeout", "600", "--join-timeout", str(join_timeout), nproc=3,
                  launcher_args=("--grace", "1"))
    run = AllreduceRun(tmp_path)
    recoveries = []
    try:
        wait_until(lambda: run.events("fault"), 60, "slot 2 to stall")
        killed: list[int] = []
        for _ in range(2):
            victim = run.pid_of(1) if not killed else wait_until(
                lambda: [e for e in run.events("step") if e["slot"] == 1 and e["pid"] not in killed], 60,
                "slot 1's replacement to train")[0]["pid"]
            killed.append(victim)
            killed_at = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            recoveries.append(wait_until(lambda at=killed_at: [e["mono"] for e in run.events("step") if e["mono"] > at],
                                         60, "a step after the kill")[0] - killed_at)
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == 0, out[-3000:]
    print(f"recoveries with a process stuck outside: {[round(r, 2) for r in recoveries]} s")
    assert recoveries[0] >= join_timeout, "the first change should wait join_timeout for the live process"
    assert recoveries[1] < join_timeout / 2, f"the second change waited for it again: {recoveries[1]:.2f} s"
    run.assert_correct(500)


def test_a_slot_killed_again_and_again_is_replaced_at_once_every_time(store_server: StoreServer, job_id: str,
                                                                      tmp_path: Path) -> None:
    """Each replacement of slot 1 comes up, trains, and is SIGKILLed: four faults, not a crash loop. Every
    replacement starts at once; before, the delay grew with the slot's restarts (0.25, 0.5, 1 s...) and every
    member waited for it (ftcoord.launcher.restart_delay)."""
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "600", nproc=2,
                  launcher_args=("--max-restarts", "8"))
    run = AllreduceRun(tmp_path)
    killed: list[int] = []
    try:
        for _ in range(4):
            trained = wait_until(lambda: [e for e in run.events("step") if e["slot"] == 1 and e["pid"] not in killed],
                                 60, "slot 1's next process to train")
            killed.append(trained[0]["pid"])
            os.kill(killed[-1], signal.SIGKILL)
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == 0, out[-3000:]
    delays = [e["delay_s"] for e in run.logs("slot_restart_scheduled")]
    assert delays == [0.0] * 4, f"a replacement of a process that had come up waited: {delays}"
    run.assert_correct(600)


def test_killing_the_leader_process_is_survived(store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    from ftcoord import connect, job_store

    proc = launch(tmp_path, store_server.address, job_id, "--steps", "200", nproc=3)
    run = AllreduceRun(tmp_path)
    try:
        run.wait_step(30)
        store = job_store(connect(store_server.address), job_id)
        leader_slot = int(store.get("leader").decode().split(":")[1])
        os.kill(run.pid_of(leader_slot), signal.SIGKILL)
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == 0, out[-3000:]
    elections = run.logs("leader_elected")
    assert len({(e["slot"], e["incarnation"]) for e in elections}) >= 2
    run.assert_correct(200)


def test_hot_spare_takes_over_a_dead_slot_at_once(store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    from ftcoord import connect, job_store

    # No warm standby: the replacement is a cold start, so the spare (already waiting) is
    # what the next generation can use at once; with a standby either may win the race.
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "200", nproc=2,
                  launcher_args=("--spares", "1", "--warm-standby", "0"))
    run = AllreduceRun(tmp_path)
    store = job_store(connect(store_server.address), job_id)
    try:
        run.wait_step(30)
        current = run.events("generation")[-1]
        # The third process waits for the next generation (whichever slot came up last).
        waiting = wait_until(lambda: [j for j in _joiners(store, current["generation"] + 1)
                                      if j not in current["members"]], 30, "the hot spare to wait")[0]
        victim = current["members"][1]
        killed_at = time.monotonic()
        os.kill(run.pid_of(victim), signal.SIGKILL)
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == 0, out[-3000:]
    after = [e for e in run.events("generation") if e["mono"] > killed_at]
    assert waiting in after[0]["members"] and after[0]["world_size"] == 2, f"the spare should step in: {after[0]}"
    assert after[0]["start_step"] >= 30, "the state must survive: a member that held it stays in"
    run.assert_correct(200)
    assert len(run.events("exit")) == 3  # the spare and the replaced slot exit cleanly too


def _joiners(store, generation: int) -> list[int]:
    import json

    if not store.check([f"gen/{generation}/joiners"]):
        return []
    return [json.loads(line)["slot"] for line in store.get(f"gen/{generation}/joiners").decode().splitlines()]


def test_exhausted_restarts_stop_the_node_with_a_clear_error(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "200", "--exit-at", "1:10",
                  "--exit-at", "1:20", nproc=2, launcher_args=("--max-restarts", "1"))
    try:
        code, out = finish(proc)
    finally:
        proc.kill()
    assert code == 3
    assert "slot 1 died 2 times (max_restarts=1; last exit code 137)" in out


def test_sigterm_to_the_launcher_stops_every_rank_through_should_stop(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "100000", nproc=2)
    run = AllreduceRun(tmp_path)
    try:
        run.wait_step(20)
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc, 60)
    finally:
        proc.kill()
    assert code == 0, out[-3000:]
    stopped = run.events("stopped")
    assert {e["slot"] for e in stopped} == {0, 1}
    # A rank can see the stop before its generation is interrupted and return once more from the
    # next generation: what counts is where each rank finally stopped.
    final = {e["slot"]: e["step"] for e in sorted(stopped, key=lambda e: e["mono"])}
    assert len(set(final.values())) == 1, f"ranks stopped at different steps: {stopped}"
    assert [e["result"] for e in run.events("exit")] == ["stopped", "stopped"]


def test_a_rank_hung_as_the_launcher_stops_is_fenced_and_killed_not_waited_for(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """A rank SIGSTOPped (never continued), then SIGTERM to the launcher: the others stand in a collective with it
    until the leader fences it (heartbeat_timeout), then stop. The stopping launcher ignored the fence and waited for
    the hung rank for its grace period (30 s), then killed it and exited 143; it now kills it once fenced, as at any
    other time, and exits 0: the job stopped cleanly, and a relaunch resumes it."""
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "100000", "--heartbeat-timeout", "1.0",
                  "--pg-timeout", "60", nproc=3)
    run = AllreduceRun(tmp_path)
    try:
        run.wait_step(20)
        victim = run.pid_of(2)
        os.kill(victim, signal.SIGSTOP)
        time.sleep(0.3)  # the stop comes while the others stand in a collective with the hung rank
        terminated_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc, 60)
        took = time.monotonic() - terminated_at
    finally:
        proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    assert code == 0, out[-3000:]
    assert took < 15, f"the launcher stopped {took:.1f} s after SIGTERM: it waited for the hung rank"
    assert [e["pid"] for e in run.logs("rank_fenced_killed")] == [victim]
    assert {e["slot"] for e in run.events("exit") if e["result"] == "stopped"} == {0, 1}


def test_job_restart_policy_restarts_every_process(store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    run = finished_cleanly(launch(tmp_path, store_server.address, job_id, "--steps", "60", "--exit-at", "1:20",
                                  nproc=2, launcher_args=("--restart-policy", "job")), tmp_path)
    pids_by_slot = {}
    for e in run.events("generation"):
        pids_by_slot.setdefault(e["slot"], set()).add(e["pid"])
    assert all(len(p) == 2 for p in pids_by_slot.values()), pids_by_slot  # every slot got a new process
    assert run.logs("job_restart")


def test_job_restart_policy_restarts_every_node(store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    """Two launchers (nodes of two slots), `--restart-policy job`: slot 1 on node A dies; node B's launcher restarts
    its processes too (ftcoord.launcher.job_restarts), so every process of the job is new. Before, each launcher
    restarted
    only its own node's, and node B's carried on and healed node A's new processes from memory: on several nodes
    the whole-job baseline lost no state at all (mixed schedule E)."""
    nodes = {"a": (0, ("--exit-at", "1:20")), "b": (2, ())}
    # 150 steps: node B's processes, left at world size 2, train on for seconds past step 20 (its launcher follows
    # within FENCE_POLL_S), so they are still there to be restarted on a slow machine.
    procs = [launch(tmp_path / name, store_server.address, job_id, "--steps", "150", *job_args, nproc=2,
                    launcher_args=("--restart-policy", "job", "--world-size", "4", "--first-slot", str(first)))
             for name, (first, job_args) in nodes.items()]
    try:
        results = [finish(proc) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for code, out in results:
        assert code == 0, out[-3000:]
    a, b = AllreduceRun(tmp_path / "a"), AllreduceRun(tmp_path / "b")
    pids_by_slot: dict[int, set[int]] = {}
    for run in (a, b):
        for e in run.events("generation"):
            pids_by_slot.setdefault(e["slot"], set()).add(e["pid"])
    assert sorted(pids_by_slot) == [0, 1, 2, 3]
    assert all(len(p) == 2 for p in pids_by_slot.values()), f"not every process was restarted: {pids_by_slot}"
    a.assert_correct(150)
    b.assert_correct(150)
    assert [e["number"] for e in a.logs("job_restart")] == [1] and not a.logs("job_restart_followed")
    assert [e["number"] for e in b.logs("job_restart_followed")] == [1] and not b.logs("job_restart")


def test_two_launchers_under_srun_form_one_job_from_slurms_variables(store_server: StoreServer, job_id: str,
                                                                     tmp_path: Path) -> None:
    """What `srun --ntasks-per-node=1 ftcoord-launch --nproc-per-node 2 -- ...` gives each node's launcher: the job
    id (SLURM_JOB_ID), the step's nodes and this node's index. No --job-id, --store (FTCOORD_STORE), --first-slot or
    --world-size: two launchers form one job of world size 4, and each child reads RANK, WORLD_SIZE, LOCAL_RANK,
    and LOCAL_WORLD_SIZE as torchrun would set them (MASTER_ADDR and MASTER_PORT are not set: no process group of the
    script's own)."""
    slurm_job = re.sub(r"[^A-Za-z0-9._-]", "-", job_id)
    procs = []
    for node in (0, 1):
        env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(REPO),
               "FTCOORD_STORE": store_server.address, "SLURM_JOB_ID": slurm_job, "SLURM_NNODES": "2",
               "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": str(node),
               "SLURM_PROCID": str(node)}
        for name in ("FTCOORD_JOB_ID", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)
        out = tmp_path / f"node{node}"
        command = [sys.executable, "-m", "ftcoord.launcher.main", "--nproc-per-node", "2", "--log-dir",
                   str(out / "logs"), "--", sys.executable, "-m", JOB_MODULE, "--out", str(out), "--steps", "40"]
        procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    try:
        results = [finish(proc) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for code, said in results:
        assert code == 0, said[-3000:]
    runs = [AllreduceRun(tmp_path / f"node{node}") for node in (0, 1)]
    for node, run in enumerate(runs):
        started = {e["slot"]: e["env"] for e in run.events("started")}
        assert sorted(started) == [2 * node, 2 * node + 1], started
        for slot, seen in started.items():
            assert seen == {"RANK": str(slot), "WORLD_SIZE": "4", "LOCAL_RANK": str(slot - 2 * node),
                            "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": None, "MASTER_PORT": None}, seen
        assert {e["world_size"] for e in run.events("generation")} == {4}
        run.assert_correct(40)
    (launched,) = runs[1].logs("launcher_started")
    assert launched["slots"] == [2, 3], launched


def test_each_rank_is_titled_with_its_job_and_slot(store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    """Every rank is forked from the same warm standby, with its command line; `ps` tells them apart by the title
    each sets: its job, its slot, then the command it runs."""
    proc = launch(tmp_path, store_server.address, job_id, "--steps", "100000", nproc=2)
    try:
        run = AllreduceRun(tmp_path)
        started = wait_until(lambda: {e["slot"]: e["pid"] for e in run.events("generation")} if len(
            {e["slot"] for e in run.events("generation")}) == 2 else None, 60, "both ranks in a generation")
        for slot, pid in started.items():
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            assert title.startswith(f"ftcoord {job_id} slot {slot}: python") and JOB_MODULE in title, title
        os.kill(proc.pid, signal.SIGTERM)
        code, said = finish(proc)
        assert code == 0, said[-3000:]
    finally:
        proc.kill()
