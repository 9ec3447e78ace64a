"""Starting and stopping a scenario's launchers: one `ftcoord-launch` per node.

A run's launchers and ranks run this checkout's `ftcoord` and `training` (chaos.own_code: `python -P -m`, this checkout
first on PYTHONPATH), wherever `chaos run` was started from: a run started in a directory that holds another
checkout must not test that one's ranks against this one's verifier.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from chaos.machine_env import machine_env
from chaos.own_code import checkout_command, own_code_env
from chaos.run.inject import MARKER_DIR_ENV, PLAN_ENV
from chaos.run.network import DATA_IFNAME, Network
from chaos.run.planted import CKPT_CRASH_ENV, PLANTED_BUG_ENV
from chaos.scenario import JobSpec, ScenarioError
from ftcoord.launcher.children_env import omp_threads_per_process


def training_args(job: JobSpec, ckpt_dir: Path | None) -> list[str]:
    """The `python -m training` command line of one rank of this job."""
    args = ["--steps", str(job.steps), "--global-batch", str(job.global_batch), "--model", job.model,
            "--dataset", job.dataset, "--seed", str(job.seed), "--lr", str(job.lr), "--optimizer", job.optimizer,
            "--step-time", str(job.step_time), "--sample-time", str(job.sample_time),
            "--min-world-size", str(job.min_world_size), "--grad-reduction", job.grad_reduction,
            "--heartbeat-interval", str(job.heartbeat_interval), "--heartbeat-timeout", str(job.heartbeat_timeout),
            "--join-timeout", str(job.join_timeout), "--pg-timeout", str(job.pg_timeout),
            "--device", job.device, "--hook", "chaos.run.inject:hook"]
    if job.progress_timeout:
        args += ["--progress-timeout", str(job.progress_timeout)]
    if ckpt_dir is not None and job.ckpt_strategy != "none":
        args += ["--ckpt-dir", str(ckpt_dir), "--ckpt-strategy", job.ckpt_strategy, "--ckpt-every", str(job.ckpt_every)]
    return args


def visible_gpus() -> list[str]:
    """The GPUs this process may hand out, as CUDA_VISIBLE_DEVICES names them (its own, when set, narrows them)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [name.strip() for name in visible.split(",") if name.strip()]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


def gpus_by_node(job: JobSpec, gpus: list[str]) -> list[str]:
    """Each node's CUDA_VISIBLE_DEVICES for a cuda job: the "nodes" share one machine, and one GPU serves one process
    (ftcoord.wrapper.device), so node i sees GPUs of its own (from `gpus`, visible_gpus()), one per worker and hot
    spare of its launcher.

    Raises:
        ScenarioError: the job runs more processes than there are GPUs.
    """
    counts = [len(slots) + (job.spares if index == 0 else 0) for index, slots in enumerate(job.node_slots)]
    if sum(counts) > len(gpus):
        raise ScenarioError(f"device = \"cuda\": the job runs {sum(counts)} processes (workers and spares over "
                            f"{len(counts)} node(s)), one GPU each, and this machine has {len(gpus)} GPU(s) to give; "
                            f"lower nproc or spares, or use device = \"cpu\"")
    first = [sum(counts[:i]) for i in range(len(counts))]
    return [",".join(gpus[start:start + count]) for start, count in zip(first, counts, strict=True)]


@dataclass
class Node:
    index: int
    slots: list[int]
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    partitioned: bool = False
    """Stopped for good by a partition fault (its processes still exist)."""
    cut_off: bool = False
    """Its links cut for good by a network fault (its processes run on, alone)."""


CRASH_LOOP_RESTARTS = 20
"""Restarts of one slot a launcher allows beyond those the scenario's own faults cause: the net that stops a crash
loop (a rank that dies at every start), never one a schedule of planned deaths runs into."""


