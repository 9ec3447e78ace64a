"""The run orchestrator: store, launchers, faults from outside, then verify and report."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.errors import NetworkError
from chaos.own_code import own_code_env
from chaos.run.inject import marker_name
from chaos.run.launchers import Launchers
from chaos.run.network import STORE_HOST, Network, in_own_namespace, own_namespace_command, unavailable
from chaos.run.progress import LedgerTail, ProgressDisplay
from chaos.run.run_store import HOST, RunStore
from chaos.scenario import (
    CUT_LINKS,
    IN_RANK_ACTIONS,
    NETWORK_KINDS,
    RANK_KINDS,
    STANDBY_KINDS,
    STOP_KINDS,
    STORE_KINDS,
    Fault,
    Scenario,
    parse,
    to_toml,
)
from ftcoord.host.process_state import state
from ftcoord.log import get_logger
from ftcoord.protocol.spares import spare_slot
from ftcoord.store.client import get_or_none
from ftcoord.store.link import StoreLink

RUN_TIMEOUT_S = 900.0
FIRE_RETRY_S = 10.0
"""A fault whose target has no live process yet (its replacement is starting) is retried this long."""
OUTCOME = "outcome.json"

ONE_PROCESS_KINDS = (*RANK_KINDS, "kill-leader", "kill-follower", "pause-leader")
"""Faults that hit one process of the job, chosen by rank, slot or role."""


def hit_member(kind: str, slot: int | None, tail: LedgerTail) -> bool | None:
    """Whether the process a fault hit was training then (a member of the newest generation) or not (a hot spare: its
    launcher is to replace it, chaos.proof.effects); None for a fault of no one process. The leader may be a hot spare
    (it leads until it dies, seated or not): a kill-leader that hit one changes no generation, and is not held to
    one."""
    return tail.is_member(slot) if kind in ONE_PROCESS_KINDS and slot is not None else None


@dataclass
class FaultEvent:
    """A fault as it happened: when (monotonic, this host), to whom, in which generation."""

    index: int
    """Its position in the scenario's fault list."""
    kind: str
    slot: int
    step: int
    mono: float
    pid: int | None = None
    generation: int = 0
    label: str = ""
    note: str = ""
    fired: bool = True
    """False when it never reached a live process (`note` says why)."""
    rank: int | None = None
    """The rank it was aimed at (None: aimed at a slot)."""
    member: bool | None = None
    """Whether the slot it hit was training (a member of the running generation) or a hot spare."""


@dataclass
class RunResult:
    out: Path
    job_id: str
    wall_s: float
    launcher_codes: list[dict[int, int | None]]
    faults: list[FaultEvent] = field(default_factory=list)
    completed: bool = False
    error: str | None = None
    timed_out: bool = False


