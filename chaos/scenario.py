"""Scenario files (TOML): the job to run and the faults to inject, validated up front.

A scenario has a `name`, a `description`, a `[job]` table (nproc, steps, global_batch, ...) and `[[faults]]`
tables, each a `kind` with its target and `step`: `kind = "kill-boundary"`, `slot = 1`, `step = 40` SIGKILLs slot
1 right after step 39 is committed. A fault's `slot` is 0..nproc-1 for the workers and nproc.. for the hot spares
(`spares` of them, on the first node); `rank = r` aims at whoever trains as rank r when the fault fires. The bundled
scenarios (chaos/scenarios/*.toml) are complete examples. Every error names the key, the value and what is allowed.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ftcoord.config import Timing
from ftcoord.errors import ConfigError, FatalError
from training.config import GRAD_REDUCTIONS, MODELS, STRATEGIES, TrainConfig
from training.errors import TrainingConfigError

BUNDLED = Path(__file__).parent / "scenarios"

# Injected by the rank itself through the training hook (boundary-safe, exact step).
# stuck: the training thread stops making progress while its heartbeat thread runs (caught by the
# progress timeout and the culprit rule, ftcoord.leader.duty).
IN_RANK_KINDS = ("kill-boundary", "kill-midstep", "kill-midreduce", "raise", "raise-midstep", "slow", "stuck")
# Sent by the runner from outside, as real faults arrive. pause: SIGSTOP a process (a member or a spare)
# and SIGCONT it `duration` s later, as a cgroup freeze, swapping or a debugger would; pause-leader: the
# same for whoever leads at that step; hang: a pause meant to outlast the heartbeat timeout.
# store-restart: SIGKILL the store server, start a new, empty one on the same port `duration` s later;
# store-hang: SIGSTOP the store server, SIGCONT it `duration` s later (the run's store is then its own process).
# lose: SIGKILL a node's launcher and every process it started (their connections close at once); partition: SIGSTOP
# them (the node stops answering, as on a power or network loss: no connection closes, a peer blocked on one stays
# blocked), for good, or SIGCONT them `duration` s later when one is given (the partition heals: they run on, ghosts
# of generations long decided); replace: a new launcher for a lost or partitioned node (a partitioned one is killed).
# kill-standby: SIGKILL the warm standby of the node that runs `slot` (the template its ranks are forked from);
# pause-standby: SIGSTOP it, SIGCONT it `duration` s later (a fault that comes meanwhile is replaced without it).
# pause-launcher: SIGSTOP the launcher of the node that runs `slot` alone, SIGCONT it `duration` s later: its ranks
# train on, and whatever it must do meanwhile (replace a dead rank, kill a fenced one) waits for it.
# cut: no packet passes a node's links (control: to the store; data: its ranks' collectives), `duration` s or for good
# (chaos.run.network: the run's nodes in network namespaces of their own); cut-data, cut-control: that link only.
NETWORK_KINDS = ("cut", "cut-data", "cut-control")
CUT_LINKS = {"cut": ("control", "data"), "cut-data": ("data",), "cut-control": ("control",)}
"""The links of a node each network fault cuts (chaos.run.network.LINKS)."""
OUTSIDE_KINDS = ("kill", "kill-leader", "kill-follower", "hang", "pause", "pause-leader", "preempt", "ckpt-crash",
                 "lose", "partition", "replace", "early-restart", "store-restart", "store-hang", "kill-standby",
                 "pause-standby", "pause-launcher", *NETWORK_KINDS)
KINDS = IN_RANK_KINDS + OUTSIDE_KINDS
RANDOM_KINDS = ("kill-boundary", "kill-midstep", "kill", "kill-leader", "hang", "raise", "raise-midstep", "pause",
                "pause-leader", "stuck")
"""What a [random] table draws unless its `kinds` says otherwise."""
RANDOM_MORE_KINDS = ("kill-follower", "kill-midreduce", "store-restart", "store-hang", "pause-launcher", "kill-standby",
                     "pause-standby")
"""What a [random] table may also draw when its `kinds` lists them: every kind that needs no order with another fault
(node faults and relaunches do: a replace after a lose, one relaunch at a time; they stay written by hand)."""
# Kinds that may aim at a rank ("whoever holds rank r at that step") instead of a slot.
RANK_KINDS = ("kill-boundary", "kill-midstep", "kill-midreduce", "kill", "hang", "pause", "early-restart", "raise",
              "raise-midstep", "slow", "stuck")
# Kinds that pick their own target (the leader, a follower, every process).
SELF_AIMED_KINDS = ("kill-leader", "kill-follower", "pause-leader", "preempt", "store-restart", "store-hang")
STORE_KINDS = ("store-restart", "store-hang")
"""Faults of the store server: training rides through them (no generation change is expected)."""
STOP_KINDS = ("hang", "pause", "pause-leader")
"""SIGSTOP now, SIGCONT after the fault's duration."""
STANDBY_KINDS = ("kill-standby", "pause-standby")
"""Faults of a node's warm standby: its ranks train on (no generation change is expected)."""
# In-rank faults: what the training hook does, and where in the step.
IN_RANK_ACTIONS = {"kill-boundary": ("exit", "at_boundary"), "kill-midstep": ("exit", "after_backward"),
                   "kill-midreduce": ("exit", "mid_reduction"),
                   "raise": ("raise", "at_boundary"), "raise-midstep": ("raise", "after_backward"),
                   "slow": ("sleep", "at_boundary"), "stuck": ("stall", "at_boundary")}


