"""`chaos campaign`: load, check, run (or resume), summarize, and print the side-by-side table."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from chaos.campaign.campaign import METRICS, Campaign
from chaos.campaign.runner import CampaignRunner, plan
from chaos.campaign.summary import fmt, headline, published, write_summary

INTERRUPTED = 130


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the runner's cleanup kills the run's processes; finished runs stay


def default_out(names: list[str], quick: bool) -> Path:
    """Stable, so that the same command resumes the same campaign."""
    stem = "+".join(Path(n).stem for n in names) + ("-quick" if quick else "")
    return Path("runs") / f"campaign-{stem}"


def run_campaigns(args: argparse.Namespace, campaigns: list[Campaign], seeds: tuple[int, ...] | None) -> int:
    if args.dataset:
        from training.data import make_dataset

        make_dataset(args.dataset)  # a missing folder fails here, not inside every rank of every run
    out = args.out or default_out(args.campaigns, args.quick)
    only = tuple(name.strip() for name in args.runs.split(",") if name.strip()) if args.runs else ()
    planned = plan(campaigns, out, seeds, args.dataset, only)
    say = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    for campaign in campaigns:
        if campaign.stand_in and not args.dataset:
            say(f"note ({campaign.name}): {campaign.stand_in}")
    say(f"campaign: {', '.join(c.name for c in campaigns)} · {len(planned)} runs "
        f"({len({p.seed for p in planned})} seeds) · {out}")
    runner = CampaignRunner(planned, quiet=args.quiet)
    interrupted = False
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    started = time.monotonic()
    try:
        if not args.summary_only:
            runner.run()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
    summary = write_summary(out, planned)
    _print_table(summary)
    print(f"summary: {out / 'summary.md'} (+ summary.json and plots); {summary['runs_finished']} of "
          f"{summary['runs_planned']} runs finished, {len(runner.executed)} of them ran now, in "
          f"{(time.monotonic() - started) / 60:.1f} min")
    if interrupted:
        print("interrupted: rerun the same command to continue; finished runs are kept and not repeated",
              file=sys.stderr)
        return INTERRUPTED
    failed = [run["name"] for c in summary["campaigns"] for run in c["runs"]
              if run["metrics"]["pass_rate"]["mean"] not in (None, 1.0)]
    return 1 if failed or summary["runs_finished"] < summary["runs_planned"] else 0


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for c in summary["campaigns"]:
        table = Table(title=f"{c['experiment']} ({c['name']})", title_justify="left")
        for column in ("run", "metric", c["published_by"], "ftcoord (mean ± 95% CI)"):
            table.add_column(column)
        for run in c["runs"]:
            for metric in headline(run):
                table.add_row(run["name"], METRICS[metric], published(run, metric), fmt(run["metrics"][metric], metric))
        console.print(table)
        if c["stand_in"]:
            console.print(f"[yellow]note:[/] {c['stand_in']}")
