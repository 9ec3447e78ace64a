"""The device path, everything of it a CPU can run: which device a rank picks and when it is refused, the NCCL
group's abort by the release watch, a GPU wait counted as waiting on peers, the GPUs a chaos node sees, the checks
on a scenario's device. What only a GPU can run is in tests/integration/test_gpu.py (marker `gpu`)."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from chaos.proof.replay import replay_device
from chaos.run.launchers import gpus_by_node
from chaos.scenario import JobSpec, ScenarioError, load, on_gpus, parse, to_toml
from ftcoord.errors import ConfigError
from ftcoord.liveness.group_release import GroupRelease
from ftcoord.liveness.still_stack import waits_on_peers
from ftcoord.wrapper.device import local_device, pick_device
from tests.helpers.wait import wait_until
from tests.unit.test_release import Interrupt, blocked_receiver
from training.checkpoint import shm
from training.config import TrainConfig
from training.errors import TrainingConfigError

pytestmark = pytest.mark.timeout(30)
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts what a machine without a GPU answers")


@pytest.mark.parametrize(("requested", "local_rank", "gpus", "device"), [
    ("cpu", 0, 0, "cpu"), ("cpu", 5, 8, "cpu"),  # cpu whatever the machine has
    ("auto", 0, 0, "cpu"), ("auto", 3, 0, "cpu"),  # auto without a GPU: the CPU
    ("auto", 0, 1, "cuda:0"), ("auto", 1, 2, "cuda:1"),
    ("cuda", 0, 1, "cuda:0"), ("cuda", 7, 8, "cuda:7"),
])
def test_a_rank_picks_its_local_rank_s_gpu_or_the_cpu(requested: str, local_rank: int, gpus: int, device: str) -> None:
    assert pick_device(requested, local_rank, gpus) == device


def test_cuda_without_a_gpu_is_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigError, match=r"no CUDA device.*device_count\(\) is 0.*--device cpu"):
        pick_device("cuda", 0, 0)


@pytest.mark.parametrize("requested", ["cuda", "auto"])
def test_a_rank_without_a_gpu_of_its_own_is_refused_never_placed_on_another_s(requested: str) -> None:
    """Two ranks of one NCCL communicator cannot share a GPU, and auto never mixes a CPU rank into a GPU job: a third
    process (a hot spare, say) on a node of 2 GPUs is refused, naming its local rank, the count and the way out."""
    with pytest.raises(ConfigError, match=r"local rank 2 .* 2 GPU\(s\) visible .*at most 2 process\(es\) per node, "
                                          r"workers and --spares together"):
        pick_device(requested, 2, 2)


def test_an_unknown_device_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"--device 'tpu': choose one of auto, cpu, cuda"):
        pick_device("tpu", 0, 0)
    with pytest.raises(TrainingConfigError, match="--device 'gpu'"):
        TrainConfig(device="gpu", ckpt_strategy="none")


@NO_GPU
def test_this_machine_trains_on_the_cpu_by_default_and_refuses_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert local_device("auto") == torch.device("cpu") == local_device("cpu")
    with pytest.raises(ConfigError, match="no CUDA device"):
        local_device("cuda")


# -- the NCCL group's release ---------------------------------------------------------------------------------


class Aborts:
    """A group's abort, recorded with what the watch said of itself at that moment."""

    def __init__(self) -> None:
        self.calls: list[bool] = []
        self.release: GroupRelease | None = None

    def __call__(self) -> None:
        assert self.release is not None
        self.calls.append(self.release.aborted)


def test_an_nccl_group_is_aborted_once_a_member_is_declared_dead() -> None:
    """The result of a collective the abort ended is void: `aborted` is set before the abort, so the training thread
    (CallWrapper.wait_for_device) never takes it for done. Sabotage: without the abort callable, nothing is called."""
    with blocked_receiver() as (record, _returned, _thread):
        interrupt, aborts = Interrupt(), Aborts()
        aborts.release = release = GroupRelease(0, 5, (0, 1, 2), {}, interrupt.fired.wait, lambda: interrupt.reason,
                                                grace_s=60.0, abort=aborts).start()
        interrupt.set("hung:slot=1")
        assert release.join(5.0), "the watch did not end after its generation's interrupt"
        assert aborts.calls == [True] and release.aborted


@pytest.mark.parametrize("reason", ["exception:slot=1:RuntimeError", "stop:slot=2", "grow:slot=3"])
def test_an_nccl_group_that_outlives_any_other_interrupt_is_aborted(reason: str) -> None:
    """A peer that raised or left between two collectives fails no NCCL collective of ours (gloo's closed sockets
    would): a group still alive grace_s after the interrupt is aborted, whatever the reason."""
    interrupt, aborts = Interrupt(), Aborts()
    aborts.release = release = GroupRelease(0, 5, (0, 1, 2), {}, interrupt.fired.wait, lambda: interrupt.reason,
                                            grace_s=0.1, abort=aborts).start()
    interrupt.set(reason)
    wait_until(lambda: aborts.calls, 5.0, "the abort of a group that outlived its interrupt")
    assert release.join(5.0) and aborts.calls == [True]