class ScenarioError(FatalError, ValueError):
    """A scenario file is malformed or asks for something the job cannot do."""


DEVICES = ("cpu", "cuda")
"""Where a scenario's ranks train (not "auto": a run and its reference must use the same device)."""


@dataclass(frozen=True)
class JobSpec:
    nproc: int = 2
    spares: int = 0
    nodes: tuple[tuple[int, ...], ...] = ()
    """Slots per node (one launcher each); default: one node with every slot."""
    steps: int = 120
    global_batch: int = TrainConfig.global_batch
    model: str = TrainConfig.model
    dataset: str = "synthetic:1024"
    seed: int = TrainConfig.seed
    lr: float = TrainConfig.lr
    optimizer: str = TrainConfig.optimizer
    step_time: float = 0.0
    sample_time: float = 0.0
    """Seconds per sample of a rank's shard (see training's --sample-time)."""
    ckpt_strategy: str = "blocking"
    ckpt_every: int = 40
    restart_policy: str = "slot"
    warm_standby: int = 1
    min_world_size: int = 1
    heartbeat_interval: float = 0.2
    heartbeat_timeout: float = 2.0
    join_timeout: float = 3.0
    progress_timeout: float | None = None
    pg_timeout: float = 60.0
    grad_reduction: str = TrainConfig.grad_reduction
    device: str = "cpu"
    """Where the ranks train: "cpu" or "cuda" (one GPU per process: chaos.run.launchers.gpus_by_node)."""

    def trajectory_key(self) -> str:
        """What a fault-free reference run depends on: not faults, and not how processes are
        placed or supervised (nodes, spares, standbys, restart policy, timeouts)."""
        placement = {"nodes", "spares", "warm_standby", "restart_policy", "heartbeat_interval",
                     "heartbeat_timeout", "join_timeout", "progress_timeout", "pg_timeout", "min_world_size"}
        data = {k: v for k, v in asdict(self).items() if k not in placement and (k, v) != ("device", "cpu")}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=list).encode()).hexdigest()[:16]

    @property
    def node_slots(self) -> list[list[int]]:
        return [list(n) for n in self.nodes] if self.nodes else [list(range(self.nproc))]

    def node_of(self, slot: int) -> int:
        """The index of the node that runs `slot`; a hot spare's (slots nproc..) is the first node's, whose launcher
        runs the spares."""
        return next((i for i, slots in enumerate(self.node_slots) if slot in slots), 0)


