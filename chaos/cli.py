"""`chaos`: run fault scenarios against a real job and prove it trained every sample once.

    chaos list                         the bundled scenarios
    chaos run kill-boundary --out DIR  run one (and its fault-free reference, cached)
    chaos verify DIR / chaos report DIR
    chaos demo                         a short mix of faults on 3 ranks (the README's main job)
    chaos campaign ecrl-exp1 --quick   the ECRL report's experiments × seeds, summarized with 95% CIs
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # before torch loads: no c10d socket chatter

import argparse
import dataclasses
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

from chaos.campaign.campaign import bundled_names as campaign_names
from chaos.campaign.campaign import load as load_campaign
from chaos.campaign.campaign import parse_seeds
from chaos.errors import NetworkError, ReferenceUnusable
from chaos.scenario import DEVICES, ScenarioError, bundled_names, load, parse, scenario_of, to_toml
from ftcoord import arguments
from ftcoord.errors import ConfigError


def _print_report(report: dict[str, Any], run_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from chaos.report.report import model_line

    console = Console(stderr=False)
    c, g = report["correctness"], report["goodput"]
    verdict = "[bold green]PASS[/]" if report["verdict"] == "pass" else "[bold red]FAIL[/]"
    table = Table(title=f"{report['scenario']}: {verdict}", show_header=False, title_justify="left")
    table.add_column("check")
    table.add_column("value")
    table.add_row("steps committed", f"{c['committed_steps']} / {report['steps']}")
    table.add_row("duplicates / missing / extra", f"{c['duplicates']} / {c['missing']} / {c['extra']}"
                  f"  ({c['epochs_checked']} full epochs checked)")
    table.add_row("model check", model_line(report["model_check"]))
    table.add_row("world sizes", str(report["world_sizes"]))
    table.add_row("goodput", f"{g['steps_per_s']} steps/s vs {g['reference_steps_per_s']} (ratio {g['ratio']})")
    table.add_row("restarts (process or job / in-process)", f"{report['restarts']} / {report['in_process_restarts']}")
    table.add_row("generations / replayed steps", f"{report['generations']} / {report['replayed_steps']}")
    table.add_row("checkpoints", f"{report['checkpoint']['saves']} {report['checkpoint']['strategy']} saves, "
                  f"{report['checkpoint']['stall_s_total']} s stall")
    console.print(table)
    faults = Table(title="faults", title_justify="left")
    for column in ("kind", "slot", "step", "fired at", "detect s", "recover s", "full size s"):
        faults.add_column(column)
    for f in report["faults"]:
        faults.add_row(f["kind"], str(f["slot"]), str(f["step"]), str(f.get("fired_step")), str(f["detect_s"]),
                       str(f["recover_s"]), str(f["full_recover_s"]))
    console.print(faults)
    if report.get("incidents"):
        incidents = Table(title="incidents (what each generation change cost, as `ftcoord status` shows it)",
                          title_justify="left")
        for column in ("generation", "cause", "detect s", "stall s", "lost steps", "cost s"):
            incidents.add_column(column)
        for i in report["incidents"]:
            incidents.add_row(str(i["generation"]), str(i["cause"]), str(i["detect_s"]), str(i["stall_s"]),
                              str(i["lost_steps"]), str(i["cost_s"]))
        console.print(incidents)
    for problem in report["problems"]:
        console.print(f"[red]problem:[/] {problem}")
    console.print(f"report: {run_dir / 'report.md'} (+ report.json, loss.png, timeline.png, goodput.png)")


def run_scenario(name: str, out: Path, quiet: bool = False, device: str | None = None) -> dict[str, Any]:
    """Run a scenario and its reference; write and return the report.

    Args:
        device: train on this device instead of the scenario's job.device ("cpu" or "cuda").
    """
    scenario = load(name)  # a bad scenario is refused before torch is imported
    if device is not None:  # checked again whole: a device rules some faults out
        changed = dataclasses.replace(scenario, job=dataclasses.replace(scenario.job, device=device))
        scenario = dataclasses.replace(parse(to_toml(changed), f"{name} with --device {device}"), path=scenario.path)
    if scenario.job.device == "cuda":  # refused here, with its reason, before any process starts
        from chaos.run.launchers import gpus_by_node, visible_gpus

        gpus_by_node(scenario.job, visible_gpus())
    from chaos.report.report import run_and_report

    return run_and_report(scenario, out, quiet=quiet)


def _verify_or_report(run_dir: Path, write: bool) -> dict[str, Any]:
    import json

    scenario = scenario_of(run_dir)  # before torch is imported: a wrong directory is answered at once
    from chaos.report.reference import ensure_reference
    from chaos.report.report import build_report, write_report

    ref_dir, ref = ensure_reference(scenario)
    previous = json.loads((run_dir / "report.json").read_text()) if (run_dir / "report.json").exists() else {}
    report = build_report(run_dir, scenario, ref_dir, ref)
    if "wall_s" in previous:
        report["wall_s"] = previous["wall_s"]
    if write:
        write_report(run_dir, report, ref_dir)
    return report


def _sizes(text: str) -> list[int]:
    from chaos.scale.bench import parse_sizes

    try:
        return parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The `chaos` command line, every subcommand with its options."""
    parser = arguments.Parser(prog="chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the bundled scenarios")
    run = sub.add_parser("run", help="run a scenario (bundled name or TOML file) and report a verdict")
    run.add_argument("scenario", help=f"a bundled scenario ({', '.join(bundled_names())}) or a TOML file")
    run.add_argument("--out", type=Path, default=None, help="run directory (default: runs/<scenario>-<time>)")
    run.add_argument("--quiet", action="store_true", help="no live progress line")
    run.add_argument("--device", choices=DEVICES, default=None,
                     help="train on this device instead of the scenario's (cuda: one GPU per process)")
    for name, text in (("verify", "re-check a finished run directory"), ("report", "rewrite a run's report and plots")):
        p = sub.add_parser(name, help=text)
        p.add_argument("run_dir", type=Path)
    samples = sub.add_parser("check-samples", help="exactly once for your own loop: read the sample log it wrote "
                             "(chaos.proof.samples.SampleLog) and check every sample of every epoch was trained once")
    samples.add_argument("log_dir", type=Path, help="the directory the loop's SampleLog wrote into")
    samples.add_argument("--size", type=arguments.positive_int, required=True, help="samples in the dataset")
    samples.add_argument("--epochs", type=arguments.positive_int, required=True, help="epochs the run trained")
    demo = sub.add_parser("demo", help="a short mix of faults on 3 ranks, about 1-3 minutes")
    demo.add_argument("--out", type=Path, default=None)
    demo.add_argument("--device", choices=DEVICES, default=None,
                      help="train on this device (default: cpu; cuda: one GPU per process, 3 for the demo)")
    camp = sub.add_parser(
        "campaign", help="run an experiment's runs × seeds and summarize them beside published figures",
        description="Run campaigns (bundled: " + ", ".join(campaign_names()) + ", or a TOML file): every "
        "run × seed in its own directory under --out, then DIR/summary.md and summary.json with mean, std "
        "and 95% CI per metric and the ECRL report's figures beside ours. Rerun the same command to resume "
        "an interrupted campaign: finished runs are kept, not repeated.")
    camp.add_argument("campaigns", nargs="+", metavar="NAME|FILE")
    camp.add_argument("--seeds", default=None, help="comma-separated seeds, e.g. 1337,2027 (default: the campaign's)")
    camp.add_argument("--out", type=Path, default=None,
                      help="campaign directory (default: runs/campaign-NAMES; the same directory resumes)")
    camp.add_argument("--runs", default=None,
                      help="only these runs, e.g. blocking,overlapped (the reference always runs)")
    camp.add_argument("--quick", action="store_true", help="the bundled campaigns' short variants (minutes)")
    camp.add_argument("--dataset", default=None,
                      help="the dataset of every run, e.g. cifar100:~/data (a folder with cifar-100-python/)")
    camp.add_argument("--summary-only", action="store_true", help="rewrite the summary of finished runs, run nothing")
    camp.add_argument("--quiet", action="store_true", help="no progress lines")
    bench = sub.add_parser("bench", help="measure overhead, recovery, coordination latency, checkpoint stall, healing")
    bench.add_argument("--quick", action="store_true", help="fewer repetitions, smaller sizes (< ~5 minutes)")
    bench.add_argument("--only", choices=["heal", "status", "store_restart", "forget", "device"], default=None,
                       help="one measurement only: heal (~100M parameters + Adam healed to 1 and 2 fresh members, "
                            "old pickled path vs call.heal vs a raw broadcast; ~12 GiB of memory, minutes); status "
                            "(step time with and without `ftcoord status --watch` reading the job); store_restart "
                            "(steps trained while a SIGKILLed store is away, the stall a restart causes, the "
                            "survivors' stall for a rank killed meanwhile, from the store's return; minutes); forget "
                            "(the leader's round while an old generation of 1,024 and 4,096 members is forgotten, "
                            "deleting it itself vs handing it to its forgetter; ~1 minute); device (a GPU's: a flash "
                            "checkpoint's copy per GiB beside the host-device copy bandwidth; needs CUDA, < 1 minute)")
    bench.add_argument("--scale", action="store_true",
                       help="the coordination protocol among many simulated participants (real store, real "
                            "Participant threads, no training): advance latency, re-form after a kill, silent-kill "
                            "detection, store requests per participant, the store's memory over many generations; "
                            "writes scale.json, scale.md and scale.png (tens of minutes at 4096)")
    bench.add_argument("--sizes", default=None, type=_sizes,
                       help="with --scale: participant counts, comma-separated (default 64,256,1024,4096; "
                            "--quick: 64,256)")
    bench.add_argument("--generations", type=int, default=None,
                       help="with --scale: back-to-back generation changes at the smallest size, to measure the "
                            "store's memory (default 1000; --quick: 100; 0: skip)")
    bench.add_argument("--participants", choices=("threads", "events"), default=None,
                       help="with --scale: how the simulated participants run: events (ftcoord's code unchanged, its "
                            "threads greenlets of one event loop per process, its store clients pure Python that send "
                            "what torch's send; on a machine of few cores it measures the store and the leader, not "
                            "the kernel switching thousands of threads; the default where gevent is installed, as "
                            "`make setup` does) or threads (each participant's threads real threads, many "
                            "participants to a process; the default without gevent)")
    bench.add_argument("--heartbeat-interval", type=float, default=None, metavar="S",
                       help="with --scale: every simulated participant beats every S seconds, its heartbeat timeout "
                            "ten of them (default: the library's, 0.5 s and 5 s). A job of thousands of ranks may "
                            "beat less often; on a machine of few cores the participants' steady state at the "
                            "default keeps more cores busy than the simulation may take at 4096 (the report says "
                            "which timing ran)")
    bench.add_argument("--out", type=Path, default=Path("runs/bench"))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one `chaos` command; its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)

    from ftcoord import log

    log.configure(None, level="error")  # the live display and the report speak for the run
    try:
        if args.command == "list":
            for name in bundled_names():
                print(f"{name:15s} {load(name).description}")
            print("\ncampaigns (chaos campaign NAME [--quick]):")
            for name in campaign_names():
                print(f"{name:17s} {load_campaign(name).experiment}")
            return 0
        if args.command == "campaign":
            # Torch-free: a bad name, file or seed list is answered before the runner is imported.
            campaigns = [load_campaign(name, quick=args.quick) for name in args.campaigns]
            seeds = parse_seeds(args.seeds) if args.seeds else None
            from chaos.campaign.cli import run_campaigns

            return run_campaigns(args, campaigns, seeds)
        if args.command in ("run", "demo"):
            name = "demo" if args.command == "demo" else args.scenario
            out = args.out or Path("runs") / f"{Path(name).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
            report = run_scenario(name, out, quiet=getattr(args, "quiet", False), device=args.device)
            _print_report(report, out)
            return 0 if report["verdict"] == "pass" else 1
        if args.command in ("verify", "report"):
            report = _verify_or_report(args.run_dir, write=args.command == "report")
            _print_report(report, args.run_dir)
            return 0 if report["verdict"] == "pass" else 1
        if args.command == "check-samples":
            if not args.log_dir.is_dir():
                raise FileNotFoundError(f"no directory {args.log_dir}: pass the directory your loop's SampleLog wrote")
            from chaos.proof.samples import check_samples

            check = check_samples(args.log_dir, args.size, args.epochs)
            print(f"{'PASS' if check.passed else 'FAIL'}: {check.steps} steps, world sizes by generation "
                  f"{check.world_sizes}, {len(check.redone)} step(s) redone after a fault")
            for problem in check.problems:
                print(f"  - {problem}")
            return 0 if check.passed else 1
        if args.command == "bench":
            if args.scale:
                from chaos.scale.bench import DEFAULT_SIZES, run_scale_bench, scale_timing

                default = [64, 256] if args.quick else list(DEFAULT_SIZES)
                if args.generations is not None and args.generations < 0:
                    parser.error(f"--generations {args.generations}: give 0 (skip) or more")
                has_gevent = importlib.util.find_spec("gevent") is not None
                if args.participants == "events" and not has_gevent:
                    parser.error("--participants events runs the simulated participants on gevent's event loop, and "
                                 "gevent is not installed here: pip install gevent (or the [scale] extra: pip install "
                                 "-e '.[scale]'), or give --participants threads")
                if args.participants is None:
                    args.participants = "events" if has_gevent else "threads"
                    if not has_gevent:  # thousands of threads on few cores: the report measures the kernel's switching
                        print("gevent is not installed: the simulated participants run as threads, which on a machine "
                              "of few cores measure the kernel switching thousands of them more than the protocol "
                              "(pip install gevent, or the [scale] extra, for event-loop participants)",
                              file=sys.stderr, flush=True)
                try:
                    timing = scale_timing(args.heartbeat_interval)
                except ConfigError as exc:
                    parser.error(f"--heartbeat-interval {args.heartbeat_interval}: {exc}")
                return run_scale_bench(args.out, args.sizes or default, quick=args.quick, generations=args.generations,
                                       participants=args.participants, timing=timing)
            if args.heartbeat_interval is not None:
                parser.error("--heartbeat-interval is the simulated participants' timing: give it with --scale")
            if args.only == "heal":
                from chaos.bench.heal import run_heal_bench

                return run_heal_bench(args.out, 3 if args.quick else 5)
            if args.only == "status":
                from chaos.bench.status import run_status_bench

                return run_status_bench(args.out, 3 if args.quick else 5)
            if args.only == "store_restart":
                from chaos.bench.store_restart import run_store_bench

                return run_store_bench(args.out, 3 if args.quick else 5)
            if args.only == "device":
                from chaos.bench.device import run_device_bench

                return run_device_bench(args.out, args.quick)
            if args.only == "forget":
                from chaos.bench.forget import run_forget_bench

                return run_forget_bench(args.out, args.quick)
            from chaos.bench.suite import run_bench

            return run_bench(args.out, quick=args.quick)
    except (ScenarioError, FileNotFoundError, NetworkError) as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    except ReferenceUnusable as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
