"""What `chaos bench --scale` measured, judged against its targets and written for people: scale.md and scale.png.

Every size's result is the dict chaos.scale.bench.run_size returns (with `floor_s` from chaos.scale.floor); a size
that was not measured has only `participants` and `not_measured` (why), and counts as a missed target.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ftcoord.config import Timing


def targets_missed(results: list[dict[str, Any]]) -> list[str]:
    """The scale targets, each a sentence when missed (a measure that could not be made is a miss too)."""
    missed = []
    for r in results:
        n = r["participants"]
        if "not_measured" in r:
            missed.append(f"N={n}: not measured: {r['not_measured']}{_floor_said(r)}")
            continue
        timing = timing_of(r)
        limit = 0.25 if n <= 1024 else 1.0
        if r["advance_s"]["median"] > limit:
            missed.append(f"N={n}: advance {r['advance_s']['median']} s > {limit} s{_floor_said(r)}")
        if r["ops_per_participant_s"]["total"] > r["ops_budget"]:
            missed.append(f"N={n}: {r['ops_per_participant_s']['total']} store requests per participant per s > "
                          f"{r['ops_budget']}")
        detect_limit = timing.heartbeat_timeout + timing.heartbeat_interval
        if r.get("detect_silent_s") is None or r["detect_silent_s"] > detect_limit:
            missed.append(f"N={n}: a silent SIGKILL detected after {r.get('detect_silent_s')} s > "
                          f"{timing.heartbeat_timeout + timing.heartbeat_interval} s")
        if r["false_positives"]:
            missed.append(f"N={n}: {r['false_positives']} false positive(s): {r['problems'][:3]}")
        memory = r.get("memory")
        if memory is not None and memory["keys_growth"] > 0:
            missed.append(f"N={n}: the store grew by {memory['keys_growth']} keys from generation "
                          f"{memory['from_advances']} to {memory['samples'][-1]['advances']}")
    return missed


def timing_of(result: dict[str, Any]) -> Timing:
    """The timing a size ran on (the library's default, for a result written before the bench recorded it)."""
    return Timing(**result["timing"]) if "timing" in result else Timing()


def _timing_line(results: list[dict[str, Any]]) -> str:
    """Which heartbeat timing the participants ran on, and whether it is the library's default."""
    default = Timing()
    ran = sorted({(t.heartbeat_interval, t.heartbeat_timeout) for t in map(timing_of, results)})
    said = [f"a heartbeat every {i} s, timeout {t} s" + (" (the library's default)" if
            (i, t) == (default.heartbeat_interval, default.heartbeat_timeout) else
            f" (not the default: {default.heartbeat_interval} s and {default.heartbeat_timeout} s)") for i, t in ran]
    return "Timing: " + "; ".join(said or ["the library's default"]) + "\n\n"


def markdown(results: list[dict[str, Any]], misses: list[str]) -> str:
    head = ("| participants | advance, slowest (median, min-max) | advance, median participant | re-form after a "
            "marked kill | silent kill: detected / re-formed | store requests per participant per s | "
            "leader CPU per advance | store RSS | store keys |\n|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in results:
        if "not_measured" in r:
            lines.append(f"| {r['participants']} | not measured: {r['not_measured']} |" + " |" * 7)
            continue
        a, m = r["advance_s"], r["advance_median_participant_s"]
        lines.append(
            f"| {r['participants']} | {a['median'] * 1000:.0f} ms ({a['min'] * 1000:.0f}-{a['max'] * 1000:.0f}) "
            f"| {m['median'] * 1000:.0f} ms | {r['reform_marked_s'] * 1000:.0f} ms | {r['detect_silent_s']} s / "
            f"{r['reform_silent_s']} s | {r['ops_per_participant_s']['total']} (budget {r['ops_budget']}) | "
            f"{r.get('leader_cpu_per_advance_s', 'n/a')} s | {r['store_rss_mb']} MB | {r['store_keys']} |")
    floor_alone = [_floor_alone(r) for r in results if "not_measured" in r and r.get("floor_s")]
    results = [r for r in results if "not_measured" not in r]
    memory = [f"- N={r['participants']}: {s['advances']} advances: store RSS {s['store_rss_mb']} MB, "
              f"{s['store_keys']} keys" for r in results if r.get("memory") for s in r["memory"]["samples"]]
    roles = [f"- N={r['participants']}: " + ", ".join(f"{k} {v}" for k, v in r["ops_per_participant_s"].items())
             for r in results]
    phases = [f"- N={r['participants']}: every participant announced {_ms(r, 'all_announced')}, the leader decided "
              f"{_ms(r, 'decided_after')} later, every participant held the record {_ms(r, 'delivered_after')} "
              f"after that; at steady state the simulated participants used {r.get('participants_cpu_share')} "
              f"and the store {r['store_cpu_share']} of a core; during an advance the store was busy "
              f"{r['cores_busy_during_advance']['store']} of its one core and the participants "
              f"{r['cores_busy_during_advance']['participants']} of the machine's "
              f"{r['cores_busy_during_advance']['of']}; an advance cost each participant "
              f"{sum(r['requests_per_advance'].values()):.1f} store requests ("
              + ", ".join(f"{k} {v}" for k, v in r["requests_per_advance"].items()) + ")" + _floor_line(r)
              for r in results]
    verdict = "every target met" if not misses else "missed: " + "; ".join(misses)
    run_as = sorted({r.get("run_as", "threads") for r in results}) or ["threads"]
    said = {"threads": "threads (each participant's threads real threads, many participants to a process)",
            "events": "events (the bulk's participants on one event loop per process: chaos.scale.worker_events)"}
    return ("# ftcoord at scale (simulated participants; `chaos bench --scale`)\n\n"
            + "Participants run as: " + "; ".join(said.get(name, name) for name in run_as) + "\n\n"
            + _timing_line(results)
            + head + "\n".join(lines)
            + "\n\nWhere an advance's time goes (medians):\n" + "\n".join(phases + floor_alone)
            + "\n\nSlow changes (stragglers, and changes nobody asked for):\n"
            + ("\n".join(line for r in results for line in _slow_lines(r)) or "- none")
            + "\n\nStore requests per participant per second, by thread:\n" + "\n".join(roles)
            + "\n\nThe store over many generations:\n" + ("\n".join(memory) or "- not measured")
            + f"\n\n{verdict}\n")


def _slow_lines(result: dict[str, Any]) -> list[str]:
    """A change still incomplete STRAGGLING_S after it began (who was late, where their threads waited), one over 1 s
    (how late each worker's participants were), and generation changes nobody asked for (with their reasons)."""
    n, lines = result["participants"], []
    for s in result.get("stragglers", []):
        if s["phase"] == "slow":
            late = sorted(s["latest_by_worker"].items(), key=lambda kv: -kv[1])[:3]
            lines.append(f"- N={n}: the change to generation {s['generation']} took {s['took_s']} s; latest by "
                         "worker: " + ", ".join(f"slots from {first}: {t} s" for first, t in late))
            continue
        waits = sorted({frames[-1].rsplit("/", 1)[-1] for name, frames in s["threads"].items()
                        if not name.startswith("state-")})
        lines.append(f"- N={n}: after generation {s['generation']}, {s['count']} participant(s) had not "
                     f"{'announced themselves' if s['phase'] == 'announce' else 'got the record'} "
                     f"{s['after_s']} s after it ended (workers from slots {s['workers'][:8]}); their threads were "
                     f"in: {', '.join(waits[:6])}")
    lines += [f"- N={n}: unasked change after generation {u['generation']}: {u['reasons']}"
              for u in result.get("unasked_changes", [])]
    return lines


def _floor_line(result: dict[str, Any]) -> str:
    """The floor, as a sentence of the phases' list (chaos.scale.floor says what each variant does)."""
    floor = result.get("floor_s") or {}

    def said(variant: str) -> str:
        f = floor.get(variant) or {"not_measured": "not run"}
        if "median" not in f:
            return f"not measured ({f['not_measured']})"
        return f"{f['median'] * 1000:.0f} ms ({f['min'] * 1000:.0f}-{f['max'] * 1000:.0f})"

    return (f". The same number of bare store clients, laid out alike with no ftcoord logic (chaos.scale.floor): "
            f"{said('least')} to hear an interrupt, be counted and hear a decision; {said('critical_path')} with "
            f"ftcoord's critical-path requests; {said('ftcoord_requests')} with every request ftcoord makes of a "
            f"participant per advance; {said('every_request')} with the process group's rendezvous key too (gloo's), "
            f"from "
            + ("one greenlet each" if result.get("run_as") == "events" else "one thread each"))


def _floor_alone(result: dict[str, Any]) -> str:
    """A size too big to simulate here: its floor alone (chaos.scale.bench._floor_beyond), or why not even that."""
    n = result["participants"]
    if "record_bytes_estimated" not in result:
        why = sorted({f["not_measured"] for f in result["floor_s"].values() if "not_measured" in f})
        return f"- N={n}: not simulated (above), nor its floor: {'; '.join(why)}"
    return (f"- N={n}: not simulated (above), its floor alone, with a record estimated at "
            f"{result['record_bytes_estimated']} bytes{_floor_line(result)}")


def _floor_said(result: dict[str, Any]) -> str:
    """What bare clients took on the bench's host (chaos.scale.floor), to set beside an advance: a clause."""
    floor = result.get("floor_s") or {}
    said = [f"{name.replace('_', ' ')} {f['median']} s" for name, f in floor.items() if "median" in f]
    return f" (bare clients on this machine, floor: {', '.join(said)})" if said else ""


def _ms(result: dict[str, Any], phase: str) -> str:
    return f"{result['advance_phases_s'][phase]['median'] * 1000:.0f} ms"


_FLOOR_LINES = {"critical_path": ("x-.", "critical-path requests"),
                "ftcoord_requests": ("+:", "every request ftcoord makes")}
"""The floors plotted (chaos.scale.floor's variants): each one's line style and label."""


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    floors = {variant: [(r["participants"], r.get("floor_s", {}).get(variant, {})) for r in results]
              for variant in _FLOOR_LINES}  # a size too big to simulate has its floor too
    results = [r for r in results if "not_measured" not in r]
    sizes = [r["participants"] for r in results]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(sizes, [r["advance_s"]["median"] * 1000 for r in results], "o-", label="advance, slowest participant")
    ax.plot(sizes, [r["advance_median_participant_s"]["median"] * 1000 for r in results], "s--",
            label="advance, median participant")
    ax.plot(sizes, [r["reform_marked_s"] * 1000 for r in results], "^:", label="re-form after a marked kill")
    for variant, (style, said) in _FLOOR_LINES.items():
        points = [(n, f["median"] * 1000) for n, f in floors[variant] if "median" in f]
        if points:
            ax.plot([n for n, _ in points], [ms for _, ms in points], style, color="gray",
                    label=f"floor: bare clients, {said}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("participants")
    ax.set_ylabel("ms")
    ax.set_title(f"ftcoord generation change vs participants (simulated, {os.cpu_count()} cores)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