def training_config(job: JobSpec) -> TrainConfig:
    """The training configuration every rank of this job runs (what its config hash must be)."""
    return TrainConfig(steps=job.steps, global_batch=job.global_batch, model=job.model, dataset=job.dataset,
                       seed=job.seed, lr=job.lr, optimizer=job.optimizer, grad_reduction=job.grad_reduction,
                       min_world_size=job.min_world_size, ckpt_strategy="none", device=job.device)


@dataclass(frozen=True)
class Fault:
    kind: str
    slot: int = 0
    step: int = 0
    duration: float = 0.0
    """hang: seconds stopped before SIGCONT; slow: seconds one step takes longer."""
    label: str = ""
    after: float = 0.0
    """Seconds after its step was committed that the fault fires (out-of-rank kinds): a second fault while the job
    stands still after a first one, whose step never comes (a preemption while a node does not answer)."""
    rank: int | None = None
    """Aim at whoever holds this rank when the fault fires, not at a slot (a slot may be a hot
    spare at that moment, or a replacement still starting)."""

    @property
    def in_rank(self) -> bool:
        return self.kind in IN_RANK_KINDS


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    job: JobSpec
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    path: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _job(table: dict[str, Any], where: str) -> JobSpec:
    names = {f.name for f in fields(JobSpec)}
    _check_keys(table, names, f"{where} [job]")
    values = dict(table)
    if "nodes" in values:
        values["nodes"] = _nodes(values["nodes"], values.get("nproc", JobSpec.nproc), where)
    try:
        job = JobSpec(**values)
    except TypeError as exc:
        raise ScenarioError(f"{where} [job]: {exc}") from exc
    for key, low in (("nproc", 1), ("steps", 1), ("global_batch", 1), ("ckpt_every", 1), ("spares", 0),
                     ("warm_standby", 0), ("min_world_size", 1), ("seed", 0)):
        if not _is_int(getattr(job, key)) or getattr(job, key) < low:
            counted = " (how many warm standbys a launcher keeps: 0 for none)" if key == "warm_standby" else ""
            raise ScenarioError(f"{where} [job] {key} = {getattr(job, key)!r}: must be an integer >= {low}{counted}")
    for key in ("step_time", "sample_time"):
        if not _is_number(value := getattr(job, key)) or value < 0:
            raise ScenarioError(f"{where} [job] {key} = {value!r}: must be a number >= 0")
    for key in ("lr", "heartbeat_interval", "heartbeat_timeout", "join_timeout", "pg_timeout", "progress_timeout"):
        value = getattr(job, key)
        if key == "progress_timeout" and value is None:  # the library's own default
            continue
        if not _is_number(value) or value <= 0:
            raise ScenarioError(f"{where} [job] {key} = {value!r}: must be a number > 0")
    if job.device not in DEVICES:
        raise ScenarioError(f"{where} [job] device = {job.device!r}: choose one of {', '.join(DEVICES)}")
    if job.min_world_size > job.nproc:
        raise ScenarioError(f"{where} [job] min_world_size = {job.min_world_size} is above nproc = {job.nproc}: "
                            f"the job could never start; lower it to {job.nproc} or less")
    try:  # what the launcher and every rank will check, checked before any process starts
        Timing(heartbeat_interval=job.heartbeat_interval, heartbeat_timeout=job.heartbeat_timeout,
               join_timeout=job.join_timeout)
    except ConfigError as exc:
        raise ScenarioError(f"{where} [job]: {exc}") from exc
    if job.global_batch % job.nproc:
        raise ScenarioError(f"{where} [job] global_batch = {job.global_batch} is not divisible by nproc = "
                            f"{job.nproc}; pick a divisor of the global batch for nproc")
    if job.model not in MODELS:
        raise ScenarioError(f"{where} [job] model = {job.model!r}: choose one of {list(MODELS)}")
    if job.ckpt_strategy not in STRATEGIES:
        raise ScenarioError(f"{where} [job] ckpt_strategy = {job.ckpt_strategy!r}: choose one of {list(STRATEGIES)}")
    if job.grad_reduction not in GRAD_REDUCTIONS:
        raise ScenarioError(f"{where} [job] grad_reduction = {job.grad_reduction!r}: choose one of "
                            f"{list(GRAD_REDUCTIONS)}")
    if job.restart_policy not in ("slot", "job"):
        raise ScenarioError(f"{where} [job] restart_policy = {job.restart_policy!r}: choose slot or job")
    if job.nodes:
        flat = sorted(s for node in job.nodes for s in node)
        if flat != list(range(job.nproc)):
            raise ScenarioError(f"{where} [job] nodes = {job.nodes}: must split the slots 0..{job.nproc - 1} "
                                f"exactly once each")
    try:
        training_config(job)  # the dataset, the optimizer, ...: as every rank will parse them
    except TrainingConfigError as exc:
        raise ScenarioError(f"{where} [job]: {exc}") from exc
    return job


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)  # type: ignore[arg-type]


