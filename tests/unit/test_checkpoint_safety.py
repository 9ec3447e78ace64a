"""Checkpoints that never lie: refused corruption that survives, a full disk that is heard, `latest`
that only moves forward, temp reaping safe on shared filesystems, flash images bound to their
lineage and handed over safely between persisters. Real files, a real tmpfs, real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ftcoord.host import scratch
from tests.helpers.disk import small_disk
from tests.helpers.wait import wait_until
from tests.unit.test_checkpoint import make_state, save
from training.checkpoint import atomic, shm
from training.checkpoint.base import load_latest, make_strategy
from training.checkpoint.persister import persist
from training.errors import CheckpointCorrupt, CheckpointFailed
from training.state import deserialize

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def own_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flash images of these tests live in the test's own scratch root, not in the machine's /dev/shm."""
    monkeypatch.setenv(scratch.SCRATCH_ROOT_ENV, str(tmp_path / "shm"))


def flip_a_byte(step_dir: Path) -> None:
    payload = step_dir / atomic.PAYLOAD
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0xFF
    payload.write_bytes(bytes(data))


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- corrupt checkpoints refuse, and survive ------------------------------------------------------

def test_all_checkpoints_corrupt_is_a_refusal_naming_each_and_nothing_is_touched(tmp_path: Path) -> None:
    for step in (80, 100, 120):
        save(tmp_path, step)
    for _, path in atomic.step_dirs(tmp_path):
        flip_a_byte(path)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointCorrupt) as refused:
        load_latest(tmp_path, "abc")
    message = str(refused.value)
    assert all(f"{atomic.step_dir_name(s)}: " in message for s in (80, 100, 120)) and "sha256" in message
    assert "--ckpt-start-over" in message and "Nothing was deleted" in message
    assert snapshot(tmp_path) == before


def test_start_over_keeps_the_unreadable_checkpoints_aside(tmp_path: Path) -> None:
    for step in (80, 100):
        save(tmp_path, step)
    for _, path in atomic.step_dirs(tmp_path):
        flip_a_byte(path)
    assert load_latest(tmp_path, "abc", start_over=True) is None
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_00000080.rejected", "step_00000100.rejected"]
    save(tmp_path, 100)  # the new run's own step 100 overwrites nothing
    assert (tmp_path / "step_00000100.rejected" / atomic.PAYLOAD).is_file()


def test_retention_never_deletes_what_a_resume_skipped(tmp_path: Path) -> None:
    """Restored from 80 while 100 and 120 were corrupt: training on to 200 with keep=2 deletes none of them."""
    for step in (80, 100, 120):
        save(tmp_path, step)
    for step in (100, 120):
        flip_a_byte(tmp_path / atomic.step_dir_name(step))
    loaded = load_latest(tmp_path, "abc")
    assert loaded is not None and loaded.step == 80
    for step in range(100, 220, 20):
        save(tmp_path, step, keep=2)
    assert {p.name for p in tmp_path.glob("*.rejected")} == {"step_00000100.rejected", "step_00000120.rejected"}
    assert [s for s, _ in atomic.step_dirs(tmp_path)] == [200, 180]


def test_latest_only_moves_forward(tmp_path: Path) -> None:
    save(tmp_path, 20)
    save(tmp_path, 10)  # a replay of an older step (an old persister finishing late, say)
    assert os.readlink(tmp_path / "latest") == "step_00000020"
    save(tmp_path, 30)
    assert os.readlink(tmp_path / "latest") == "step_00000030"


def test_a_newer_step_left_before_latest_moved_is_loaded(tmp_path: Path) -> None:
    save(tmp_path, 10)
    save(tmp_path, 20)
    os.replace(tmp_path / "latest", tmp_path / "old-latest")
    os.symlink("step_00000010", tmp_path / "latest")  # a crash between the rename and the link update
    loaded = load_latest(tmp_path, "abc")
    assert loaded is not None and loaded.step == 20