class Launchers:
    """The launchers of one run: start, preempt (SIGTERM), lose (SIGKILL everything), partition (SIGSTOP everything)
    and restart."""

    def __init__(self, job: JobSpec, store: str, job_id: str, out: Path, plan: list[dict], crash: str | None,
                 output: Path, reference: bool = False, faults: int = 0,
                 network: Network | None = None) -> None:
        """`faults`: how many faults the scenario plans (each may cost a slot one restart, so a schedule of planned
        deaths never exhausts a launcher's restarts); `network`: the run's own network (chaos.run.network), each
        node's launcher started in its node's namespace, its ranks' collectives on the node's data link."""
        self.job, self.store, self.job_id, self.out = job, store, job_id, out
        self.max_restarts = CRASH_LOOP_RESTARTS + faults
        self.nodes = [Node(i, slots) for i, slots in enumerate(job.node_slots)]
        self.env = own_code_env(machine_env(**{PLAN_ENV: json.dumps(plan), MARKER_DIR_ENV: str(out)}))
        # The "nodes" share one host: split its cores over all ranks, not per launcher.
        self.env.setdefault("OMP_NUM_THREADS", omp_threads_per_process(job.nproc))
        if crash:
            self.env[CKPT_CRASH_ENV] = crash
        if reference:
            self.env.pop(PLANTED_BUG_ENV, None)  # a reference is what a correct run makes: never a planted bug
        self.network = network
        if network is not None:
            self.env["GLOO_SOCKET_IFNAME"] = DATA_IFNAME
        self.gpus: list[str] = []  # each node's CUDA_VISIBLE_DEVICES (a cuda job's)
        if job.device == "cuda":
            self.gpus = gpus_by_node(job, visible_gpus())
        self.output = output.open("ab")

    def command(self, node: Node) -> list[str]:
        job = self.job
        launcher = ["--store", self.store, "--job-id", self.job_id, "--nproc", str(len(node.slots)),
                    "--first-slot", str(node.slots[0]), "--world-size", str(job.nproc),
                    "--spares", str(job.spares if node.index == 0 else 0), "--warm-standby", str(job.warm_standby),
                    "--restart-policy", job.restart_policy, "--max-restarts", str(self.max_restarts), "--grace", "30",
                    "--log-dir", str(self.out / "logs")]
        return checkout_command("ftcoord.launcher.main", [*launcher, "--", *checkout_command("training", training_args(
            job, self.out / "ckpt"))])

    def start(self, node: Node) -> None:
        if node.partitioned:  # the old machine is powered off before a new one takes its place
            self.kill(node)
            node.partitioned = False
        command = self.command(node)
        if self.network is not None:
            if node.cut_off or self.network.nodes[node.index].cut:  # a new machine, links working, in its place
                self.kill(node)
                self.network.replaced(node.index)
                node.cut_off = False
            command = self.network.enter(node.index, command)
        env = {**self.env, "CUDA_VISIBLE_DEVICES": self.gpus[node.index]} if self.gpus else self.env
        node.process = subprocess.Popen(command, env=env, stdout=self.output,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        node.starts += 1

    def start_all(self) -> None:
        for node in self.nodes:
            self.start(node)

    def node_of(self, slot: int) -> Node:
        """The node that runs `slot` (JobSpec.node_of: a hot spare's is the first, so a spare's slot has a node too)."""
        return self.nodes[self.job.node_of(slot)]

    def standby_of(self, node: Node) -> int | None:
        """The pid of the node's warm standby (its launcher's child that runs ftcoord.launcher.standby_template); None
        when it has none running."""
        if node.process is None or node.process.poll() is not None:
            return None
        for children in Path(f"/proc/{node.process.pid}/task").glob("*/children"):
            for pid in children.read_text().split():
                with contextlib.suppress(OSError):
                    if b"ftcoord.launcher.standby_template" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                        return int(pid)
        return None

    def _signal_group(self, node: Node, signum: int) -> bool:
        """Send `signum` to the node's launcher and every process it started; False when its launcher has ended."""
        if node.process is None or node.process.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, signum)
        return True

    def kill(self, node: Node) -> None:
        """The node is lost: its launcher and every process it started die at once."""
        if self._signal_group(node, signal.SIGKILL):
            assert node.process is not None
            node.process.wait()

    def stop(self, node: Node) -> None:
        """The node stops answering for good (a partition): its launcher and every process it started are stopped,
        their connections left open, as a peer sees a node that lost power or its network."""
        if self._signal_group(node, signal.SIGSTOP):
            node.partitioned = True

    def resume(self, node: Node) -> None:
        """A partition heals: the node's launcher and processes run on, from where they were stopped."""
        if node.partitioned:
            self._signal_group(node, signal.SIGCONT)
        node.partitioned = False

    def partitioned_groups(self) -> set[int]:
        """The process groups that a partition holds stopped (a node's launcher leads its node's group)."""
        return {node.process.pid for node in self.nodes if node.partitioned and node.process is not None}

    def kill_all(self) -> None:
        """Every node is lost: all are signalled before any is waited for (an interrupt during a wait leaves none
        running)."""
        signalled = [node for node in self.nodes if self._signal_group(node, signal.SIGKILL)]
        for node in signalled:
            assert node.process is not None
            node.process.wait()

    def terminate_all(self) -> None:
        """Preemption: SIGTERM to every launcher (they forward it to their ranks)."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)

    def running(self) -> list[Node]:
        return [n for n in self.nodes
                if n.process is not None and n.process.poll() is None and not n.partitioned and not n.cut_off]

    def exit_codes(self) -> dict[int, int | None]:
        return {n.index: (n.process.returncode if n.process else None) for n in self.nodes}

    def close(self) -> None:
        self.kill_all()
        self.output.close()