def _nodes(value: object, nproc: object, where: str) -> tuple[tuple[int, ...], ...]:
    """`nodes`: a list of lists of slots, one list per node (`nodes = [[0, 1], [2, 3]]`)."""
    if isinstance(value, list) and value and all(isinstance(node, list) and node and all(_is_int(s) for s in node)
                                                 for node in value):
        return tuple(tuple(node) for node in value)
    example = "[[0], [1]]"
    if _is_int(value) and _is_int(nproc) and value >= 1 and nproc % value == 0:  # type: ignore[operator]
        per = nproc // value  # type: ignore[operator]
        example = str([list(range(i, i + per)) for i in range(0, nproc, per)])  # type: ignore[call-overload]
    raise ScenarioError(f"{where} [job] nodes = {value!r}: give the slots of each node, a list of lists of slot "
                        f"numbers, e.g. nodes = {example}")


def _fault(table: dict[str, Any], job: JobSpec, where: str) -> Fault:
    _check_keys(table, {f.name for f in fields(Fault)}, where)
    if "kind" not in table:
        raise ScenarioError(f"{where}: missing key 'kind'; one of {list(KINDS)}")
    fault = Fault(**table)
    if fault.kind not in KINDS:
        raise ScenarioError(f"{where}: unknown fault kind {fault.kind!r}; allowed: {list(KINDS)}")
    slots = job.nproc + job.spares
    if fault.rank is not None:
        if fault.kind not in RANK_KINDS:
            raise ScenarioError(f"{where}: {fault.kind} cannot aim at a rank; rank works with {list(RANK_KINDS)}")
        if "slot" in table:
            raise ScenarioError(f"{where}: give slot or rank, not both")
        if not isinstance(fault.rank, int) or not 0 <= fault.rank < job.nproc:
            raise ScenarioError(f"{where}: rank = {fault.rank!r} is beyond the job (ranks 0..{job.nproc - 1})")
    if not 0 <= fault.slot < slots and fault.kind not in SELF_AIMED_KINDS:
        raise ScenarioError(f"{where}: slot = {fault.slot} is beyond the job (slots 0..{slots - 1})")
    if not 0 <= fault.step < job.steps:
        raise ScenarioError(f"{where}: step = {fault.step} is beyond the run (steps 0..{job.steps - 1})")
    if fault.step == 0 and at_boundary(fault.kind):
        raise ScenarioError(f"{where}: a {fault.kind} at step 0 never fires: it fires at the boundary before its step, "
                            f"once step - 1 is committed; give step = 1 or more")
    if not isinstance(fault.after, int | float) or fault.after < 0:
        raise ScenarioError(f"{where}: after = {fault.after!r}: give the seconds after its step (0 or more)")
    if fault.after > 0 and (fault.in_rank or fault.kind == "ckpt-crash"):
        raise ScenarioError(f"{where}: a {fault.kind} fires inside its rank's step, not {fault.after}s after it; "
                            f"after works with {[k for k in OUTSIDE_KINDS if k != 'ckpt-crash']}")
    unfit = _unfit_for(fault.kind, job)
    if unfit is not None:
        raise ScenarioError(f"{where}: {unfit}")
    if fault.kind in (*STOP_KINDS, *STORE_KINDS, "slow", "pause-standby", "pause-launcher") and fault.duration <= 0:
        what = ("busy with one step" if fault.kind == "slow" else "away" if fault.kind in STORE_KINDS else "stopped")
        raise ScenarioError(f"{where}: a {fault.kind} needs duration > 0 seconds (how long the "
                            f"{'store' if fault.kind in STORE_KINDS else 'process'} stays {what})")
    if fault.kind in ("partition", "cut") and 0 < fault.duration <= job.heartbeat_timeout:
        raise ScenarioError(f"{where}: a {fault.kind} of duration = {fault.duration}s is ridden through "
                            f"(heartbeat_timeout = {job.heartbeat_timeout}s); give more than the heartbeat timeout, "
                            f"or none (for good)")
    if fault.kind == "cut-data" and 0 < fault.duration <= job.heartbeat_timeout:
        raise ScenarioError(f"{where}: a cut-data of duration = {fault.duration}s is over before a dead data link "
                            f"can be told from a slow step (heartbeat_timeout = {job.heartbeat_timeout}s); give more "
                            f"than the heartbeat timeout, or none (for good)")
    if fault.kind in ("lose", "partition", "replace") and not job.nodes:
        raise ScenarioError(f"{where}: {fault.kind} works on a node; declare [job] nodes = [[0], [1], ...]")
    if fault.kind in NETWORK_KINDS and job.device == "cuda":
        raise ScenarioError(f"{where}: {fault.kind} cuts a node's links, and the ranks of a cuda job on one machine "
                            f"talk through NCCL's shared memory and GPU peer access, which no link cut stops; use "
                            f"device = \"cpu\" for network faults")
    if fault.kind in NETWORK_KINDS and len(job.node_slots) < 2:
        raise ScenarioError(f"{where}: {fault.kind} cuts a node off from the others; declare two nodes or more: "
                            f"[job] nodes = [[0], [1], ...]")
    if fault.kind == "ckpt-crash" and job.ckpt_strategy == "none":
        raise ScenarioError(f"{where}: ckpt-crash needs a checkpoint strategy, not 'none'")
    return fault