class ChaosRunner:
    """Runs one scenario (or its fault-free reference when `faults` is empty)."""

    def __init__(self, scenario: Scenario, out: Path, *, with_faults: bool = True, quiet: bool = False,
                 timeout_s: float = RUN_TIMEOUT_S, title: str | None = None) -> None:
        self.scenario = scenario
        self.title = title or (scenario.name if with_faults else f"{scenario.name} (reference)")
        self.out = out
        self.faults = list(enumerate(scenario.faults)) if with_faults else []
        self.quiet = quiet
        self.timeout_s = timeout_s
        self.log = get_logger(component="chaos", scenario=scenario.name)
        self.events: list[FaultEvent] = []
        self._pending_conts: list[tuple[float, int]] = []
        self._pending_heals: list[tuple[float, int]] = []  # (when, node): a partition with a duration heals then
        self._pending_link_heals: list[tuple[float, int, tuple[str, ...]]] = []  # (when, node, links): a timed cut
        self.network_run = any(f.kind in NETWORK_KINDS for _, f in self.faults)
        """The run's nodes live in network namespaces of their own (chaos.run.network)."""
        self.network: Network | None = None
        self._relaunch_at: float | None = None
        self._crash_marker = out / "ckpt-crash-marker"
        self._lost: set[int] = set()  # nodes lost on purpose and not replaced

    # -- setup ----------------------------------------------------------------------

    def _plan(self) -> list[dict[str, Any]]:
        """In-rank faults become the training hook's plan (named by their index: one marker each)."""
        return [{"kind": IN_RANK_ACTIONS[f.kind][0], "point": IN_RANK_ACTIONS[f.kind][1], "step": f.step,
                 "name": f"fault{i}", "duration": f.duration,
                 **({"rank": f.rank} if f.rank is not None else {"slot": f.slot})} for i, f in self.faults if f.in_rank]

    def _crash_spec(self) -> str | None:
        crashes = [f for _, f in self.faults if f.kind == "ckpt-crash"]
        return f"kill:{self._crash_marker}:{crashes[0].step}" if crashes else None

    # -- the run --------------------------------------------------------------------

    def run(self) -> RunResult:
        if self.network_run and not in_own_namespace():
            return self._run_in_own_namespace()
        if self.out.exists():
            shutil.rmtree(self.out)
        (self.out / "logs").mkdir(parents=True)
        if self.network_run:
            self.network = Network(len(self.scenario.job.node_slots))
        try:
            server = self.server = RunStore(separate=any(f.kind in STORE_KINDS for _, f in self.faults),
                                            state_file=self.out / "store.boot",
                                            host=STORE_HOST if self.network is not None else HOST)
            return self._run(server)
        finally:
            if self.network is not None:
                self.network.close()

    def _run(self, server: RunStore) -> RunResult:
        # A scenario's name may say anything; a job id is a key prefix of a safe alphabet.
        job_id = f"chaos-{re.sub(r'[^A-Za-z0-9._-]+', '-', self.scenario.name)[:80]}-{uuid.uuid4().hex[:8]}"
        self._link = StoreLink(server.address, job_id)
        self.store = self._link.connect()  # rides through the run's own store faults
        launchers = Launchers(self.scenario.job, server.address, job_id, self.out, self._plan(), self._crash_spec(),
                              self.out / "launchers.out", reference=not self.faults, faults=len(self.faults),
                              network=self.network)
        tail = LedgerTail(self.out / "logs")
        display = ProgressDisplay(self.title, self.scenario.job.steps, len(self.faults), quiet=self.quiet)
        pending = [(i, f) for i, f in self.faults if not f.in_rank and f.kind != "ckpt-crash"]
        crash = next(((i, f) for i, f in self.faults if f.kind == "ckpt-crash"), None)
        retrying: dict[int, float] = {}  # fault index -> when it first found no live target
        reached: dict[int, float] = {}  # fault index -> when its step was first seen committed
        started = time.monotonic()
        codes: list[dict[int, int | None]] = []
        result = RunResult(self.out, job_id, 0.0, codes)
        try:
            launchers.start_all()  # inside: an interrupt while they start still ends those started
            while True:
                tail.poll()
                self._note_in_rank_faults(tail)
                now = time.monotonic()
                for index, fault in [(i, f) for i, f in pending if tail.committed() >= f.step]:
                    if now < reached.setdefault(index, now) + fault.after:
                        continue  # its step was committed; it fires `after` seconds later
                    give_up = now - retrying.setdefault(index, now) > FIRE_RETRY_S
                    if self._inject(index, fault, tail, launchers, give_up) or give_up:
                        pending.remove((index, fault))
                self._resume_stopped(now, launchers)
                self._heal_partitions(now, launchers)
                self._heal_links(now)
                server.tick(now)
                if crash is not None and self._crash_marker.exists():
                    # Rank 0 died inside a checkpoint write (planted in the commit); now the
                    # whole job is lost, so the relaunch must resume from disk.
                    self._record(*crash, tail, None, note="rank 0 died mid-write; whole job killed")
                    crash = None
                    launchers.kill_all()
                    self._relaunch_at = now
                if self._relaunch_at is not None and now >= self._relaunch_at and not launchers.running():
                    codes.append(launchers.exit_codes())
                    self._relaunch_at = None
                    launchers.start_all()
                    self.log.info("job_relaunched")
                display.update(tail, len(self.events))
                healing = any(launchers.nodes[index].partitioned for _, index in self._pending_heals)
                if not launchers.running() and self._relaunch_at is None and not healing:
                    # (a partitioned node that heals later runs on then: its launcher finds the job's end and exits)
                    codes.append(launchers.exit_codes())
                    break
                if now - started > self.timeout_s:
                    result.error = f"the run did not finish within {self.timeout_s:.0f}s"
                    result.timed_out = True
                    break
                time.sleep(0.02)
        finally:
            for _, pid in self._pending_conts:
                _signal(pid, signal.SIGCONT)
            launchers.close()
            display.close()
            server.close()
            self._link.close()
            _remove_flash_images(job_id)
        tail.poll()
        self._note_in_rank_faults(tail)
        result.wall_s = time.monotonic() - started
        result.faults = sorted(self.events, key=lambda e: e.mono)
        final = {node: code for node, code in (codes[-1] if codes else {}).items() if node not in self._lost}
        result.completed = result.error is None and bool(final) and all(code == 0 for code in final.values())
        if not result.completed and result.error is None:
            result.error = f"launchers exited with {final}; see {self.out / 'launchers.out'}"
        for event, outage in zip((e for e in result.faults if e.kind == "store-restart" and e.fired),
                                 server.outages, strict=False):
            event.note = outage.note()  # how long the store was away: what was asked and the new server's start
        (self.out / "faults.jsonl").write_text("".join(json.dumps(e.__dict__) + "\n" for e in result.faults))
        (self.out / OUTCOME).write_text(json.dumps(
            {"completed": result.completed, "error": result.error, "timed_out": result.timed_out,
             "launcher_codes": [{str(k): v for k, v in c.items()} for c in codes], "lost_nodes": sorted(self._lost),
             "wall_s": round(result.wall_s, 3), "with_faults": bool(self.faults), "job_id": job_id}, indent=1))
        return result

    def _run_in_own_namespace(self) -> RunResult:
        """Run this scenario in a child process in a network namespace of its own (chaos.run.network), and read
        back what it wrote (outcome.json, faults.jsonl). Interrupted, the child is given time to tear down."""
        why = unavailable()
        if why is not None:
            raise NetworkError(why)
        with tempfile.NamedTemporaryFile("w", suffix=".toml", prefix="chaos-scenario-", delete=False) as spec:
            spec.write(to_toml(self.scenario))
        argv = ["-P", "-m", "chaos.run.runner", spec.name, str(self.out), "--title", self.title,
                "--timeout", str(self.timeout_s), "--where", self.scenario.path or self.scenario.name,
                *(["--quiet"] if self.quiet else [])]
        for old in (OUTCOME, "faults.jsonl"):  # an earlier run's must never be read back as this one's
            (self.out / old).unlink(missing_ok=True)
        child = subprocess.Popen(own_namespace_command(argv), env=own_code_env())
        try:
            code = child.wait()
        except BaseException:  # ^C, or SIGTERM made one (a campaign): the child tears down, then this ends
            child.send_signal(signal.SIGINT)
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            raise
        finally:
            os.unlink(spec.name)
        if code != 0 or not (self.out / OUTCOME).is_file() or not (self.out / "faults.jsonl").is_file():
            return RunResult(self.out, "", 0.0, [], error=f"the run in its own network namespace exited with "
                                                          f"{code}; see the lines above")
        outcome = json.loads((self.out / OUTCOME).read_text())
        faults = [FaultEvent(**json.loads(line)) for line in (self.out / "faults.jsonl").read_text().splitlines()]
        return RunResult(self.out, outcome["job_id"], outcome["wall_s"],
                         [{int(k): v for k, v in codes.items()} for codes in outcome["launcher_codes"]], faults,
                         outcome["completed"], outcome["error"], outcome["timed_out"])

    # -- faults -------------------------------------------------------------------------

    def _record(self, index: int, fault: Fault, tail: LedgerTail, pid: int | None, note: str = "",
                mono: float | None = None, fired: bool = True, slot: int | None = None) -> None:
        when = time.monotonic() if mono is None else mono
        hit = fault.slot if slot is None else slot
        member = hit_member(fault.kind, hit, tail)
        event = FaultEvent(index, fault.kind, hit, fault.step, when, pid, tail.generation_before(when), fault.label,
                           note, fired, fault.rank, member)
        self.events.append(event)
        self.log.info("fault_injected", **event.__dict__)

    def _note_in_rank_faults(self, tail: LedgerTail) -> None:
        """In-rank faults leave a marker file with the time they fired."""
        for index, fault in self.faults:
            if not fault.in_rank or any(e.index == index for e in self.events):
                continue
            point = IN_RANK_ACTIONS[fault.kind][1]
            rank_or_slot = (None, fault.rank) if fault.rank is not None else (fault.slot, None)
            marker = self.out / marker_name(f"fault{index}", *rank_or_slot, point, fault.step)
            if marker.exists() and marker.stat().st_size:
                fired = json.loads(marker.read_text())
                self._record(index, fault, tail, fired["pid"], mono=fired["mono"], slot=fired.get("slot"))

    def _inject(self, index: int, fault: Fault, tail: LedgerTail, launchers: Launchers, give_up: bool) -> bool:
        """Inject one outside fault; False when its target has no live process (yet)."""
        kind = fault.kind
        if kind in ("kill", "early-restart", "kill-leader", "kill-follower", *STOP_KINDS):
            slot: int | None = fault.slot
            if kind in ("kill-leader", "kill-follower", "pause-leader"):
                if self._store_away():  # who leads is read from the store, which this loop brings back: retry
                    if give_up:
                        self._record(index, fault, tail, None, note=f"the store was away for {FIRE_RETRY_S:.0f}s",
                                     fired=False)
                    return False
                holder = get_or_none(self.store, "leader")
                parts = holder.decode().split(":") if holder else []
                leader = int(parts[1]) if len(parts) == 3 else None
                members = tail.members_of[max(tail.members_of)] if tail.members_of else []
                slot = leader if kind != "kill-follower" else next((m for m in members if m != leader), None)
            elif fault.rank is not None:
                slot = tail.slot_of_rank(fault.rank)
            elif fault.slot >= self.scenario.job.nproc:  # the scenario's slots nproc.. are node 0's hot spares
                slot = spare_slot(self.scenario.job.node_slots[0][0], fault.slot - self.scenario.job.nproc)
            pid = tail.pid_of_slot.get(slot) if slot is not None else None
            signum = signal.SIGSTOP if kind in STOP_KINDS else signal.SIGKILL
            if not _signal(pid, signum):
                if give_up:
                    why = (f"slot {slot} had no live process (pid {pid})" if slot is not None else
                           "no process led" if kind in ("kill-leader", "pause-leader") else
                           "no member but the leader" if kind == "kill-follower" else
                           f"no process held rank {fault.rank}")
                    self._record(index, fault, tail, pid, note=f"{why} for {FIRE_RETRY_S:.0f}s", fired=False,
                                 slot=slot)
                return False
            self._record(index, fault, tail, pid, slot=slot)
            if kind in STOP_KINDS:
                self._pending_conts.append((time.monotonic() + fault.duration, pid))
        elif kind in STANDBY_KINDS:
            node = launchers.node_of(fault.slot)
            pid = launchers.standby_of(node)
            if not _signal(pid, signal.SIGSTOP if kind == "pause-standby" else signal.SIGKILL):
                if give_up:
                    self._record(index, fault, tail, pid, fired=False,
                                 note=f"node {node.index} had no standby for {FIRE_RETRY_S:.0f}s")
                return False
            self._record(index, fault, tail, pid, note=f"node {node.index}'s standby")
            if kind == "pause-standby":
                self._pending_conts.append((time.monotonic() + fault.duration, pid))
        elif kind == "pause-launcher":
            node = launchers.node_of(fault.slot)
            pid = node.process.pid if node.process is not None and node.process.poll() is None else None
            if node.partitioned or not _signal(pid, signal.SIGSTOP):
                if give_up:
                    self._record(index, fault, tail, pid, fired=False,
                                 note=f"node {node.index}'s launcher was not running for {FIRE_RETRY_S:.0f}s")
                return False
            self._record(index, fault, tail, pid, note=f"node {node.index}'s launcher, {fault.duration}s")
            self._pending_conts.append((time.monotonic() + fault.duration, pid))
        elif kind == "store-restart":
            self._record(index, fault, tail, self.server.kill(fault.duration))  # its note: at the run's end
        elif kind == "store-hang":
            self._record(index, fault, tail, self.server.signal(signal.SIGSTOP),
                         note=f"store stopped {fault.duration}s")
            self._pending_conts.append((time.monotonic() + fault.duration, self.server.pid))
        elif kind == "preempt":
            if not launchers.running():
                self._record(index, fault, tail, None, note="no launcher was running", fired=False)
                return True
            self._record(index, fault, tail, None)
            launchers.terminate_all()
            self._relaunch_at = time.monotonic()  # as soon as every launcher has exited
        elif kind == "lose":
            node = launchers.node_of(fault.slot)
            if node.process is None or node.process.poll() is not None:
                self._record(index, fault, tail, None, note=f"node {node.index} was not running", fired=False)
                return True
            self._record(index, fault, tail, node.process.pid, note=f"node {node.index}")
            launchers.kill(node)
            self._lost.add(node.index)
        elif kind == "partition":
            node = launchers.node_of(fault.slot)
            if node.process is None or node.process.poll() is not None or node.partitioned:
                self._record(index, fault, tail, None, note=f"node {node.index} was not running", fired=False)
                return True
            healed = f", healed {fault.duration}s later" if fault.duration > 0 else ""
            self._record(index, fault, tail, node.process.pid, note=f"node {node.index}{healed}")
            launchers.stop(node)
            if fault.duration > 0:
                self._pending_heals.append((time.monotonic() + fault.duration, node.index))
            else:
                self._lost.add(node.index)
        elif kind in NETWORK_KINDS:
            node = launchers.node_of(fault.slot)
            if node.process is None or node.process.poll() is not None or node.partitioned or node.cut_off:
                self._record(index, fault, tail, None, note=f"node {node.index} was not running", fired=False)
                return True
            assert self.network is not None
            links = CUT_LINKS[kind]
            healed = f"back {fault.duration}s later" if fault.duration > 0 else "for good"
            self._record(index, fault, tail, node.process.pid,
                         note=f"node {node.index}'s {' and '.join(links)} link{'s' * (len(links) > 1)}, {healed}")
            self.network.cut(node.index, links, for_good=fault.duration <= 0)
            if fault.duration > 0:
                self._pending_link_heals.append((time.monotonic() + fault.duration, node.index, links))
            else:
                node.cut_off = True
                self._lost.add(node.index)
        elif kind == "replace":
            node = launchers.node_of(fault.slot)
            cut = node.cut_off or (self.network is not None and bool(self.network.nodes[node.index].cut))
            if node.process is not None and node.process.poll() is None and not node.partitioned and not cut:
                self._record(index, fault, tail, None, note=f"node {node.index} was still running", fired=False)
                return True
            self._record(index, fault, tail, None, note=f"node {node.index}")
            launchers.start(node)
            self._lost.discard(node.index)
        return True

    def _store_away(self) -> bool:
        """The run's store is down (a store-restart's outage) or stopped (a store-hang) by a fault of this run, and
        only this loop brings it back: a read of it now would wait for itself (a kill-leader within a store fault's
        duration would block the runner's loop, and with it the store's return, for good)."""
        return self.server.restarting or any(pid == self.server.pid for _, pid in self._pending_conts)

    def _heal_partitions(self, now: float, launchers: Launchers) -> None:
        """SIGCONT every process of a partitioned node whose partition is over (unless it was replaced meanwhile)."""
        for due, index in list(self._pending_heals):
            if now >= due:
                self._pending_heals.remove((due, index))
                launchers.resume(launchers.nodes[index])

    def _heal_links(self, now: float) -> None:
        """Every cut link of a node whose cut is over passes packets again."""
        for due, index, links in list(self._pending_link_heals):
            if now >= due:
                self._pending_link_heals.remove((due, index, links))
                assert self.network is not None
                self.network.heal(index, links)  # the links this cut cut, unless cut for good since

    def _resume_stopped(self, now: float, launchers: Launchers) -> None:
        """SIGCONT each process whose pause is over: the last of its pauses, when two overlap (a pause-leader of a
        leader paused already: the shorter pause's SIGCONT must not cut the longer one short). A process of a node
        partitioned since stays stopped: the partition holds it, and its heal (Launchers.resume) continues the node's
        whole process group (a pause that ends inside a partition must not wake one process of a node that answers
        nothing)."""
        held = launchers.partitioned_groups()
        for due, pid in sorted(self._pending_conts):
            if now >= due:
                self._pending_conts.remove((due, pid))
                if all(other != pid for _, other in self._pending_conts) and _group_of(pid) not in held:
                    _signal(pid, signal.SIGCONT)