def test_temp_reaping_spares_other_hosts_and_live_writers(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    here = atomic.temp_name("step_00000010").rsplit("-", 1)[0]
    ours_dead = tmp_path / f"{here}-{dead_pid}"
    other_host = tmp_path / f"step_00000010.tmp-otherhost-{dead_pid}"
    live = tmp_path / f"{here}-{os.getppid()}"
    for path in (ours_dead, other_host, live):
        path.mkdir()
    assert atomic.reap_temps(tmp_path) == [ours_dead]
    assert other_host.exists() and live.exists()


def test_pruning_waits_for_a_loader(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        save(tmp_path, step)
    with atomic.locked(tmp_path, shared=True):
        atomic.prune(tmp_path, keep=1)  # a loader holds the lock: this round is skipped
        assert len(atomic.step_dirs(tmp_path)) == 3
    atomic.prune(tmp_path, keep=1)
    assert [s for s, _ in atomic.step_dirs(tmp_path)] == [30]


# -- a full disk is an error someone hears ----------------------------------------------------------

@pytest.mark.parametrize("strategy", ["blocking", "overlapped", "flash"])
def test_a_full_disk_fails_loudly_and_leaves_nothing(tmp_path: Path, strategy: str) -> None:
    with small_disk(tmp_path / "disk", 256, leave_free_kib=24) as disk:
        ckpt = make_strategy(strategy, disk / "ckpt", config_hash="abc", keep=3, job_id=f"full-{os.getpid()}",
                             max_failures=2)
        assert ckpt is not None
        durable: list[int] = []
        ckpt.on_durable = lambda stats: durable.append(stats.step)
        state = make_state(1)
        with pytest.raises(CheckpointFailed) as stopped:
            for step in range(1, 6):
                state.step = step
                ckpt.save(state, world_size=1)
            ckpt.flush()
        message = str(stopped.value)
        assert str(disk / "ckpt") in message and "No space left on device" in message and "MiB free" in message
        assert ckpt.consecutive_failures == 2 and durable == []
        assert not list((disk / "ckpt").glob("*.tmp-*")), "a failed save must leave no temp directory"
        assert not atomic.step_dirs(disk / "ckpt")
        ckpt.close()


def test_a_failure_then_room_again_counts_only_the_durable_save(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 256, leave_free_kib=24) as disk:
        ckpt = make_strategy("blocking", disk / "ckpt", config_hash="abc", keep=3, job_id="x", max_failures=2)
        assert ckpt is not None
        durable: list[int] = []
        ckpt.on_durable = lambda stats: durable.append(stats.step)
        state = make_state(1)
        ckpt.save(state, world_size=1)  # refused: counted and logged, not raised, no in-process restart
        assert ckpt.consecutive_failures == 1 and durable == []
        (disk / "filler").unlink()  # someone freed space
        state.step = 2
        ckpt.save(state, world_size=1)
        assert durable == [2] and ckpt.consecutive_failures == 0


# -- flash images: one lineage, one persister at a time -----------------------------------------------

def test_a_flash_image_is_loaded_only_by_its_own_checkpoint_directory(tmp_path: Path) -> None:
    job = f"lineage-{os.getpid()}"
    first = make_strategy("flash", tmp_path / "ckpt-a", config_hash="abc", keep=3, job_id=job)
    assert first is not None
    first.save(make_state(40), world_size=1)
    first.flush()
    first.close()  # the image stays (the job did not finish): a relaunch could resume from it
    same = make_strategy("flash", tmp_path / "ckpt-a", config_hash="abc", keep=3, job_id=job)
    assert same is not None
    loaded = same.load()
    assert loaded is not None and loaded.step == 40 and loaded.source.startswith("flash:")
    fresh = make_strategy("flash", tmp_path / "ckpt-b", config_hash="abc", keep=3, job_id=job)
    assert fresh is not None and fresh.load() is None  # a new directory: a new lineage, step 0
    wiped = tmp_path / "ckpt-a"
    for path in sorted(wiped.rglob("*"), reverse=True):
        path.unlink() if path.is_file() or path.is_symlink() else path.rmdir()
    again = make_strategy("flash", wiped, config_hash="abc", keep=3, job_id=job)
    assert again is not None and again.load() is None  # the same path, emptied: a new lineage too


def test_a_torn_read_never_becomes_a_checkpoint(tmp_path: Path) -> None:
    """The writer's stamp moved while the persister read the image: it records a failure, commits nothing."""
    job = f"torn-{os.getpid()}"
    ckpt = make_strategy("flash", tmp_path / "ckpt", config_hash="abc", keep=3, job_id=job)
    assert ckpt is not None
    ckpt.save(make_state(5), world_size=1)
    ckpt.flush()
    directory = ckpt.directory
    shm.write_marker(directory, shm.WRITING, 99)  # a writer started on the buffer after the request
    persist(directory, tmp_path / "other", 3, shm.read_marker(directory, shm.REQUEST))
    failure = shm.read_failure(directory)
    assert failure is not None and "torn read" in failure["error"]
    assert not atomic.step_dirs(tmp_path / "other")
    ckpt.close(finished=True)


def test_a_new_trainer_never_overwrites_what_an_old_persister_is_writing(tmp_path: Path) -> None:
    """The old trainer dies right after handing a large image to its persister; a new trainer of the slot
    saves at once. Step 42 on disk must be the old trainer's state, whole: not torn by the new write."""
    job = f"handoff-{os.getpid()}"
    code = (
        "import os, torch\n"
        "from tests.unit.test_checkpoint import make_state\n"
        "from training.checkpoint.base import make_strategy\n"
        f"c = make_strategy('flash', {str(tmp_path / 'ckpt')!r}, config_hash='abc', keep=5, job_id={job!r})\n"
        "s = make_state(42)\n"
        "s.model.register_buffer('ballast', torch.full((12_000_000,), 1.0))\n"
        "c.save(s, world_size=1)\n"
        "print(s.digest(), flush=True)\n"
        "os._exit(137)\n"
    )
    env = {**os.environ, "FTCOORD_SLOT": "3"}
    old = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert old.returncode == 137, old.stderr
    old_digest = old.stdout.strip().splitlines()[-1]
    os.environ["FTCOORD_SLOT"] = "3"
    try:
        new = make_strategy("flash", tmp_path / "ckpt", config_hash="abc", keep=5, job_id=job)
        assert new is not None
        state = make_state(43)
        state.model.register_buffer("ballast", torch.full((12_000_000,), 2.0))
        new.save(state, world_size=1)
        new.flush()
    finally:
        del os.environ["FTCOORD_SLOT"]
    wait_until(lambda: len(atomic.step_dirs(tmp_path / "ckpt")) == 2, 60, "both steps on disk")
    for step, expected in ((42, old_digest), (43, state.digest())):
        _, data = atomic.verify(tmp_path / "ckpt" / atomic.step_dir_name(step))
        restored = make_state(0)
        restored.model.register_buffer("ballast", torch.zeros(12_000_000))
        restored.restore(deserialize(data))
        assert restored.digest() == expected, f"step {step} on disk is not the state that was saved"
    new.close(finished=True)


# -- node-local scratch: owned, released, reaped --------------------------------------------------------

def test_scratch_of_a_dead_owner_is_an_orphan_and_a_live_ones_is_not(tmp_path: Path) -> None:
    child = subprocess.run([sys.executable, "-c", "from ftcoord.host import scratch; scratch.claim('dead-job');"
                            "scratch.slot_dir('dead-job', 0).mkdir()"], cwd=REPO, env=dict(os.environ), timeout=60)
    assert child.returncode == 0
    scratch.claim("live-job")
    scratch.slot_dir("live-job", 0).mkdir()
    assert [o.job_id for o in scratch.orphans()] == ["dead-job"]
    assert scratch.orphans(keep_job="dead-job") == []  # a relaunch of the dead job keeps its own
    assert [o.job_id for o in scratch.reap()] == ["dead-job"]
    assert not scratch.job_dir("dead-job").exists() and scratch.job_dir("live-job").exists()
    scratch.release("live-job", [0])
    assert not scratch.job_dir("live-job").exists()


def test_gc_lists_then_removes_orphans(tmp_path: Path) -> None:
    code = ("from ftcoord.host import scratch; scratch.claim('gone'); scratch.slot_dir('gone', 1).mkdir();"
            "(scratch.slot_dir('gone', 1) / 'image').write_bytes(b'x' * 4096)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ), timeout=60, check=True)
    listed = subprocess.run([sys.executable, "-m", "ftcoord.observe.cli", "gc", "--dry-run"], capture_output=True,
                            text=True, cwd=REPO, env=dict(os.environ), timeout=60)
    assert listed.returncode == 0 and "job gone" in listed.stdout and scratch.job_dir("gone").exists()
    removed = subprocess.run([sys.executable, "-m", "ftcoord.observe.cli", "gc"], capture_output=True, text=True,
                             cwd=REPO, env=dict(os.environ), timeout=60)
    assert removed.returncode == 0 and "removed 1 orphaned job(s)" in removed.stdout
    assert not scratch.job_dir("gone").exists()


def test_importing_the_persister_does_not_renice_the_importer() -> None:
    """Only the persister process runs niced; a process that imports the module (a test, a tool) does not
    (it used to: every process it started afterwards inherited nice 10)."""
    code = ("import os; before = os.getpriority(os.PRIO_PROCESS, 0); import training.checkpoint.persister; "
            "print(os.getpriority(os.PRIO_PROCESS, 0) - before)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.stdout.strip() == "0", result.stdout + result.stderr