def _unfit_for(kind: str, job: JobSpec) -> str | None:
    """Why a fault of `kind`, written or drawn, could not fire in this job; None when it can."""
    if kind in STANDBY_KINDS and (not job.warm_standby or job.restart_policy == "job"):
        return (f"{kind} needs a warm standby: this job has warm_standby = {job.warm_standby} and restart_policy = "
                f"{job.restart_policy!r} (the standby needs 1 and 'slot')")
    if kind == "kill-midreduce" and job.grad_reduction != "fixed":
        return (f"kill-midreduce fires inside the fixed-order gradient reduction; this job uses grad_reduction = "
                f"{job.grad_reduction!r}")
    return None


RELAUNCHING_KINDS = ("preempt", "ckpt-crash")
"""Faults after which the run starts every node's launcher again."""


def _check_nodes_down(faults: tuple[Fault, ...], job: JobSpec, where: str) -> None:
    """A replace starts a new launcher for a node that a lose, or a partition, took before it; a lose or a partition
    needs a node that runs (not one lost for good and not replaced since). Either mistake fired at nothing, and failed
    the run only at its end."""
    down: dict[int, str] = {}  # node index -> "lost" (for good) or "partitioned" (healed by then, maybe)
    for number, fault in sorted(enumerate(faults, 1), key=lambda pair: pair[1].step):
        if fault.kind in RELAUNCHING_KINDS:
            down.clear()
        if fault.kind not in ("lose", "partition", "replace", *NETWORK_KINDS):
            continue
        node = job.node_of(fault.slot)
        at = f"{where} [[faults]] #{number}: {fault.kind} of node {node} (slot {fault.slot}) at step {fault.step}"
        if fault.kind == "replace":
            if node not in down:
                raise ScenarioError(f"{at}: that node is running then; a replace starts a new launcher for a node a "
                                    f"lose or a partition took at an earlier step: plan one of them first")
            del down[node]
        elif down.get(node) == "lost":
            raise ScenarioError(f"{at}: that node was lost for good at an earlier step and not replaced since; plan a "
                                f"replace between them, or aim at another node")
        else:
            down[node] = "lost" if fault.kind == "lose" or fault.duration <= 0 else "partitioned"


