"""`chaos bench`: overhead, coordination latency, detection, recovery, checkpoint stall, goodput.

Every figure is paired with its baseline in the same run (alternating repetitions) and
reported as median and min-max. Defaults are the ones a user gets (Timing(), the
launcher's); nothing is tuned for the benchmark.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from chaos.bench.heal import bench_heal, heal_rows
from chaos.bench.recovery import DEFAULT, bench_recovery_by_fault, default_job, summary
from chaos.machine_env import machine_env
from chaos.own_code import start_worker
from chaos.report.metrics import goodput
from chaos.run.runner import ChaosRunner
from chaos.scenario import Fault, Scenario
from ftcoord import StoreServer, connect, job_store
from ftcoord.protocol import keys as ftkeys
from training.ledger import read_ledgers


def machine() -> dict[str, Any]:
    return {"cores": os.cpu_count(), "torch": torch.__version__, "backend": "gloo (CPU)",
            "python": platform.python_version(), "platform": platform.platform()}


# -- overhead ----------------------------------------------------------------------------

def _step_times(store: str, out: Path, mode: str, reduction: str, steps: int, watched: bool = False,
                device: str = "cpu", world: int = 2) -> float:
    """The median step time (s) of a DDP probe of `world` ranks on `device` after its warm-up (`watched`: with an
    operator's `ftcoord status --watch` reading the job all along)."""
    job = f"bench-{mode}-{reduction}-{uuid.uuid4().hex[:6]}"
    files = [out / f"steps-{job}-{r}.json" for r in range(world)]
    status = ["status", "--store", store, "--job", job, "--watch"]
    watcher = start_worker("ftcoord.observe.cli", status, env=machine_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL) if watched else None
    procs = [start_worker("chaos.bench.workers", ["steps", "--mode", mode, "--reduction", reduction, "--rank", str(r),
                                                  "--store", store, "--job", job, "--out", str(files[r]),
                                                  "--steps", str(steps), "--device", device, "--world", str(world)],
                          env=machine_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for r in range(world)]
    for p in procs:
        p.wait(600)
    if watcher is not None:
        watcher.terminate()
        watcher.wait(30)
    return statistics.median(json.loads(files[0].read_text())["times"][steps // 5:])  # skip the warm-up


def _paired(store: str, out: Path, reps: int, steps: int, a: tuple[str, str], b: tuple[str, str],
            **probe: Any) -> dict[str, Any]:
    """Step times of two probe configurations (mode, reduction), alternating which goes first (`probe`: _step_times's
    device and world)."""
    a_ms, b_ms, ratios = [], [], []
    for rep in range(reps):
        first, second = (a, b) if rep % 2 == 0 else (b, a)
        times = {first: _step_times(store, out, *first, steps, **probe),
                 second: _step_times(store, out, *second, steps, **probe)}
        a_ms.append(times[a] * 1000)
        b_ms.append(times[b] * 1000)
        ratios.append(times[b] / times[a])
    # Per-repetition ratios swing with the noise of shared cores; the ratio of the medians
    # over all repetitions is the steadier estimate (both are reported).
    return {"ratio_of_medians": round(statistics.median(b_ms) / statistics.median(a_ms), 4), "ratio": summary(ratios),
            "a_step_ms": summary(a_ms, 3), "b_step_ms": summary(b_ms, 3)}


def bench_overhead(store: str, out: Path, reps: int, steps: int, device: str = "cpu", world: int = 2) -> dict[str, Any]:
    """Bare DDP vs the same loop under @Wrapper (both with DDP's built-in all-reduce), `world` ranks on `device`."""
    paired = _paired(store, out, reps, steps, ("bare", "allreduce"), ("wrapped", "allreduce"), device=device,
                     world=world)
    return {"ratio_of_medians": paired["ratio_of_medians"], "ratio": paired["ratio"],
            "bare_step_ms": paired["a_step_ms"], "wrapped_step_ms": paired["b_step_ms"]}


def bench_reduction(store: str, out: Path, reps: int, steps: int) -> dict[str, Any]:
    """Bare DDP: its built-in all-reduce vs the fixed-order reduction (training's default)."""
    paired = _paired(store, out, reps, steps, ("bare", "allreduce"), ("bare", "fixed"))
    return {"ratio_of_medians": paired["ratio_of_medians"], "ratio": paired["ratio"],
            "allreduce_step_ms": paired["a_step_ms"], "fixed_step_ms": paired["b_step_ms"]}


# -- generation advance -------------------------------------------------------------------

def _advance_thread(store: str, job: str, slot: int, world: int, rounds: int, arrivals: list) -> None:
    from ftcoord import JobFinished, Participant, QuorumPolicy

    participant = Participant(store, job, slot, QuorumPolicy(world)).start()
    try:
        while len(arrivals) <= rounds:
            try:
                record = participant.join(0)
            except JobFinished:
                break
            arrivals.append({"generation": record.generation, "mono": time.monotonic()})
            participant.monitor.wait(60)
    finally:
        participant.close()


def bench_advance(store: str, out: Path, sizes: list[int], rounds: int) -> dict[str, Any]:
    results = {}
    client = connect(store)
    for n in sizes:
        job = f"bench-advance-{n}-{uuid.uuid4().hex[:6]}"
        js = job_store(client, job)
        arrivals: dict[int, list[dict[str, Any]]] = {}
        procs, threads = [], []
        for slot in range(n):
            if n <= 8:  # processes, as in a real job
                path = out / f"advance-{job}-{slot}.json"
                procs.append((path, start_worker(
                    "chaos.bench.workers", ["advance", "--slot", str(slot), "--world", str(n), "--store", store,
                                            "--job", job, "--rounds", str(rounds), "--out", str(path)],
                    env=machine_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
            else:  # threads with their own store clients
                arrivals[slot] = []
                t = threading.Thread(target=_advance_thread, args=(store, job, slot, n, rounds, arrivals[slot]),
                                     daemon=True)
                t.start()
                threads.append(t)
        _wait_for(lambda js=js: js.check([ftkeys.record(1)]), 300, f"{n} processes to form generation 1")
        time.sleep(1.0)  # let every member settle into the generation (not a measurement)
        started: dict[int, float] = {}
        for g in range(1, rounds + 1):
            started[g + 1] = time.monotonic()
            js.compare_set(ftkeys.interrupt(g), "", "bench")
            _wait_for(lambda g=g, js=js: js.check([ftkeys.record(g + 1)]), 60, f"generation {g + 1}")
            time.sleep(0.3)  # every member receives it before the next round (not measured)
        for path, proc in procs:
            proc.wait(120)
            arrivals[len(arrivals)] = json.loads(path.read_text())
        for t in threads:
            t.join(60)
        latencies = []
        for g, t0 in started.items():
            last = [a["mono"] for per in arrivals.values() for a in per if a["generation"] == g]
            if len(last) == n:
                latencies.append((max(last) - t0) * 1000)
        results[str(n)] = summary(latencies, 2) if latencies else None
    return results


def _wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark: timed out waiting for {what}")
        time.sleep(0.005)


# -- goodput ------------------------------------------------------------------------------------

def bench_goodput(out: Path, steps: int, kills: tuple[int, int]) -> dict[str, Any]:
    """The ECRL report's Exp1 shape: 2 ranks, ~100 ms steps, two SIGKILLs, vs fault-free."""
    job = default_job(steps=steps, step_time=0.1, ckpt_every=100, dataset="synthetic:4096")
    scenario = Scenario("goodput", "ECRL Exp1 shape", job, tuple(Fault("kill", 1, s) for s in kills))
    rates = {}
    for label, with_faults in (("reference", False), ("faults", True)):
        run_dir = out / "runs" / f"goodput-{label}-{uuid.uuid4().hex[:6]}"
        result = ChaosRunner(scenario, run_dir, with_faults=with_faults, quiet=True).run()
        if not result.completed:
            raise RuntimeError(f"goodput {label} run failed: {result.error}")
        rates[label] = goodput(read_ledgers(run_dir / "logs"), steps)
    return {"steps": steps, "kills_at": list(kills), "reference_steps_per_s": round(rates["reference"], 3),
            "faults_steps_per_s": round(rates["faults"], 3), "ratio": round(rates["faults"] / rates["reference"], 4)}


# -- checkpoints --------------------------------------------------------------------------------

def bench_checkpoint(out: Path, reps: int) -> dict[str, Any]:
    from training.checkpoint.base import load_latest, make_strategy
    from training.config import TrainConfig
    from training.models import build_model, parameter_count
    from training.sampler import ResumableGlobalBatchSampler
    from training.state import TrainState, build_optimizer, build_scheduler

    config = TrainConfig(model="big-mlp", optimizer="adam", ckpt_strategy="none")
    model = build_model("big-mlp", (32,), 10, 0)
    optimizer = build_optimizer(config, model)
    model(torch.randn(2, 32)).sum().backward()
    optimizer.step()  # Adam state exists: ~3x the parameters
    state = TrainState(model, optimizer, build_scheduler(config, optimizer),
                       ResumableGlobalBatchSampler(1024, 32, 0), step=1, has_state=True)
    results: dict[str, Any] = {"parameters": parameter_count(model)}
    job = f"bench-ckpt-{uuid.uuid4().hex[:6]}"
    for name in ("blocking", "overlapped", "flash"):
        root = out / "ckpt-bench" / name
        strategy = make_strategy(name, root, config_hash="bench", keep=1, job_id=job)
        assert strategy is not None
        stalls, sizes = [], []
        for rep in range(reps + 1):
            state.step = rep + 1
            stats = strategy.save(state, world_size=1)
            strategy.flush()  # measure each save on its own, not queued behind the last
            if rep:  # the first save sets up buffers and processes: not steady state
                stalls.append(stats.stall_s)
                sizes.append(stats.bytes)
        gib = statistics.median(sizes) / 2**30
        results[name] = {"stall_s": round(statistics.median(stalls), 4), "stall_s_range": [round(min(stalls), 4),
                         round(max(stalls), 4)], "state_gib": round(gib, 3),
                         "stall_s_per_gib": round(statistics.median(stalls) / gib, 4)}
        if name == "flash":
            flash_loads = []
            for _ in range(reps):
                t = time.perf_counter()
                loaded = strategy.load()
                assert loaded is not None and loaded.source.startswith("flash:")
                state.restore(loaded.payload)  # timed: a restart needs the state in the model
                flash_loads.append(time.perf_counter() - t)
                del loaded
            results["restore_flash_s"] = summary(flash_loads)
            strategy.close(finished=True)
        else:
            strategy.close()
    disk_loads = []
    for _ in range(reps):
        t = time.perf_counter()
        loaded = load_latest(out / "ckpt-bench" / "blocking", "bench")
        assert loaded is not None
        state.restore(loaded.payload)
        disk_loads.append(time.perf_counter() - t)
        del loaded
    results["restore_disk_s"] = summary(disk_loads)
    return results


# -- the command --------------------------------------------------------------------------------

def run_bench(out: Path, quick: bool = False) -> int:
    out.mkdir(parents=True, exist_ok=True)
    reps = 3 if quick else 5
    started = time.monotonic()
    report: dict[str, Any] = {"machine": machine(), "quick": quick, "defaults": DEFAULT.__dict__, "details": {}}
    server = StoreServer("127.0.0.1", 0)
    try:
        print("measuring: overhead (wrapped vs bare DDP) ...", file=sys.stderr, flush=True)
        overhead = bench_overhead(server.address, out, reps, 150 if quick else 300)
        report["overhead_ratio"] = overhead["ratio_of_medians"]
        report["details"]["overhead"] = overhead
        print("measuring: gradient reduction (DDP's all-reduce vs fixed order) ...", file=sys.stderr, flush=True)
        fixed = bench_reduction(server.address, out, reps, 150 if quick else 300)
        report["reduction_ratio"] = fixed["ratio_of_medians"]
        report["details"]["reduction"] = fixed
        print("measuring: generation advance ...", file=sys.stderr, flush=True)
        advance = bench_advance(server.address, out, [2, 4, 8, 32, 64], 4 if quick else 10)
        report["advance_ms"] = {n: (v["median"] if v else None) for n, v in advance.items()}
        report["details"]["advance_ms"] = advance
    finally:
        server.close()
    print("measuring: recovery of every fault class (and a whole-job restart) ...", file=sys.stderr, flush=True)
    by_fault = bench_recovery_by_fault(out, 2 if quick else 5, 150)
    report["recovery_by_fault"] = {name: {"stall_s": v["stall_s"]["median"],
                                          "full_s": v["full_s"]["median"] if v["full_s"] else None}
                                   for name, v in by_fault.items()}
    report["details"]["recovery_by_fault"] = by_fault
    kill, baseline = by_fault["kill non-leader"], by_fault["whole-job restart (baseline)"]
    report["detect_s"] = {"kill": kill["detect_s"]["median"], "hang": by_fault["hang"]["detect_s"]["median"]}
    report["heartbeat_timeout_s"] = DEFAULT.heartbeat_timeout
    report["recovery_s"] = kill["stall_s"]["median"]
    report["full_recovery_s"] = kill["full_s"]["median"]
    report["recovery_baseline_s"] = baseline["stall_s"]["median"]
    report["recovery_ratio"] = round(report["recovery_s"] / report["recovery_baseline_s"], 4)
    report["full_recovery_ratio"] = round(report["full_recovery_s"] / report["recovery_baseline_s"], 4)
    print("measuring: checkpoint stall (>=100M parameters + Adam) ...", file=sys.stderr, flush=True)
    ckpt = bench_checkpoint(out, 2 if quick else 3)
    report["ckpt"] = {k: {"stall_s": ckpt[k]["stall_s"], "state_gib": ckpt[k]["state_gib"]}
                      for k in ("blocking", "overlapped", "flash")}
    report["ckpt_stall_ratio"] = round(ckpt["flash"]["stall_s"] / ckpt["blocking"]["stall_s"], 4)
    report["restore_ratio"] = round(ckpt["restore_flash_s"]["median"] / ckpt["restore_disk_s"]["median"], 4)
    report["details"]["ckpt"] = ckpt
    print("measuring: goodput under faults (ECRL Exp1 shape) ...", file=sys.stderr, flush=True)
    steps, kills = (200, (40, 120)) if quick else (1000, (200, 600))
    good = bench_goodput(out, steps, kills)
    report["goodput_ratio"] = good["ratio"]
    report["details"]["goodput"] = good
    print("measuring: healing (old pickled path vs call.heal vs a raw broadcast) ...", file=sys.stderr, flush=True)
    server = StoreServer("127.0.0.1", 0)
    try:
        heal = bench_heal(server.address, out, 3 if quick else 5)
    finally:
        server.close()
    report["heal"] = {case: {k: v for k, v in r.items() if k.startswith("new_over")} for case, r in heal.items()}
    report["details"]["heal"] = heal
    report["wall_s"] = round(time.monotonic() - started, 1)
    (out / "bench.json").write_text(json.dumps(report, indent=1))
    (out / "bench.md").write_text(markdown_table(report))
    print_table(report)
    print(f"\nwrote {out / 'bench.json'}")
    return 0


TARGETS = {
    "overhead_ratio": ("<= 1.02", lambda v: v <= 1.02),
    "advance_ms@8": ("<= 20 ms", lambda v: v is not None and v <= 20),
    "advance_ms@64": ("<= 100 ms", lambda v: v is not None and v <= 100),
    "detect_s.kill": ("well under the heartbeat timeout",
                      lambda v: v is not None and v < DEFAULT.heartbeat_timeout / 5),
    "detect_s.hang": ("<= timeout + one interval", lambda v: v is not None and v <= DEFAULT.heartbeat_timeout
                      + DEFAULT.heartbeat_interval),
    "recovery_ratio": ("<= 0.2", lambda v: v <= 0.2),
    "full_recovery_ratio": ("<= 0.2", lambda v: v <= 0.2),
    "flash stall s/GiB": ("<= 0.2", lambda v: v <= 0.2),
    "ckpt_stall_ratio": ("<= 0.2", lambda v: v <= 0.2),
    "restore_ratio": ("<= 0.33", lambda v: v <= 0.33),
    "goodput_ratio": (">= 0.97", lambda v: v >= 0.97),
}


def rows(report: dict[str, Any]) -> list[tuple[str, Any, str, bool]]:
    flash = report["details"]["ckpt"]["flash"]
    values = {
        "overhead_ratio": report["overhead_ratio"],
        "advance_ms@8": report["advance_ms"].get("8"),
        "advance_ms@64": report["advance_ms"].get("64"),
        "detect_s.kill": report["detect_s"]["kill"],
        "detect_s.hang": report["detect_s"]["hang"],
        "recovery_ratio": report["recovery_ratio"],
        "full_recovery_ratio": report["full_recovery_ratio"],
        "flash stall s/GiB": flash["stall_s_per_gib"],
        "ckpt_stall_ratio": report["ckpt_stall_ratio"],
        "restore_ratio": report["restore_ratio"],
        "goodput_ratio": report["goodput_ratio"],
    }
    found = [(k, v, TARGETS[k][0], bool(TARGETS[k][1](v))) for k, v in values.items()]
    healing = heal_rows(report["details"]["heal"])
    return found + [(f"heal, {name}", value, target, met) for name, value, target, met in healing]


NO_TARGET = ("whole-job restart (baseline)", "two at once, no warm standby")
"""Comparisons, not goals: what recovery costs without ftcoord's mechanisms."""


def recovery_rows(report: dict[str, Any]) -> list[tuple[str, Any, str, bool | None, Any, str, bool | None]]:
    """Per fault class, worst stall first: (class, stall, target, met, full, target, met); met None: no target."""
    rows_ = []
    hang_limit = DEFAULT.heartbeat_timeout + 0.5
    for name, value in report["recovery_by_fault"].items():
        stall, full = value["stall_s"], value["full_s"]
        if name in NO_TARGET:
            rows_.append((name, stall, "comparison", None, full, "comparison", None))
            continue
        silent = name in ("hang", "node partitioned")  # no evidence but silence: detected at heartbeat_timeout
        limit = hang_limit if silent else 0.5
        full_target = not silent and name != "node lost"  # lost for good: nothing to come back
        rows_.append((name, stall, f"<= {limit} s", stall is not None and stall <= limit, full,
                      "<= 1 s" if full_target else "-", (full is not None and full <= 1.0) if full_target else None))
    return sorted(rows_, key=lambda r: -(r[1] or 0))


def _met(met: bool | None) -> str:
    return "-" if met is None else ("yes" if met else "no")


def markdown_table(report: dict[str, Any]) -> str:
    """The table for the README's performance section."""
    m, d = report["machine"], report["details"]
    lines = [f"`chaos bench{' --quick' if report['quick'] else ''}` on {m['cores']} cores, torch {m['torch']}, "
             f"{m['backend']}, {report['wall_s']} s in all. Medians; min-max in bench.json.", "",
             "| measure | value | target | met |", "|---|---|---|---|"]
    lines += [f"| {name} | {value} | {target} | {'yes' if met else 'no'} |"
              for name, value, target, met in rows(report)]
    runs = len(next(iter(d["recovery_by_fault"].values()))["stall_s"]["samples"])
    lines += ["", f"Recovery by fault class, worst first (default Timing: heartbeat {DEFAULT.heartbeat_interval} s / "
              f"timeout {DEFAULT.heartbeat_timeout} s; stall: fault -> the survivors' next committed step; full: -> "
              f"back at full world size; medians over {runs} runs, min-max in bench.json):", "",
              "| fault | stall s | target | met | full size s | target | met |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {n} | {s} | {st} | {_met(sm)} | {f} | {ft} | {_met(fm)} |"
              for n, s, st, sm, f, ft, fm in recovery_rows(report)]
    ck, restore = report["ckpt"], (d["ckpt"]["restore_flash_s"]["median"], d["ckpt"]["restore_disk_s"]["median"])
    lines += ["", f"- step time, 2 ranks gloo: bare DDP {d['overhead']['bare_step_ms']['median']} ms, under @Wrapper "
              f"{d['overhead']['wrapped_step_ms']['median']} ms (per-repetition ratios "
              f"{d['overhead']['ratio']['samples']})",
              f"- gradient reduction, bare DDP, 2 ranks: built-in all-reduce "
              f"{d['reduction']['allreduce_step_ms']['median']} ms, fixed order (the default) "
              f"{d['reduction']['fixed_step_ms']['median']} ms per step (ratio {report['reduction_ratio']})",
              f"- generation advance (ms): {report['advance_ms']}",
              f"- detection: SIGKILL {report['detect_s']['kill']} s, SIGSTOP {report['detect_s']['hang']} s "
              f"(heartbeat_timeout {report['heartbeat_timeout_s']} s)",
              f"- recovery after SIGKILL of 1 of 2 ranks: next committed step {report['recovery_s']} s, full size "
              f"{report['full_recovery_s']} s; whole-job restart from disk {report['recovery_baseline_s']} s",
              f"- checkpoint of {d['ckpt']['parameters'] / 1e6:.1f}M parameters + Adam "
              f"({ck['blocking']['state_gib']} GiB): stall blocking {ck['blocking']['stall_s']} s, "
              f"overlapped {ck['overlapped']['stall_s']} s, flash {ck['flash']['stall_s']} s; "
              f"restore flash {restore[0]} s vs disk {restore[1]} s",
              f"- goodput, {d['goodput']['steps']} steps, SIGKILL at {d['goodput']['kills_at']}: "
              f"{d['goodput']['faults_steps_per_s']} vs {d['goodput']['reference_steps_per_s']} steps/s fault-free", ""]
    return "\n".join(lines)


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    m = report["machine"]
    table = Table(title=f"chaos bench ({'quick' if report['quick'] else 'full'}) — {m['cores']} cores, torch "
                        f"{m['torch']}, {m['backend']}", title_justify="left")
    for column in ("measure", "value", "target", "met"):
        table.add_column(column)
    for name, value, target, met in rows(report):
        table.add_row(name, str(value), target, "yes" if met else "[red]no[/]")
    Console().print(table)
    table = Table(title="recovery by fault class (worst first)", title_justify="left")
    for column in ("fault", "stall s", "target", "met", "full size s", "target", "met"):
        table.add_column(column)
    for n, s, st, sm, f, ft, fm in recovery_rows(report):
        table.add_row(n, str(s), st, _met(sm).replace("no", "[red]no[/]"), str(f), ft,
                      _met(fm).replace("no", "[red]no[/]"))
    Console().print(table)
    a, d = report["advance_ms"], report["details"]
    Console().print(f"advance ms by size: {a}; recovery {report['recovery_s']} s (full size "
                    f"{report['full_recovery_s']} s) vs whole-job restart {report['recovery_baseline_s']} s; "
                    f"step {d['overhead']['bare_step_ms']['median']} ms bare vs "
                    f"{d['overhead']['wrapped_step_ms']['median']} ms wrapped; "
                    f"checkpoint stall {report['ckpt']}")
