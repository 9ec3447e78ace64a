"""Bad input fails fast and loud, at every entry point: one line naming the value and what to do,
the documented exit code, no traceback, and nothing written (no checkpoint, no store keys of a job
that never started). Real processes, as a user would type the commands."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from ftcoord import StoreServer, connect, job_store
from tests.helpers.cluster import REPO

pytestmark = pytest.mark.timeout(120)
PY = sys.executable


@dataclass(frozen=True)
class Row:
    name: str
    argv: tuple[str, ...]
    code: int
    says: tuple[str, ...]
    """Every one of these must appear in the output (the bad value, the limit, what to do)."""
    env: dict[str, str] = field(default_factory=dict)
    seconds: float = 5.0
    """Answered within this: the issue's bound for every row, launches included (a refused command line
    imports no torch in the launcher's warm standby, see ftcoord.launcher.standby_template)."""


TRAINING = (PY, "-m", "training")
LAUNCH = (PY, "-m", "ftcoord.launcher.main")
CHAOS = (PY, "-m", "chaos.cli")
STORE = (PY, "-m", "ftcoord.store.main")

ROWS = [
    # ftcoord-store
    Row("store port out of range", (*STORE, "--port", "99999"), 2, ("99999", "between 0 and 65535")),
    Row("store port not a number", (*STORE, "--port", "abc"), 2, ("'abc' is not an integer",)),
    Row("store port taken", (*STORE, "--port", "{taken}"), 2, ("already in use", "pick another --port")),
    # ftcoord-launch
    Row("launch --nproc 0", (*LAUNCH, "--embedded-store", "--job-id", "j", "--nproc", "0", "--", PY, "x.py"), 2,
        ("--nproc", "0 is out of range", ">= 1")),
    Row("launch without a command", (*LAUNCH, "--embedded-store", "--job-id", "j"), 2, ("missing the command",)),
    Row("launch a command that does not exist", (*LAUNCH, "--embedded-store", "--job-id", "j", "--",
                                                  "/nonexistent/bin"), 2, ("/nonexistent/bin", "not found")),
    Row("launch store without a port", (*LAUNCH, "--store", "localhost", "--job-id", "j", "--", PY, "x.py"), 2,
        ("'localhost'", "HOST:PORT")),
    Row("launch store port out of range", (*LAUNCH, "--store", "127.0.0.1:70000", "--job-id", "j", "--", PY,
                                           "x.py"), 2, ("70000", "1..65535")),
    Row("launch job id with a slash", (*LAUNCH, "--embedded-store", "--job-id", "a/b", "--", PY, "x.py"), 2,
        ("'a/b'", "letters, digits")),
    Row("launch negative spares", (*LAUNCH, "--embedded-store", "--job-id", "j", "--spares", "-1", "--", PY,
                                   "x.py"), 2, ("--spares", "-1 is out of range")),
    Row("launch negative grace", (*LAUNCH, "--embedded-store", "--job-id", "j", "--grace", "-3", "--", PY, "x.py"),
        2, ("--grace", "-3")),
    Row("launch unknown restart policy", (*LAUNCH, "--embedded-store", "--job-id", "j", "--restart-policy", "all",
                                          "--", PY, "x.py"), 2, ("'all'", "slot", "job")),
    Row("launch a script that does not exist", (*LAUNCH, "--embedded-store", "--job-id", "j", "--", PY, "trian.py"),
        2, ("'trian.py' does not exist", "check the path")),
    Row("launch with no store", (*LAUNCH, "--job-id", "j", "--", PY, "x.py"), 2,
        ("--store HOST:PORT", "FTCOORD_STORE", "--embedded-store"), env={"FTCOORD_STORE": ""}),
    Row("launch on a shared store with no job id", (*LAUNCH, "--store", "127.0.0.1:29600", "--", PY, "x.py"), 2,
        ("--job-id NAME", "FTCOORD_JOB_ID", "SLURM_JOB_ID"), env={"FTCOORD_JOB_ID": "", "SLURM_JOB_ID": ""}),
    Row("launch a node rank beyond the nodes", (*LAUNCH, "--embedded-store", "--job-id", "j", "--nnodes", "2",
                                                "--node-rank", "2", "--", PY, "x.py"), 2,
        ("--node-rank 2", "--nnodes 2", "0 to 1")),
    Row("launch a node rank without nodes", (*LAUNCH, "--embedded-store", "--job-id", "j", "--node-rank", "1",
                                             "--", PY, "x.py"), 2, ("--node-rank 1 needs --nnodes",)),
    Row("launch a first slot that disagrees with the node rank", (*LAUNCH, "--embedded-store", "--job-id", "j",
                                                                  "--nnodes", "2", "--node-rank", "1",
                                                                  "--first-slot", "0", "--", PY, "x.py"), 2,
        ("--first-slot 0", "node 1 of 2", "not both")),
    Row("launch a world size that disagrees with the nodes", (*LAUNCH, "--embedded-store", "--job-id", "j",
                                                              "--nnodes", "2", "--node-rank", "0",
                                                              "--nproc-per-node", "2", "--world-size", "3", "--", PY,
                                                              "x.py"), 2,
        ("--world-size 3", "= 4", "one or the other")),
    Row("launch slots beyond the world size", (*LAUNCH, "--embedded-store", "--job-id", "j", "--nproc", "2",
                                               "--first-slot", "2", "--", PY, "x.py"), 2,
        ("slots 2..3", "world size 2", "raise --world-size")),
    Row("launch several tasks per node under srun", (*LAUNCH, "--store", "127.0.0.1:29600", "--", PY, "x.py"), 2,
        ("4 tasks on 2 nodes", "--ntasks-per-node=1"),
        env={"SLURM_JOB_ID": "77", "SLURM_NODEID": "0", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "4"}),
    Row("launch several nodes without saying which", (*LAUNCH, "--embedded-store", "--job-id", "j", "--nnodes", "2",
                                                      "--", PY, "x.py"), 2, ("--nnodes 2", "give --node-rank")),
    Row("launch a child with a bad dataset", (*LAUNCH, "--store", "{store}", "--job-id", "{job}", "--nproc", "2",
                                              "--", *TRAINING, "--dataset", "nosuch", "--ckpt-dir", "{ckpt}"), 2,
        ("unknown dataset 'nosuch'", "not restarting")),
    Row("launch a world size that does not divide the global batch", (*LAUNCH, "--store", "{store}", "--job-id",
        "{job}", "--nproc", "2", "--", *TRAINING, "--global-batch", "7", "--ckpt-dir", "{ckpt}"), 2,
        ("global_batch 7 is not divisible by the job's world size 2", "[1]", "not restarting")),
    Row("launch a child with negative steps", (*LAUNCH, "--store", "{store}", "--job-id", "{job}", "--", *TRAINING,
                                               "--steps", "-5"), 2,
        ("--steps", "-5 is out of range", "not restarting")),
    *([] if torch.cuda.is_available() else [  # what a machine without a GPU answers (torch is imported first)
        Row("training on cuda without a GPU", (*TRAINING, "--device", "cuda"), 2,
            ("--device cuda", "no CUDA device", "--device cpu"), seconds=20.0),
        Row("launch ranks on cuda without a GPU", (*LAUNCH, "--store", "{store}", "--job-id", "{job}", "--nproc", "2",
                                                   "--", *TRAINING, "--device", "cuda"), 2,
            ("--device cuda", "no CUDA device", "not restarting"), seconds=30.0),
        Row("gpu-check without a GPU", (PY, str(REPO / "scripts" / "gpu-check")), 2,
            ("no CUDA device", "a machine with a GPU"), seconds=20.0),
    ]),
    # python -m training
    Row("training negative steps", (*TRAINING, "--steps", "-5"), 2, ("--steps", "-5", ">= 1")),
    Row("training zero global batch", (*TRAINING, "--global-batch", "0"), 2, ("--global-batch", "0", ">= 1")),
    Row("training dataset size not a number", (*TRAINING, "--dataset", "synthetic:abc"), 2,
        ("'synthetic:abc'", "whole number")),
    Row("training dataset smaller than a batch", (*TRAINING, "--dataset", "synthetic:8", "--global-batch", "32"), 2,
        ("8 samples", "global_batch=32", "--global-batch")),
    Row("training image model on vectors", (*TRAINING, "--model", "small-cnn", "--dataset", "synthetic:64"), 2,
        ("--model small-cnn", "synthetic:64", "--dataset fakedata")),
    Row("training missing CIFAR folder", (*TRAINING, "--dataset", "cifar10:/nonexistent"), 2,
        ("'/nonexistent'", "does not exist", "never")),
    Row("training unknown model", (*TRAINING, "--model", "gpt5"), 2, ("'gpt5'", "mlp")),
    Row("training unwritable checkpoint directory", (*TRAINING, "--ckpt-dir", "/proc/nope"), 2,
        ("/proc/nope", "cannot write checkpoints there")),
    Row("training unknown checkpoint strategy", (*TRAINING, "--ckpt-strategy", "magic"), 2, ("'magic'", "flash")),
    Row("training heartbeat timeout below two intervals", (*TRAINING, "--heartbeat-interval", "1",
                                                          "--heartbeat-timeout", "1"), 2, ("at least twice",)),
    Row("training negative learning rate", (*TRAINING, "--lr", "-1"), 2, ("--lr", "-1 must be > 0")),
    Row("training hook that cannot load", (*TRAINING, "--hook", "nosuch.module:f"), 2,
        ("'nosuch.module:f'", "MODULE:FACTORY")),
    Row("training slot variable not a number", TRAINING, 2, ("FTCOORD_SLOT='abc'", "integer"),
        env={"FTCOORD_SLOT": "abc"}),
    Row("training minimum above the world size", (*TRAINING, "--min-world-size", "3"), 2,
        ("min_world_size=3", "between 1 and"), env={"FTCOORD_WORLD_SIZE": "2"}),
    Row("training zero checkpoints kept", (*TRAINING, "--ckpt-keep", "0"), 2, ("--ckpt-keep", "0")),
    # chaos
    Row("chaos unknown scenario", (*CHAOS, "run", "nosuch"), 2, ("'nosuch'", "kill-boundary")),
    Row("chaos malformed scenario", (*CHAOS, "run", "{bad_toml}"), 2, ("not valid TOML",)),
    Row("chaos unknown fault kind", (*CHAOS, "run", "{bad_kind}"), 2, ("'explode'", "kill-boundary")),
    Row("chaos verify a directory that is no run", (*CHAOS, "verify", "{empty}"), 2, ("not a chaos run directory",)),
    Row("chaos campaign bad seeds", (*CHAOS, "campaign", "ecrl-exp1", "--seeds", "1,x"), 2, ("'1,x'", "integers")),
    Row("chaos unknown campaign", (*CHAOS, "campaign", "nosuch"), 2, ("'nosuch'", "ecrl-exp1")),
    # examples: CUDA_VISIBLE_DEVICES="" hides any GPU, so the row holds on every machine
    Row("example --device cuda without a GPU", (PY, str(REPO / "examples" / "own_loop.py"), "1", "1", "--device",
                                                "cuda"), 2, ("--device cuda", "no CUDA device", "--device cpu"),
        env={"CUDA_VISIBLE_DEVICES": ""}, seconds=30.0),
    Row("quickstart --device cuda without a GPU", (PY, str(REPO / "examples" / "quickstart.py"), "--device", "cuda"),
        2, ("--device cuda", "no CUDA device", "--device cpu"), env={"CUDA_VISIBLE_DEVICES": ""}, seconds=30.0),
    # ftcoord
    Row("ftcoord unknown command", (PY, "-m", "ftcoord.observe.cli", "purge"), 2, ("'purge'", "gc")),
]