def test_an_nccl_group_torn_down_within_the_grace_is_not_aborted_again() -> None:
    """The members reached their step boundary and tore the group down (the ordinary way out): no abort."""
    interrupt, aborts = Interrupt(), Aborts()
    aborts.release = release = GroupRelease(0, 5, (0, 1, 2), {}, interrupt.fired.wait, lambda: interrupt.reason,
                                            grace_s=60.0, abort=aborts).start()
    interrupt.set("exception:slot=1:RuntimeError")
    release.stop()
    assert release.join(5.0) and aborts.calls == [] and not release.aborted


# -- a GPU wait is a wait on peers ----------------------------------------------------------------------------


def _frame_of_a_thread_blocked_in(filename: str) -> tuple[bool, threading.Event]:
    """Whether a real thread, blocked in a function whose code comes from `filename`, waits on its peers."""
    code = compile("def synchronize(event):\n    event.wait()\n", filename, "exec")
    namespace: dict[str, object] = {}
    exec(code, namespace)
    release = threading.Event()
    thread = threading.Thread(target=namespace["synchronize"], args=(release,), daemon=True)  # type: ignore[arg-type]
    thread.start()
    wait_until(lambda: sys._current_frames().get(thread.ident or 0) is not None
               and sys._current_frames()[thread.ident or 0].f_code.co_name in ("wait", "synchronize"), 5.0,
               "the thread to block")
    answer = waits_on_peers(sys._current_frames()[thread.ident or 0])
    release.set()
    thread.join(5.0)
    return answer, release


def test_a_training_thread_in_a_cuda_synchronisation_waits_on_its_peers() -> None:
    """Under NCCL a collective returns at once and the wait lands in torch.cuda.synchronize: a rank there is not stuck
    on its own. The same wait in the training loop's own code is not a wait on peers."""
    assert _frame_of_a_thread_blocked_in(torch.cuda.__file__)[0]
    assert not _frame_of_a_thread_blocked_in("/srv/job/training/loop.py")[0]


# -- flash checkpoints from a GPU -----------------------------------------------------------------------------


def test_a_flash_image_of_device_tensors_without_a_staging_buffer_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A tensor not on the CPU goes through the pinned staging buffer, never straight into the image."""
    on_device = [torch.empty(16, device="meta")]
    layout, total = shm.layout_of(on_device)
    buffer = shm.SharedBuffer(tmp_path)
    try:
        with pytest.raises(ValueError, match="PinnedStaging"):
            shm.write_image(buffer, on_device, layout, total)
    finally:
        buffer.close()


# -- chaos on GPUs ------------------------------------------------------------------------------------------------


def test_each_chaos_node_sees_gpus_of_its_own() -> None:
    """The scenario's "nodes" share one machine: node i's launcher sees one GPU per worker and hot spare it runs."""
    assert gpus_by_node(JobSpec(nproc=2), 2) == ["0,1"]
    assert gpus_by_node(JobSpec(nproc=2, nodes=((0,), (1,))), 4) == ["0", "1"]
    assert gpus_by_node(JobSpec(nproc=3, spares=1, nodes=((0, 1), (2,))), 4) == ["0,1,2", "3"]
    with pytest.raises(ScenarioError, match=r"runs 3 processes .* this machine has 2 GPU\(s\)"):
        gpus_by_node(JobSpec(nproc=3), 2)


def test_a_scenario_s_device_is_checked_and_kept() -> None:
    text = 'name = "x"\ndescription = "y"\n[job]\ndevice = "cuda"\n'
    scenario = parse(text)
    assert scenario.job.device == "cuda" and parse(to_toml(scenario)).job.device == "cuda"
    assert scenario.job.trajectory_key() != JobSpec().trajectory_key()  # a GPU run has references of its own
    with pytest.raises(ScenarioError, match=r"device = 'auto': choose one of cpu, cuda"):
        parse(text.replace('"cuda"', '"auto"'))


@NO_GPU
def test_a_gpu_run_is_not_replayed_on_a_cpu() -> None:
    """The arithmetic differs between devices: a replay on the CPU of a GPU run would fail it for no fault."""
    assert replay_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="trained on cuda"):
        replay_device("cuda")


def test_gpu_check_runs_a_scenario_with_one_rank_per_gpu_or_says_why_it_cannot() -> None:
    """scripts/gpu-check's scenarios: as they are when they fit; else one rank per GPU with their faults aimed at the
    ranks that remain; a fault only a peer can find is not run on one GPU (never a run that cannot find it)."""
    demo, why = on_gpus(load("demo"), 3)
    assert why is None and demo is not None and demo.job.device == "cuda" and demo.job.nproc == 3
    assert demo.faults == load("demo").faults
    kill, why = on_gpus(load("kill-boundary"), 1)
    assert why is None and kill is not None and kill.name == "kill-boundary-1gpu"
    assert (kill.job.nproc, kill.job.device, [f.slot for f in kill.faults]) == (1, "cuda", [0])
    two, _ = on_gpus(load("demo"), 2)
    assert two is not None and two.job.nproc == 2 and all(f.slot < 2 for f in two.faults)
    hang, why = on_gpus(load("hang"), 1)
    assert hang is None and why is not None and "needs 2 GPUs" in why and "hang" in why