def ranks_kept(job: JobSpec) -> int:
    """The ranks a job holds at every step it trains: ranks are numbered densely from 0, so rank r exists whenever
    the world is larger than r. A job of several nodes trains without one of them for a while (a node lost); one
    node's job gets every slot back (its replacements are waited for). Never below min_world_size: no step is
    trained below it."""
    kept = job.nproc
    if len(job.nodes) > 1:
        kept -= max(len(node) for node in job.nodes)
    return max(kept, job.min_world_size, 1)


def random_faults(job: JobSpec, seed: int, mtbf_steps: float, margin: int = 10,
                  kinds: tuple[str, ...] = RANDOM_KINDS) -> tuple[Fault, ...]:
    """Faults drawn from an MTBF (in steps): kinds, slots and steps all from the seed. A fault aimed at a rank aims
    at one the job keeps at every step (`ranks_kept`), or it might aim at a rank that does not exist when it comes.
    Left out, because an in-rank fault would never fire or one sent from outside would find the process dead or
    changed:
    - a second fault for the rank and step of an earlier one: the first ends that rank's step, its peers commit it,
      and a committed step is not run again;
    - a fault sent from outside at step s to the rank of an in-rank fault at step s - 1, in either order drawn: it is
      sent once any rank committed step s - 1, and the rank it aims at may still be in that step, before its point;
    - an in-rank fault at the boundary of step s for the rank of an in-rank fault inside step s - 1, in either order
      drawn: that one ends the rank's step s - 1 before its commit, so nobody holding the rank passes the boundary;
    - a boundary fault at step 0: no boundary comes before step 0.
    A fault left out takes its draws all the same, so the rest of the schedule is unchanged.

    `kinds` (RANDOM_KINDS unless a [random] table lists others): the kinds drawn from. A store fault, or a pause of a
    launcher or of a standby, lasts half or three heartbeat timeouts, as a pause does; a launcher's or a standby's is
    that of the node of a slot drawn among the job's. Only those kinds draw a duration or a node, so the draws for
    RANDOM_KINDS do not depend on which other kinds exist."""
    rng = random.Random(seed)
    faults, step, ranks = [], 0.0, ranks_kept(job)
    aimed: dict[tuple[int, int], str] = {}  # (rank, step) of the faults aimed at a rank -> its point (ends_first)
    while True:
        step += rng.expovariate(1.0 / mtbf_steps)
        if step >= job.steps - margin:
            return tuple(faults)
        kind = rng.choice(kinds)
        # A pause shorter than the heartbeat timeout is ridden through; a longer one is a hang.
        duration = (3 * job.heartbeat_timeout if kind == "hang" else
                    rng.choice((0.5, 3.0)) * job.heartbeat_timeout if kind in (*STOP_KINDS, *TIMED_MORE_KINDS) else 0.0)
        target = rng.randrange(ranks)  # a rank: spares and replacements cannot make it miss
        slot = rng.randrange(job.nproc) if kind in NODE_AIMED_MORE_KINDS else 0  # whose node's launcher or standby
        if int(step) == 0 and at_boundary(kind):
            continue  # it would never fire: no boundary comes before step 0
        if kind in RANK_KINDS:
            at, point = (target, int(step)), IN_RANK_ACTIONS[kind][1] if kind in IN_RANK_KINDS else OUTSIDE
            if at in aimed or ends_first(aimed.get((target, at[1] - 1)), point) or ends_first(
                    point, aimed.get((target, at[1] + 1))):
                continue
            aimed[at] = point
        faults.append(Fault(kind=kind, slot=slot, step=int(step), duration=duration, label=f"random-{len(faults)}",
                            rank=target if kind in RANK_KINDS else None))


