"""The device path end to end. On any machine: `--device cpu` is the run of today, bit for bit. On a machine with a
CUDA GPU (marker `gpu`; scripts/gpu-check runs them, and they skip elsewhere with the reason): a rank that raises, a
rank killed, a replacement healed over NCCL and a restart from a flash image of GPU tensors, each a real chaos run
with its reference, verified like every scenario (exactly once, the model against a replay on the same device)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ftcoord import StoreServer
from tests.helpers.train_runs import TrainingRun, train_args

pytestmark = pytest.mark.timeout(420)

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
NEEDS_GPU = pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU (torch.cuda.is_available() is False here): "
                                                 "scripts/gpu-check runs these on a machine with one")
NEEDS_TWO_GPUS = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA GPUs, one per rank (NCCL lets no two ranks of a "
                                                     f"group share one); this machine has {GPUS}")
RANKS = max(1, min(GPUS, 2))
"""Ranks of the GPU runs: one per GPU, two at most (with one GPU the group has one member, and still a new NCCL
communicator per generation)."""


def test_device_cpu_trains_the_run_of_today_bit_for_bit(store_server: StoreServer, job_id: str,
                                                         tmp_path: Path) -> None:
    """The same job with `--device cpu` and with no --device (auto, which is the CPU on a machine without a GPU; on a
    machine with one it is cuda, and this compares cpu with the CPU run all the same, through --device cpu both)."""
    digests = []
    for name, extra in (("given", ["--device", "cpu"]), ("default", [] if GPUS == 0 else ["--device", "cpu"])):
        run = TrainingRun.launch(tmp_path / name, store_server.address, f"{job_id}-{name}", train_args(24, *extra))
        code, out = run.wait(180)
        assert code == 0, out[-3000:]
        assert {r["device"] for r in run.records() if r["kind"] == "generation"} == {"cpu"}
        digests.append(run.final_digest())
        proof = run.verify(24)
        assert proof.passed, proof.problems
    assert digests[0] == digests[1]


# -- on a GPU -----------------------------------------------------------------------------------------------------


def _scenario(tmp_path: Path, name: str, ranks: int, faults: str, **job: object) -> Path:
    """A scenario of `ranks` ranks on cuda (one GPU each), written where chaos run reads it."""
    settings = {"nproc": ranks, "steps": 60, "global_batch": 24, "dataset": "synthetic:768", "step_time": 0.02,
                "ckpt_strategy": "blocking", "ckpt_every": 10, "device": "cuda", **job}
    lines = [f'name = "{name}"', f'description = "{name} on cuda"', "[job]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n" + faults)
    return path


def _passes(path: Path, tmp_path: Path) -> dict:
    from chaos.cli import run_scenario

    report = run_scenario(str(path), tmp_path / path.stem, quiet=True)
    assert report["verdict"] == "pass", json.dumps(report, indent=1)
    c = report["correctness"]
    assert c["duplicates"] == c["missing"] == c["extra"] == 0 and c["model_checked"], report["model_check"]
    return report


def _generations(tmp_path: Path, name: str) -> list[dict]:
    from training.ledger import read_ledgers

    return [r for r in read_ledgers(tmp_path / name / "logs") if r["kind"] == "generation"]


@pytest.mark.gpu
@NEEDS_GPU
@pytest.mark.parametrize("kind", ["raise", "raise-midstep"])
def test_a_rank_that_raises_on_nccl_restarts_in_process(tmp_path: Path, kind: str) -> None:
    """The generation's NCCL communicator is aborted and a new one made; the same processes go on."""
    path = _scenario(tmp_path, kind, RANKS, f'[[faults]]\nkind = "{kind}"\nrank = {RANKS - 1}\nstep = 20\n')
    report = _passes(path, tmp_path)
    assert report["in_process_restarts"] >= 1
    assert {g["device"] for g in _generations(tmp_path, kind)} == {"cuda"}


@pytest.mark.gpu
@NEEDS_GPU
def test_a_rank_killed_on_nccl_is_replaced(tmp_path: Path) -> None:
    path = _scenario(tmp_path, "kill", RANKS, f'[[faults]]\nkind = "kill-boundary"\nslot = {RANKS - 1}\nstep = 20\n')
    report = _passes(path, tmp_path)
    assert report["restarts"] == 1


@pytest.mark.gpu
@NEEDS_GPU
@NEEDS_TWO_GPUS
def test_a_replacement_is_healed_over_nccl_from_the_survivor(tmp_path: Path) -> None:
    """The survivor's model and optimizer state, on its GPU, reach the replacement's GPU over the new communicator
    (received in place): no checkpoint is read."""
    path = _scenario(tmp_path, "heal", 2, '[[faults]]\nkind = "kill-boundary"\nslot = 1\nstep = 25\n')
    _passes(path, tmp_path)
    healed = [g for g in _generations(tmp_path, "heal") if g["heal_receivers"]]
    assert healed and all(g["heal_bytes"] > 0 and g["loaded_from"] is None for g in healed), healed


@pytest.mark.gpu
@NEEDS_GPU
def test_a_job_resumes_from_flash_checkpoints_of_gpu_tensors(tmp_path: Path) -> None:
    """Flash saves copy the GPU's tensors through the pinned staging buffer; the whole job is preempted (an emergency
    flash save), relaunched, and loads what they wrote back onto its GPUs."""
    path = _scenario(tmp_path, "flash", RANKS, '[[faults]]\nkind = "preempt"\nstep = 32\n', ckpt_strategy="flash")
    report = _passes(path, tmp_path)
    assert report["checkpoint"]["saves"] >= 3
    loaded = [g["loaded_from"] for g in _generations(tmp_path, "flash") if g["loaded_from"]]
    assert loaded, "the relaunch read no checkpoint"