@pytest.fixture(scope="module")
def taken_port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input_is_one_clear_line_and_changes_nothing(row: Row, tmp_path: Path, taken_port: int,
                                                         store_server: StoreServer, job_id: str) -> None:
    (tmp_path / "bad.toml").write_text("name = [unclosed\n")
    (tmp_path / "kind.toml").write_text('name = "k"\ndescription = "d"\n[[faults]]\nkind = "explode"\n')
    (tmp_path / "empty").mkdir()
    ckpt = tmp_path / "ckpt"
    job_id = re.sub(r"[^A-Za-z0-9._-]", "-", job_id)
    fill = {"{taken}": str(taken_port), "{store}": store_server.address, "{job}": job_id, "{ckpt}": str(ckpt),
            "{bad_toml}": str(tmp_path / "bad.toml"), "{bad_kind}": str(tmp_path / "kind.toml"),
            "{empty}": str(tmp_path / "empty")}
    argv = [fill.get(a, a) for a in row.argv]
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo", "TORCH_CPP_LOG_LEVEL": "ERROR",
           "FTCOORD_LOG_DIR": "", **row.env}
    started = time.monotonic()
    result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=row.seconds + 30)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == row.code, f"exit {result.returncode}, expected {row.code}:\n{output[-2000:]}"
    assert "Traceback" not in output, output[-3000:]
    missing = [s for s in row.says if s not in output]
    assert not missing, f"the message should say {missing}:\n{output[-2000:]}"
    assert elapsed < row.seconds, f"answered after {elapsed:.1f}s"
    assert not ckpt.exists() or not any(ckpt.glob("step_*")), "a checkpoint was written"
    if "{job}" in row.argv:
        keys = job_store(connect(store_server.address), job_id)
        left = [k for k in ("slots", "slot/0/fence", "slot/0/incarnation", "slot/1/fence", "gen/current",
                            "slot/0/launcher", "listed") if keys.check([k])]
        assert not left, f"a job that never started left keys in the store: {left}"