TIMED_MORE_KINDS = ("store-restart", "store-hang", "pause-launcher", "pause-standby")
"""Kinds of RANDOM_MORE_KINDS that last a drawn duration."""
NODE_AIMED_MORE_KINDS = ("pause-launcher", "kill-standby", "pause-standby")
"""Kinds of RANDOM_MORE_KINDS aimed at the node of a drawn slot."""


def random_kinds(value: Any, job: JobSpec, where: str) -> tuple[str, ...]:
    """A [random] table's `kinds`, checked: a non-empty list of distinct kinds random_faults can draw for this job."""
    allowed = RANDOM_KINDS + RANDOM_MORE_KINDS
    if not isinstance(value, list) or not value or not all(isinstance(k, str) for k in value):
        raise ScenarioError(f"{where} kinds = {value!r}: give a non-empty list of fault kinds, from {list(allowed)}")
    for kind in value:
        if kind not in allowed:
            why = " (it must be ordered with other faults: write it as a [[faults]] table)" if kind in KINDS else ""
            raise ScenarioError(f"{where} kinds: {kind!r} cannot be drawn{why}; drawn kinds are {list(allowed)}")
        unfit = _unfit_for(kind, job)
        if unfit is not None:
            raise ScenarioError(f"{where} kinds: {unfit}")
    if len(set(value)) != len(value):
        raise ScenarioError(f"{where} kinds = {value!r}: a kind listed twice (each is drawn as often as the others)")
    return tuple(value)


def at_boundary(kind: str) -> bool:
    """Does an in-rank fault of this kind fire at the boundary before its step (after step - 1 is committed)?"""
    return kind in IN_RANK_ACTIONS and IN_RANK_ACTIONS[kind][1] == "at_boundary"


OUTSIDE = "outside"
"""The point of a fault sent from outside (ends_first): every other point is an in-rank fault's (IN_RANK_ACTIONS)."""


def ends_first(earlier: str | None, later: str | None) -> bool:
    """A fault at point `earlier` in step s - 1 leaves one at point `later` in step s of the same rank unfired
    (random_faults leaves such pairs out; chaos.proof.effects says why one never fired). None: no fault planned
    there."""
    if earlier is None or later is None:
        return False
    if later == OUTSIDE:  # sent once any rank committed step s - 1: the rank may still be before its fault's point
        return earlier != OUTSIDE
    return earlier in ("after_backward", "mid_reduction") and later == "at_boundary"  # its step ended uncommitted


def parse(text: str, where: str = "<scenario>") -> Scenario:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{where}: not valid TOML ({exc})") from exc
    return from_dict(data, where)


