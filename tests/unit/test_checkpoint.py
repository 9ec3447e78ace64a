"""Checkpoints on real files: commit protocol, fallbacks, refusal, and the three strategies."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from chaos.run.planted import CKPT_CRASH_ENV
from training.checkpoint import atomic
from training.checkpoint.base import load_latest, make_strategy
from training.config import TrainConfig
from training.data import make_dataset
from training.errors import CheckpointCorrupt, ConfigMismatch
from training.models import build_model
from training.sampler import ResumableGlobalBatchSampler
from training.state import TrainState, build_optimizer, build_scheduler, serialize

CONFIG = TrainConfig(ckpt_dir="unused", model="mlp", dataset="synthetic:256", global_batch=16)


def make_state(step: int = 0) -> TrainState:
    dataset = make_dataset(CONFIG.dataset, CONFIG.seed)
    model = build_model("mlp", (32,), 10, CONFIG.seed)
    optimizer = build_optimizer(CONFIG, model)
    state = TrainState(model, optimizer, build_scheduler(CONFIG, optimizer),
                       ResumableGlobalBatchSampler(len(dataset), 16, CONFIG.seed), step=step, has_state=True)
    loss = model(torch.randn(4, 32)).sum()
    loss.backward()
    optimizer.step()  # momentum buffers exist: optimizer state is not empty
    return state


def save(root: Path, step: int, config_hash: str = "abc", keep: int = 3) -> None:
    atomic.commit(root, step, serialize(make_state(step).capture()), world_size=2, config_hash=config_hash,
                  strategy="blocking", keep=keep)


def test_commit_writes_layout_manifest_and_relative_latest(tmp_path: Path) -> None:
    save(tmp_path, 10)
    assert os.readlink(tmp_path / "latest") == "step_00000010"
    manifest = atomic.Manifest.read(tmp_path / "step_00000010" / "manifest.json")
    assert manifest.step == 10 and manifest.world_size == 2 and manifest.config_hash == "abc"
    assert manifest.format_version == 1 and len(manifest.sha256) == 64 and manifest.time > 0
    loaded = load_latest(tmp_path, "abc")
    assert loaded is not None and loaded.step == 10 and loaded.payload["step"] == 10


def test_retention_keeps_the_last_k(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40, 50):
        save(tmp_path, step, keep=3)
    assert [s for s, _ in atomic.step_dirs(tmp_path)] == [50, 40, 30]


def test_dangling_latest_falls_back_to_the_highest_valid_step(tmp_path: Path) -> None:
    save(tmp_path, 10)
    save(tmp_path, 20)
    (tmp_path / "latest").unlink()
    os.symlink("step_00000099", tmp_path / "latest")
    loaded = load_latest(tmp_path, "abc")
    assert loaded is not None and loaded.step == 20


def test_truncated_newest_checkpoint_is_skipped_with_a_warning(tmp_path: Path, capsys) -> None:
    save(tmp_path, 10)
    save(tmp_path, 20)
    payload = tmp_path / "step_00000020" / "state.pt"
    payload.write_bytes(payload.read_bytes()[:100])
    loaded = load_latest(tmp_path, "abc")
    assert loaded is not None and loaded.step == 10
    assert loaded.skipped == [str((tmp_path / "step_00000020.rejected").resolve())]  # kept, set aside


def test_corrupted_newest_checkpoint_is_skipped(tmp_path: Path) -> None:
    save(tmp_path, 10)
    save(tmp_path, 20)
    payload = tmp_path / "step_00000020" / "state.pt"
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0xFF
    payload.write_bytes(bytes(data))
    loaded = load_latest(tmp_path, "abc")
    assert loaded is not None and loaded.step == 10


def test_changed_config_is_a_clear_error_unless_warm_start(tmp_path: Path) -> None:
    save(tmp_path, 10, config_hash="old")
    with pytest.raises(ConfigMismatch, match="config hash old, this run has new.*--warm-start"):
        load_latest(tmp_path, "new")
    loaded = load_latest(tmp_path, "new", warm_start=True)
    assert loaded is not None and loaded.warm


def test_checkpoint_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give a file away")
    save(tmp_path, 10)
    os.chown(tmp_path / "step_00000010" / "state.pt", 65534, 65534)
    with pytest.raises(CheckpointCorrupt, match="owned by uid 65534"):
        load_latest(tmp_path, "abc")


def test_kill_during_a_write_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    save(tmp_path, 10)
    code = (
        "import sys; from pathlib import Path; from training.checkpoint import atomic\n"
        "from training.hooks import load_write_hooks\n"
        f"atomic.commit(Path({str(tmp_path)!r}), 20, b'x' * 1_000_000, world_size=2, config_hash='abc',"
        " strategy='blocking', keep=3, hooks=load_write_hooks(['chaos.run.inject:hook']))\n"
    )
    env = {**os.environ, CKPT_CRASH_ENV: f"kill:{tmp_path / 'marker'}"}
    result = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert result.returncode == 137
    assert list(tmp_path.glob("step_00000020*.tmp-*")), "the torn write should be left in a temp dir"
    loaded = load_latest(tmp_path, "abc")
    assert loaded is not None and loaded.step == 10
    save(tmp_path, 30)  # the next commit cleans up the dead writer's temp dir
    assert not list(tmp_path.glob("*.tmp-*"))


def test_loading_never_unpickles_code(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    class Evil:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, ("echo pwned",))

    payload = serialize({"step": 1, "evil": Evil()})
    atomic.commit(tmp_path, 1, payload, world_size=1, config_hash="abc", strategy="blocking", keep=3)
    with pytest.raises(CheckpointCorrupt, match="step_00000001: Weights only load failed"):
        load_latest(tmp_path, "abc")  # weights_only refuses it, and it is the only one: a refusal
    assert "pwned" not in capfd.readouterr().out


@pytest.mark.parametrize("strategy", ["blocking", "overlapped", "flash"])
def test_strategies_save_and_load_the_same_state(tmp_path: Path, strategy: str) -> None:
    ckpt = make_strategy(strategy, tmp_path / "ckpt", config_hash="abc", keep=2, job_id=f"unit-{os.getpid()}")
    assert ckpt is not None
    state = make_state(7)
    for step in (7, 8, 9):
        state.step = step
        stats = ckpt.save(state, world_size=2)
        assert stats.stall_s >= 0 and stats.bytes > 0
    ckpt.flush()
    assert [s for s, _ in atomic.step_dirs(tmp_path / "ckpt")] == [9, 8]
    loaded = ckpt.load()
    assert loaded is not None and loaded.step == 9
    fresh = make_state(0)
    fresh.restore(loaded.payload)
    assert fresh.digest() == state.digest() and fresh.step == 9
    assert fresh.optimizer.state_dict()["state"].keys() == state.optimizer.state_dict()["state"].keys()
    if strategy == "flash":
        assert loaded.source.startswith("flash:")
    ckpt.close(finished=True)


def test_flash_image_survives_the_death_of_the_trainer(tmp_path: Path) -> None:
    job = f"flash-death-{os.getpid()}"
    code = (
        "import os\n"
        "from tests.unit.test_checkpoint import make_state\n"
        "from training.checkpoint.base import make_strategy\n"
        f"c = make_strategy('flash', {str(tmp_path)!r}, config_hash='abc', keep=3, job_id={job!r})\n"
        "s = make_state(42)\n"
        "c.save(s, world_size=1)\n"
        "print(s.digest(), flush=True)\n"
        "os._exit(137)  # dies without flushing: the persister finishes on its own\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 137, result.stderr
    digest = result.stdout.strip().splitlines()[-1]  # (structlog, unconfigured, logs to stdout too)
    from tests.helpers.wait import wait_until

    wait_until(lambda: atomic.step_dirs(tmp_path), 60, "the orphaned persister to write step 42")
    ckpt = make_strategy("flash", tmp_path, config_hash="abc", keep=3, job_id=job)
    loaded = ckpt.load()
    assert loaded is not None and loaded.step == 42 and loaded.source.startswith("flash:")
    restored = make_state(0)
    restored.restore(loaded.payload)
    assert restored.digest() == digest
    ckpt.close(finished=True)
    from training.checkpoint.flash import flash_dirs

    for directory in flash_dirs(job):
        for f in directory.iterdir():
            f.unlink()
        directory.rmdir()


@pytest.mark.parametrize("strategy", ["blocking", "flash"])
def test_a_model_with_batchnorm_buffers_digests_and_round_trips(tmp_path: Path, strategy: str) -> None:
    """ResNet-18 (the Exp3 model) carries 0-dim buffers (num_batches_tracked): digests and images
    must handle them, or every rank fails at its first step."""
    config = TrainConfig(ckpt_dir="unused", model="resnet18", dataset="fakedata100:64", global_batch=4)
    model = build_model("resnet18", (3, 32, 32), 100, config.seed)
    optimizer = build_optimizer(config, model)
    state = TrainState(model, optimizer, build_scheduler(config, optimizer),
                       ResumableGlobalBatchSampler(64, 4, config.seed), step=3, has_state=True)
    torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([1, 2, 3, 4])).backward()
    optimizer.step()
    assert any(t.dim() == 0 for t in model.state_dict().values())
    ckpt = make_strategy(strategy, tmp_path / "ckpt", config_hash="abc", keep=1, job_id=f"bn-{os.getpid()}")
    assert ckpt is not None
    ckpt.save(state, world_size=2)
    ckpt.flush()
    loaded = ckpt.load()
    assert loaded is not None
    fresh_model = build_model("resnet18", (3, 32, 32), 100, config.seed + 1)
    fresh_optimizer = build_optimizer(config, fresh_model)
    fresh = TrainState(fresh_model, fresh_optimizer, build_scheduler(config, fresh_optimizer),
                       ResumableGlobalBatchSampler(64, 4, config.seed))
    assert fresh.digest() != state.digest()
    fresh.restore(loaded.payload)
    assert fresh.digest() == state.digest() and fresh.step == 3
    ckpt.close(finished=True)


@pytest.mark.parametrize("strategy", ["overlapped", "flash"])
def test_a_fault_planted_in_a_checkpoint_write_fires_in_the_process_that_writes(
        tmp_path: Path, strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The strategies hand their `--hook` specs to the writer process they start: chaos's fault inside a commit
    (chaos.run.planted) fires there, half-way through the payload, and nothing of that save is committed."""
    from tests.helpers.wait import wait_until

    marker = tmp_path / "fired"
    monkeypatch.setenv(CKPT_CRASH_ENV, f"kill:{marker}")
    job = f"planted-{strategy}-{os.getpid()}"
    ckpt = make_strategy(strategy, tmp_path / "ckpt", config_hash="abc", keep=2, job_id=job,
                         hooks=("chaos.run.inject:hook",))
    assert ckpt is not None
    ckpt.save(make_state(7), world_size=1)
    wait_until(marker.exists, 60, "the planted fault to fire in the writer")
    pid = int(marker.read_text().split()[0])
    assert pid != os.getpid(), "the fault fired in the trainer, not in the process that writes"
    wait_until(lambda: list((tmp_path / "ckpt").glob("step_00000007.tmp-*")), 60, "the torn write")
    assert not atomic.step_dirs(tmp_path / "ckpt"), "a torn save was committed"
    with contextlib.suppress(Exception):  # the writer is gone: this save failed, as a dead writer's would
        ckpt.close(finished=False)
    from training.checkpoint.flash import flash_dirs

    for directory in flash_dirs(job):
        shutil.rmtree(directory, ignore_errors=True)
