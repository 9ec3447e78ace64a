"""The device path, everything of it a CPU can run: which device a rank picks and when it is refused, the NCCL
group's abort by the release watch, a GPU wait counted as waiting on peers, the GPUs a chaos node sees, the checks
on a scenario's device. What only a GPU can run is in tests/integration/test_device.py (marker `gpu`)."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from chaos.proof import model_check
from chaos.proof.model_check import step_plan
from chaos.proof.replay import StepPlan, replay_device
from chaos.proof.verify import Verdict
from chaos.run.launchers import gpus_by_node, visible_gpus
from chaos.scenario import JobSpec, ScenarioError, load, on_gpus, parse, to_toml
from ftcoord.errors import ConfigError
from ftcoord.liveness.group_release import GroupRelease
from ftcoord.liveness.still_stack import waits_on_peers
from ftcoord.wrapper.call import CallWrapper, GenerationInterrupted
from ftcoord.wrapper.device import local_device, pick_device
from tests.helpers.wait import wait_until
from tests.unit.test_release import Interrupt
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
    (CallWrapper.wait_for_device) never takes it for done; and a death is not waited on for the grace (60 s here)."""
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


def _frame_of_a_thread_blocked_in(filename: str) -> bool:
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
    return answer


def test_a_training_thread_in_a_cuda_synchronisation_waits_on_its_peers() -> None:
    """Under NCCL a collective returns at once and the wait lands in torch.cuda.synchronize: a rank there is not stuck
    on its own. The same wait in the training loop's own code is not a wait on peers."""
    assert _frame_of_a_thread_blocked_in(torch.cuda.__file__)
    assert not _frame_of_a_thread_blocked_in("/srv/job/training/loop.py")


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
    assert gpus_by_node(JobSpec(nproc=2), ["0", "1"]) == ["0,1"]
    assert gpus_by_node(JobSpec(nproc=2, nodes=((0,), (1,))), ["0", "1", "2", "3"]) == ["0", "1"]
    assert gpus_by_node(JobSpec(nproc=3, spares=1, nodes=((0, 1), (2,))), list("0123")) == ["0,1,2", "3"]
    # Under CUDA_VISIBLE_DEVICES=2,3 the children get those two, not 0 and 1.
    assert gpus_by_node(JobSpec(nproc=2, nodes=((0,), (1,))), ["2", "3"]) == ["2", "3"]
    with pytest.raises(ScenarioError, match=r"runs 3 processes .* this machine has 2 GPU\(s\)"):
        gpus_by_node(JobSpec(nproc=3), ["0", "1"])


def test_the_gpus_to_give_are_those_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert visible_gpus() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []


def test_a_scenario_s_device_is_checked_and_kept() -> None:
    text = 'name = "x"\ndescription = "y"\n[job]\ndevice = "cuda"\n'
    scenario = parse(text)
    assert scenario.job.device == "cuda" and parse(to_toml(scenario)).job.device == "cuda"
    assert scenario.job.trajectory_key() != JobSpec().trajectory_key()  # a GPU run has references of its own
    with pytest.raises(ScenarioError, match=r"device = 'auto': choose one of cpu, cuda"):
        parse(text.replace('"cuda"', '"auto"'))


@NO_GPU
def test_a_gpu_run_is_not_replayed_on_a_cpu() -> None:
    """The arithmetic differs between devices: a replay on the CPU of a GPU run would fail it for no fault, and so
    would any replay of a run that moved between the two. The device comes from the run's own ledger lines."""
    assert replay_device([StepPlan(2), StepPlan(1)]) == torch.device("cpu")
    with pytest.raises(ValueError, match="trained on cuda"):
        replay_device([StepPlan(2, device="cuda")])
    with pytest.raises(ValueError, match="cpu and cuda by turns"):
        replay_device([StepPlan(2), StepPlan(2, device="cuda")])


def test_the_model_check_replays_on_the_device_the_ledger_names() -> None:
    """step_plan reads each generation's `device` (a ledger from before devices is the CPU's); ranks of one
    generation on different devices are a problem, never a guess."""
    def records(*devices: str | None) -> list[dict]:
        lines = []
        for rank, device in enumerate(devices):
            line = {"kind": "generation", "generation": 1, "rank": rank, "grad_reduction": "fixed", "threads": 1}
            lines.append(line if device is None else {**line, "device": device})
        return lines

    verdict = Verdict(steps=1, schedule=[2])
    effective = {0: 1}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_check, "effective_generations", lambda _records: effective)
        assert [p.device for p in step_plan(records("cuda", "cuda"), verdict)[0]] == ["cuda"]
        assert [p.device for p in step_plan(records(None, None), verdict)[0]] == ["cpu"]
        plan, problems = step_plan(records("cpu", "cuda"), verdict)
        assert not plan and "different devices" in problems[0]


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


# -- the training thread's wait for its GPU ------------------------------------------------------------------------


class _Participant:
    """What wait_for_device reads of the process's membership: whether the generation was interrupted, and why."""

    def __init__(self, interrupted: bool) -> None:
        self.interrupted = interrupted
        self.monitor = type("Monitor", (), {"reason": "heartbeat_stale:slot=1" if interrupted else None})()


def _call_on(device: str, interrupted: bool = False, aborted: bool = False) -> CallWrapper:
    """A generation's CallWrapper as init_process_group leaves it on `device` (no group: wait_for_device reads only the
    device, the interrupt and the release watch)."""
    call = object.__new__(CallWrapper)
    call._device, call._participant, call._backend, call._group = torch.device(device), _Participant(interrupted), \
        "nccl" if device != "cpu" else "gloo", None
    call._release = type("Release", (), {"aborted": aborted})()
    call.record = type("Record", (), {"generation": 7})()
    return call


@pytest.mark.parametrize(("interrupted", "aborted"), [(True, False), (False, True)])
def test_a_step_whose_collectives_were_aborted_does_not_commit(monkeypatch: pytest.MonkeyPatch, interrupted: bool,
                                                               aborted: bool) -> None:
    """An aborted NCCL all-reduce ends quietly and the device's wait returns: the step must still not reach the
    optimizer. (torch.cuda.synchronize is the one call a CPU cannot make; it is recorded instead.)"""
    waits: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", waits.append)
    with pytest.raises(GenerationInterrupted, match="generation 7"):
        _call_on("cuda:0", interrupted, aborted).wait_for_device()
    assert waits == [torch.device("cuda:0")]  # it waited first: nothing of the step is still queued


def test_a_step_on_a_healthy_gpu_goes_on_and_a_cpu_step_waits_for_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", waits.append)
    _call_on("cuda:1").wait_for_device()
    _call_on("cpu").wait_for_device()
    assert waits == [torch.device("cuda:1")]
