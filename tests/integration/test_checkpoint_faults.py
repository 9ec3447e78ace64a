"""Checkpoints under real faults, end to end: `python -m training` under `ftcoord-launch`, real
SIGKILLs of whole jobs, a real full disk (tmpfs), real byte flips."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from chaos.run.planted import CKPT_CRASH_ENV
from ftcoord import StoreServer
from ftcoord.host import scratch
from tests.helpers.disk import small_disk
from tests.helpers.train_runs import TrainingRun, train_args
from tests.helpers.wait import wait_until
from training.checkpoint import atomic

pytestmark = pytest.mark.timeout(300)


def generation_starts(run: TrainingRun) -> list[dict]:
    return [r for r in run.records() if r["kind"] == "generation"]


def images(job_id: str) -> list[Path]:
    return sorted(scratch.job_dir(job_id).glob("slot*/flash/meta.pt"))


def test_a_failed_job_leaves_no_flash_image(store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    args = train_args(400, "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-strategy", "flash", "--ckpt-every", "5",
                      "--step-time", "0.02")
    run = TrainingRun.launch(tmp_path / "run", store_server.address, job_id, args,
                             launcher_args=("--max-restarts", "0"))
    run.wait_step(12)
    wait_until(lambda: images(job_id), 30, "a flash image in the job's scratch")
    rank0 = next(r["pid"] for r in reversed(run.records()) if r["kind"] == "step" and r["rank"] == 0)
    os.kill(rank0, signal.SIGKILL)  # max-restarts 0: the job fails
    code, out = run.wait(120)
    assert code == 3, out[-2000:]
    assert not images(job_id) and not scratch.job_dir(job_id).exists(), "a failed job must take its images along"


def test_flash_images_resume_their_own_lineage_and_never_a_fresh_run(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """kill -9 of the whole job leaves the image; a relaunch with the same directory resumes from it;
    a fresh run of the same job id with a new, empty directory starts at step 0 beside it."""
    def args(ckpt: str, steps: int = 200) -> list[str]:
        return train_args(steps, "--ckpt-dir", str(tmp_path / ckpt), "--ckpt-strategy", "flash", "--ckpt-every", "10",
                          "--step-time", "0.03")

    first = TrainingRun.launch(tmp_path / "first", store_server.address, job_id, args("ckpt-a"))
    first.wait_step(45)
    first.kill()  # the whole job, launcher included: nothing cleans up
    assert images(job_id), "a whole-job kill -9 leaves the image for the relaunch"
    relaunch = TrainingRun.launch(tmp_path / "relaunch", store_server.address, job_id, args("ckpt-a"))
    relaunch.wait_step(60)
    # The heal source's record: the member that loaded the image (its peers received the state from it, and may
    # write their records first: CI, once).
    resumed = next(r for r in generation_starts(relaunch) if r["rank"] == r["heal_source"])
    assert (resumed["loaded_from"] or "").startswith("flash:") and resumed["start_step"] >= 40, resumed
    relaunch.kill()
    assert images(job_id)
    fresh = TrainingRun.launch(tmp_path / "fresh", store_server.address, job_id, args("ckpt-b", steps=40))
    code, out = fresh.wait(180)
    assert code == 0, out[-2000:]
    start = generation_starts(fresh)[0]
    assert start["start_step"] == 0 and start["loaded_from"] is None, start
    assert "flash_image_stale" in out
    proof = fresh.verify(40)
    assert proof.passed, proof.problems


@pytest.mark.parametrize("strategy", ["blocking", "overlapped", "flash"])
def test_a_full_disk_stops_the_job_with_a_message_about_space(
    store_server: StoreServer, job_id: str, tmp_path: Path, strategy: str
) -> None:
    with small_disk(tmp_path / "disk", 512, leave_free_kib=24) as disk:
        ckpt = disk / "ckpt"
        args = train_args(200, "--ckpt-dir", str(ckpt), "--ckpt-strategy", strategy, "--ckpt-every", "4",
                          "--ckpt-max-failures", "2", "--step-time", "0.01")
        code, out = TrainingRun.launch(tmp_path / "run", store_server.address, job_id, args).wait(180)
        assert code != 0, out[-3000:]
        assert "No space left on device" in out and "MiB free" in out and str(ckpt) in out, out[-3000:]
        assert "not restarting" in out  # the job stopped: the launcher did not loop restarting slots
        assert not list(ckpt.glob("*.tmp-*")), f"temp directories left: {list(ckpt.glob('*.tmp-*'))}"
        records = TrainingRun(tmp_path / "run").records()
        assert not [r for r in records if r["kind"] == "checkpoint"], "a save that never reached disk was counted"
        restarts = [line for line in out.splitlines() if "in_process_restart" in line]
        assert len(restarts) <= 2, restarts


def test_all_checkpoints_corrupt_refuses_names_them_and_deletes_nothing(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    first = TrainingRun.launch(tmp_path / "first", store_server.address, f"{job_id}-a",
                               train_args(40, "--ckpt-dir", str(ckpt), "--ckpt-every", "10"))
    code, out = first.wait()
    assert code == 0, out[-2000:]
    for _, path in atomic.step_dirs(ckpt):
        payload = path / atomic.PAYLOAD
        data = bytearray(payload.read_bytes())
        data[len(data) // 2] ^= 0xFF
        payload.write_bytes(bytes(data))
    before = {str(p): p.read_bytes() for p in sorted(ckpt.rglob("*")) if p.is_file() and p.name != ".lock"}
    names = [p.name for _, p in atomic.step_dirs(ckpt)]
    assert len(names) == 3
    again = TrainingRun.launch(tmp_path / "again", store_server.address, f"{job_id}-b",
                               train_args(60, "--ckpt-dir", str(ckpt), "--ckpt-every", "10"))
    code, out = again.wait()
    assert code != 0, out[-2000:]
    assert all(name in out for name in names) and "sha256" in out and "--ckpt-start-over" in out, out[-3000:]
    after = {str(p): p.read_bytes() for p in sorted(ckpt.rglob("*")) if p.is_file() and p.name != ".lock"}
    assert after == before, "a refused resume must not delete, prune or overwrite anything"
    over = TrainingRun.launch(tmp_path / "over", store_server.address, f"{job_id}-c",
                              train_args(60, "--ckpt-dir", str(ckpt), "--ckpt-every", "10", "--ckpt-start-over"))
    code, out = over.wait()
    assert code == 0, out[-2000:]
    assert generation_starts(over)[0]["start_step"] == 0
    assert sorted(p.name for p in ckpt.glob("*.rejected")) == sorted(f"{n}.rejected" for n in names)


def test_a_rank_hung_inside_a_checkpoint_commit_is_fenced_at_the_hang_detection_bound(
    store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """Rank 0 stops itself half-way through writing a checkpoint (inside `call.atomic()`). A commit is
    crash-safe, so its launcher kills it as soon as the leader declares it hung (heartbeat timeout 1 s
    here), not after a grace period; the interrupted checkpoint leaves nothing loadable behind."""
    marker = tmp_path / "stopped"
    args = train_args(120, "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "10", "--step-time", "0.02")
    run = TrainingRun.launch(tmp_path / "run", store_server.address, job_id, args,
                             env={CKPT_CRASH_ENV: f"stop:{marker}:20"})
    code, out = run.wait(180)
    assert code == 0, out[-3000:]
    pid, stopped_at = marker.read_text().split()
    fenced = [e for e in run.logs("rank_fenced_killed") if e["pid"] == int(pid)]
    assert fenced, "the hung rank was never fenced"
    waited = fenced[0]["mono"] - float(stopped_at)
    print(f"hung inside a commit: fenced after {waited:.2f} s")
    assert waited <= 1.0 + 1.5, f"fenced {waited:.2f}s after it hung (heartbeat timeout 1 s; no grace of 30 s)"
    proof = run.verify(120)
    assert proof.passed, proof.problems