def _group_of(pid: int) -> int | None:
    """The process group of `pid` (a node's launcher's pid for every process of that node); None when it is gone."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _remove_flash_images(job_id: str) -> None:
    """A lost node (its launcher SIGKILLed) leaves its job scratch; this run's job id is never reused."""
    from ftcoord.host import scratch

    shutil.rmtree(scratch.job_dir(job_id), ignore_errors=True)


def _signal(pid: int | None, signum: int) -> bool:
    """Send a signal; True when it reached a live process (a zombie, dead but not yet reaped, is not)."""
    if pid is None or not _alive_not_zombie(pid):
        return False
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def _alive_not_zombie(pid: int) -> bool:
    return state(pid) not in (None, "Z")


def main(argv: list[str] | None = None) -> int:
    """A run in the network namespace its parent made for it (ChaosRunner._run_in_own_namespace): exit 0 once it wrote
    its outcome, whatever the outcome says."""
    parser = argparse.ArgumentParser(prog="python -m chaos.run.runner", description=main.__doc__)
    parser.add_argument("scenario", type=Path, help="the scenario, as chaos.scenario.to_toml wrote it")
    parser.add_argument("out", type=Path, help="the run directory")
    parser.add_argument("--title", required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--where", required=True, help="the scenario's own path or name, for its messages")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if not in_own_namespace():
        print("chaos.run.runner: run only by a chaos run, in the network namespace it made", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM tears down as a ^C does
    scenario = parse(args.scenario.read_text(), args.where)
    try:
        ChaosRunner(scenario, args.out, quiet=args.quiet, timeout_s=args.timeout, title=args.title).run()
    except NetworkError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # torn down on the way out (ChaosRunner.run's own cleanup)
        print("chaos: the run was interrupted; its processes and its network are gone", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