def from_dict(data: dict[str, Any], where: str = "<scenario>") -> Scenario:
    """A scenario from its TOML tables (campaigns compose these), validated."""
    _check_keys(data, {"name", "description", "job", "faults", "random"}, where)
    for key in ("name", "description"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ScenarioError(f"{where}: '{key}' must be a non-empty string")
    job = _job(data.get("job", {}), where)
    faults = tuple(_fault(t, job, f"{where} [[faults]] #{i + 1}") for i, t in enumerate(data.get("faults", [])))
    _check_nodes_down(faults, job, where)
    if "random" in data:
        rnd = data["random"]
        _check_keys(rnd, {"seed", "mtbf_steps", "kinds"}, f"{where} [random]")
        if not isinstance(rnd.get("mtbf_steps"), (int, float)) or rnd["mtbf_steps"] <= 0:
            raise ScenarioError(f"{where} [random] mtbf_steps = {rnd.get('mtbf_steps')!r}: must be > 0")
        seed = rnd.get("seed", 0)
        if not _is_int(seed):
            raise ScenarioError(f"{where} [random] seed = {seed!r}: must be an integer (a seed draws the same faults "
                                f"every time)")
        kinds = random_kinds(rnd["kinds"], job, f"{where} [random]") if "kinds" in rnd else RANDOM_KINDS
        faults += random_faults(job, seed, float(rnd["mtbf_steps"]), kinds=kinds)
    return Scenario(data["name"], data["description"], job, tuple(sorted(faults, key=lambda f: f.step)), where)


PEER_FOUND_KINDS = ("hang", "pause", "pause-leader", "kill-leader", "stuck", "partition")
"""Faults only a peer can find or outlive (a hung rank is found by the others; a killed leader needs a survivor)."""


def on_gpus(scenario: Scenario, gpus: int) -> tuple[Scenario | None, str | None]:
    """The scenario on cuda with one rank per GPU (NCCL lets no two ranks of a group share one): as it is when its
    processes fit `gpus`; else with `gpus` ranks on one node, no spares, each fault aimed at slot (or rank) modulo the
    ranks; None, and why, when a fault needs a peer and there would be none.

    Args:
        scenario: a loaded scenario.
        gpus: the GPUs of the machine it is to run on (>= 1).
    """
    job = scenario.job
    if job.nproc + job.spares <= gpus:
        return replace(scenario, job=replace(job, device="cuda")), None
    needs_peer = sorted({f.kind for f in scenario.faults if f.kind in PEER_FOUND_KINDS})
    if gpus < 2 and needs_peer:
        return None, (f"needs 2 GPUs: its {', '.join(needs_peer)} fault(s) need a peer to find or outlive them, and "
                      f"this machine has {gpus}")
    faults = tuple(replace(f, slot=f.slot % gpus, rank=None if f.rank is None else f.rank % gpus)
                   for f in scenario.faults)
    job = replace(job, device="cuda", nproc=gpus, spares=0, nodes=(), min_world_size=min(job.min_world_size, gpus))
    return replace(scenario, name=f"{scenario.name}-{gpus}gpu", job=job, faults=faults), None


def load(name_or_path: str) -> Scenario:
    """A bundled scenario by name (`kill-boundary`) or a TOML file by path."""
    path = toml_file(name_or_path, BUNDLED, "scenario")
    return parse(path.read_text(), str(path))


def toml_file(name_or_path: str, bundled: Path, what: str) -> Path:
    """A TOML file by path, or by the name of one bundled in `bundled`; a clear error otherwise."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = bundled / f"{name_or_path}.toml"
    if not path.is_file():
        raise ScenarioError(f"no {what} {name_or_path!r}: not a file, and not one of the bundled "
                            f"{sorted(p.stem for p in bundled.glob('*.toml'))}")
    return path


def bundled_names() -> list[str]:
    return sorted(p.stem for p in BUNDLED.glob("*.toml"))


def to_toml(scenario: Scenario) -> str:
    """The scenario as a TOML file that `parse` reads back (what a run directory keeps)."""
    lines = [f"name = {_toml_value(scenario.name)}", f"description = {_toml_value(scenario.description)}", "",
             "[job]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in asdict(scenario.job).items() if v is not None and v != ()]
    for fault in scenario.faults:
        values = {k: v for k, v in asdict(fault).items()
                  if v is not None and not (k == "slot" and fault.rank is not None)}
        lines += ["", "[[faults]]"] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def scenario_of(run_dir: Path) -> Scenario:
    """The scenario a run directory was made from (its scenario.toml)."""
    path = run_dir / "scenario.toml"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a chaos run directory (no scenario.toml); "
                                f"create one with `chaos run SCENARIO --out {run_dir}`")
    return parse(path.read_text(), str(path))
