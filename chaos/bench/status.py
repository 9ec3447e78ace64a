"""`chaos bench --only status`: does an operator watching a job slow it down?

The overhead phase's probe (2 ranks, gloo, under @Wrapper, default settings) with and without an
`ftcoord status --watch` reading the job all along (its default refresh, 0.5 s), alternating which goes
first in each repetition; medians with min-max, and the ratio of the medians.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from chaos.bench.recovery import summary
from chaos.bench.suite import _step_times
from ftcoord.store.server import StoreServer


def bench_status(store: str, out: Path, reps: int, steps: int) -> dict[str, Any]:
    alone, watched, ratios = [], [], []
    for rep in range(reps):
        order = (False, True) if rep % 2 == 0 else (True, False)
        times = {w: _step_times(store, out, "wrapped", "allreduce", steps, watched=w) for w in order}
        alone.append(times[False] * 1000)
        watched.append(times[True] * 1000)
        ratios.append(times[True] / times[False])
    return {"ratio_of_medians": round(statistics.median(watched) / statistics.median(alone), 4),
            "ratio": summary(ratios), "alone_step_ms": summary(alone, 3), "watched_step_ms": summary(watched, 3)}


def run_status_bench(out: Path, reps: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    server = StoreServer("127.0.0.1", 0)
    try:
        result = bench_status(server.address, out, reps, 300)
    finally:
        server.close()
    (out / "status-bench.json").write_text(json.dumps(result, indent=1))
    a, w = result["alone_step_ms"], result["watched_step_ms"]
    print(f"step time, 2 ranks under @Wrapper: {a['median']} ms ({a['min']}-{a['max']}) alone, {w['median']} ms "
          f"({w['min']}-{w['max']}) with `ftcoord status --watch` running; ratio of medians "
          f"{result['ratio_of_medians']} ({reps} repetitions)")
    return 0
