"""@Wrapper without a launcher: in-process restarts with real processes and gloo."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from ftcoord import StoreServer
from tests.helpers.cluster import Forker
from tests.helpers.runs import JOB_MODULE, AllreduceRun
from tests.helpers.wait import wait_until


def start_ranks(forker: Forker, store: str, job_id: str, out: Path, n: int, *args: str) -> list[int]:
    out.mkdir(parents=True, exist_ok=True)
    pids = []
    for slot in range(n):
        env = {"FTCOORD_STORE": store, "FTCOORD_JOB_ID": job_id, "FTCOORD_SLOT": str(slot),
               "FTCOORD_WORLD_SIZE": str(n), "GLOO_SOCKET_IFNAME": "lo"}
        pids.append(forker.spawn(["--out", str(out), *args], out / f"slot{slot}.out", JOB_MODULE, env))
    return pids


def wait_exit(forker: Forker, pids: list[int], timeout: float) -> dict[int, int]:
    wait_until(lambda: all(p in forker.exited() for p in pids), timeout, f"processes {pids} to exit")
    exited = forker.exited()
    return {p: exited[p] for p in pids}


def test_exception_in_one_rank_restarts_every_rank_in_process(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    pids = start_ranks(forker, store_server.address, job_id, tmp_path, 3, "--steps", "30", "--raise-at", "1:10")
    codes = wait_exit(forker, pids, 60)
    assert set(codes.values()) == {0}
    run = AllreduceRun(tmp_path)
    first, second = run.generation_starts(1), run.generation_starts(2)
    assert {e["pid"] for e in first} == {e["pid"] for e in second} == set(pids)  # same processes
    assert {e["world_size"] for e in second} == {3} and {e["start_step"] for e in second} == {10}
    assert [e["result"] for e in run.events("exit")] == ["done"] * 3
    run.assert_correct(30)
    fault = run.events("fault")[0]["mono"]
    latency = max(e["mono"] for e in second) - fault
    print(f"restart latency after an exception (3 ranks): {latency * 1000:.0f} ms")


def test_exhausted_max_restarts_end_with_a_clear_error(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    pids = start_ranks(forker, store_server.address, job_id, tmp_path, 2, "--steps", "20",
                       "--always-raise-slot", "1", "--max-restarts", "2")
    codes = wait_exit(forker, pids, 60)
    assert codes[pids[1]] == 1
    output = (tmp_path / "slot1.out").read_text()
    assert "RestartsExhausted" in output and "max_restarts=2" in output
    assert "planted failure in slot 1" in output
    # The healthy rank carries on alone (min_world_size=1) and finishes.
    assert codes[pids[0]] == 0
    assert AllreduceRun(tmp_path).events("exit")[0]["result"] == "done"


@pytest.mark.timeout(120)
def test_stopped_process_without_launcher_does_not_corrupt_the_job(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    # 400 steps of 20 ms: the survivors are still training when the stopped process wakes up
    # (with 150 they could finish first, and the woken process would only find the job done).
    pids = start_ranks(forker, store_server.address, job_id, tmp_path, 3, "--steps", "400",
                       "--pg-timeout", "4")
    run = AllreduceRun(tmp_path)
    run.wait_step(10)
    os.kill(pids[2], signal.SIGSTOP)
    try:
        # Without a launcher nobody can kill it: the survivors leave at the gloo timeout.
        wait_until(lambda: any(e["world_size"] == 2 for e in run.events("generation")), 30,
                   "the survivors to continue without the stopped process")
    finally:
        os.kill(pids[2], signal.SIGCONT)
    codes = wait_exit(forker, pids, 90)
    assert set(codes.values()) == {0}, codes
    run.assert_correct(400)
    woken = [e for e in run.events("generation") if e["pid"] == pids[2]]
    assert woken[-1]["generation"] > 1, "the woken process should have rejoined a later generation"


def test_a_members_gloo_rendezvous_key_is_the_same_size_whatever_the_world_size(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """gloo's rendezvous with ftcoord's options (ftcoord.wrapper.call.GLOO_RENDEZVOUS_OPTIONS): a member's key is its
    host's
    name and address, not 8 bytes more per peer, so a generation of W members reads ~W² bytes, not ~8·W³ (issue 17).
    One member crashes: the generation of three and the one of two write keys of the same size."""
    pids = start_ranks(forker, store_server.address, job_id, tmp_path, 3, "--steps", "20", "--exit-at", "2:5")
    wait_exit(forker, pids, 60)
    run = AllreduceRun(tmp_path)
    sizes = {(e["world_size"], e["rendezvous_key_bytes"]) for e in run.events("generation")}
    assert {w for w, _ in sizes} == {3, 2}, sizes
    assert len({b for _, b in sizes}) == 1 and next(iter(sizes))[1] < 400, sizes
    run.assert_correct(20)


def test_iteration_is_equal_on_all_ranks_and_strictly_increasing(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    pids = start_ranks(forker, store_server.address, job_id, tmp_path, 2, "--steps", "30",
                       "--raise-at", "0:5", "--raise-at", "1:15", "--raise-at", "0:25")
    assert set(wait_exit(forker, pids, 60).values()) == {0}
    run = AllreduceRun(tmp_path)
    for pid in pids:
        generations = [e["generation"] for e in run.events("generation") if e["pid"] == pid]
        assert generations == [1, 2, 3, 4]
    run.assert_correct(30)
    _ = time  # measured latency is printed by the first test


def test_an_exception_releases_a_peer_blocked_in_a_collective_at_once_whatever_holds_the_group(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """Rank 1 raises while rank 0 waits in an all-reduce; both hold the group and a DDP module, in their
    locals and in an object that outlives the generation (as users do). gloo keeps a referenced group's
    sockets open, so without the release rank 0 stays blocked (until join_timeout shrinks the world to 1,
    then the process-group timeout). With it: released in milliseconds, same PID, world size kept."""
    pids = start_ranks(forker, store_server.address, job_id, tmp_path, 2, "--steps", "30", "--raise-at", "1:10",
                       "--hold-ddp", "--join-timeout", "8", "--pg-timeout", "30", "--heartbeat-timeout", "5")
    codes = wait_exit(forker, pids, 90)
    assert set(codes.values()) == {0}
    run = AllreduceRun(tmp_path)
    fault = run.events("fault")[0]
    peer_restart = next(e for e in run.logs("in_process_restart") if e["slot"] == 0 and e["mono"] > fault["mono"])
    released_s = peer_restart["mono"] - fault["mono"]
    print(f"peer released {released_s * 1000:.0f} ms after the exception")
    assert released_s < 0.5, f"the peer stayed blocked {released_s:.2f}s"
    second = run.generation_starts(2)
    assert {e["world_size"] for e in second} == {2} and {e["pid"] for e in second} == set(pids)
    run.assert_correct(30)
