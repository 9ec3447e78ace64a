"""`chaos bench --only store_restart`: what a store restart costs training, against its targets.

Real runs (2 ranks under ftcoord-launch, a user's default timing: 0.5 s heartbeats, 5 s timeout; a separate
`ftcoord-store` SIGKILLed and started again empty on the same port 2 s later), each verified like any chaos run:
- **store restart alone**: steps committed while the store was away (target > 0), and the training stall it caused:
  the longest gap between two commits from the kill until 2 s after the store's return, beyond the run's median
  step (target <= 0.1 s);
- **a rank killed while the store is away** (SIGKILL of slot 1 20 steps after the store's kill): the survivor's stall
  from the store's return (the first process to reconnect) to the first step of a newer generation (target <= 0.5 s).
Medians with min-max over the repetitions.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from chaos.bench.recovery import summary
from chaos.report.metrics import read_logs
from training.ledger import read_ledgers

JOB = """[job]
nproc = 2
steps = 240
global_batch = 24
dataset = "synthetic:768"
step_time = 0.03
heartbeat_interval = 0.5
heartbeat_timeout = 5.0
ckpt_strategy = "blocking"
ckpt_every = 40
[[faults]]
kind = "store-restart"
step = 60
duration = 2.0
"""
KILL = """[[faults]]
kind = "kill"
slot = 1
step = 80
"""


def _scenario(out: Path, name: str, with_kill: bool) -> Path:
    path = out / f"{name}.toml"
    path.write_text(f'name = "{name}"\ndescription = "store restart benchmark"\n' + JOB + (KILL if with_kill else ""))
    return path


def _store_back(logs: Path, after: float) -> float:
    """When the store answered again: the first process to reconnect after `after`."""
    return min(e["mono"] for e in read_logs(logs, ("store_back",)) if e["mono"] > after)


def _measure(run: Path, report: dict[str, Any], with_kill: bool) -> dict[str, Any]:
    if report["verdict"] != "pass":
        raise RuntimeError(f"the benchmark run {run} failed its verdict: {report.get('problems')}")
    faults = [json.loads(line) for line in (run / "faults.jsonl").read_text().splitlines()]
    killed_at = next(f["mono"] for f in faults if f["kind"] == "store-restart")
    back = _store_back(run / "logs", killed_at)
    steps = sorted((r for r in read_ledgers(run) if r["kind"] == "step" and r["rank"] == 0), key=lambda r: r["mono"])
    gaps = [b["mono"] - a["mono"] for a, b in zip(steps, steps[1:], strict=False)]
    step_s = statistics.median(gaps)
    result: dict[str, Any] = {"away_s": round(back - killed_at, 3),
                              "steps_while_away": len({r["step"] for r in steps if killed_at < r["mono"] < back})}
    if with_kill:
        before = max(r["generation"] for r in steps if r["mono"] <= killed_at)
        first = min(r["mono"] for r in steps if r["generation"] > before and r["mono"] > back)
        result["survivor_stall_from_return_s"] = round(first - back, 4)
    else:
        window = [b["mono"] - a["mono"] for a, b in zip(steps, steps[1:], strict=False)
                  if killed_at <= b["mono"] <= back + 2.0]
        result["stall_s"] = round(max(0.0, max(window) - step_s), 4)
        result["step_s"] = round(step_s, 4)
    return result


def run_store_bench(out: Path, reps: int) -> int:
    from chaos.report.report import run_and_report
    from chaos.scenario import load

    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {"restart": [], "kill_while_away": []}
    for rep in range(reps):
        for case, with_kill in (("restart", False), ("kill_while_away", True)):
            name = f"store-{case.replace('_', '-')}"
            run = out / f"{name}-{rep}"
            report = run_and_report(load(str(_scenario(out, name, with_kill))), run, quiet=True)
            runs[case].append(_measure(run, report, with_kill))
    result = {
        "steps_while_away": summary([r["steps_while_away"] for r in runs["restart"] + runs["kill_while_away"]], 0),
        "away_s": summary([r["away_s"] for r in runs["restart"] + runs["kill_while_away"]], 3),
        "stall_s": summary([r["stall_s"] for r in runs["restart"]], 4),
        "survivor_stall_from_return_s": summary([r["survivor_stall_from_return_s"]
                                                 for r in runs["kill_while_away"]], 4),
        "runs": runs,
    }
    (out / "store-bench.json").write_text(json.dumps(result, indent=1))
    for key, target in (("steps_while_away", "> 0"), ("stall_s", "<= 0.1 s"),
                        ("survivor_stall_from_return_s", "<= 0.5 s")):
        s = result[key]
        print(f"{key}: {s['median']} ({s['min']}-{s['max']}) target {target}")
    print(f"store away (kill to first reconnection): {result['away_s']['median']} s; {reps} repetitions each; "
          f"{out / 'store-bench.json'}")
    return 0
