"""Where a launcher's processes sit in the job: torchrun's flags, SLURM's step, or a layout by hand (parse_config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftcoord.launcher.main import parse_config

SLURM = ("SLURM_JOB_ID", "SLURM_NODEID", "SLURM_NNODES", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS")


@pytest.fixture(autouse=True)
def no_slurm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (*SLURM, "FTCOORD_JOB_ID", "FTCOORD_STORE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def _slurm(monkeypatch: pytest.MonkeyPatch, node: int, nodes: int = 2, tasks: int | None = None) -> None:
    for name, value in zip(SLURM, ("4242", node, nodes, nodes, nodes if tasks is None else tasks), strict=True):
        monkeypatch.setenv(name, str(value))


def _layout(*flags: str) -> tuple[str, list[int], int]:
    config, _ = parse_config(["--store", "127.0.0.1:29600", *flags, "--", "python", "-c", "pass"])
    return config.job_id, config.slots, config.target_world_size


def test_one_node_by_default() -> None:
    assert _layout("--job-id", "j", "--nproc", "3") == ("j", [0, 1, 2], 3)


def test_torchruns_flags_place_the_node() -> None:
    assert _layout("--job-id", "j", "--nnodes", "3", "--node-rank", "2", "--nproc-per-node", "4") == (
        "j", [8, 9, 10, 11], 12)


def test_an_srun_step_places_the_node_and_names_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    _slurm(monkeypatch, node=1)
    assert _layout("--nproc-per-node", "2") == ("4242", [2, 3], 4)
    assert _layout("--nnodes", "2", "--nproc-per-node", "2") == ("4242", [2, 3], 4), "--nnodes as SLURM says"


def test_a_layout_by_hand_is_kept_inside_any_srun_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """chaos runs several launchers on one host, each given its first slot and the world size: a SLURM step around
    them (even one that ftcoord-launch would refuse) says nothing about their layout."""
    _slurm(monkeypatch, node=1, tasks=8)
    assert _layout("--job-id", "j", "--nproc", "2", "--first-slot", "4", "--world-size", "6") == ("j", [4, 5], 6)
    with pytest.raises(SystemExit):
        _layout("--job-id", "j", "--nproc", "2")  # no layout given: the step decides, and it has 8 tasks on 2 nodes


def test_spares_follow_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    _, slots, _ = _layout("--job-id", "j", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
                          "--spares", "1")
    assert slots == [2, 3, 100_000 + 2 * 1000]


def test_the_warm_standby_is_a_switch_too() -> None:
    config, _ = parse_config(["--store", "127.0.0.1:29600", "--job-id", "j", "--no-warm-standby", "--", "python", "-c",
                              "pass"])
    assert config.warm_standby == 0
    config, _ = parse_config(["--store", "127.0.0.1:29600", "--job-id", "j", "--", "python", "-c", "pass"])
    assert config.warm_standby == 1
