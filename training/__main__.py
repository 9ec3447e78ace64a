"""`python -m training`: one rank of a fault-tolerant DDP job (run it under ftcoord-launch).

    ftcoord-launch --embedded-store --job-id demo --nproc 2 -- \
        python -m training --job-id demo --steps 200 --global-batch 32 --ckpt-dir runs/ckpt
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields
from pathlib import Path

from ftcoord import arguments, env, log
from ftcoord.config import Timing
from ftcoord.errors import ConfigError, FatalError, FtcoordError, Superseded
from ftcoord.wrapper.decorator import Wrapper
from ftcoord.wrapper.device import DEVICE_CHOICES
from training.checkpoint import atomic
from training.config import GRAD_REDUCTIONS, MODELS, STRATEGIES, DatasetSpec, TrainConfig, check_dataset_holds_a_batch
from training.errors import TrainingConfigError
from training.hooks import check_hook

DEFAULTS = {f.name: f.default for f in fields(TrainConfig) if f.name != "hooks"}


def build_parser() -> argparse.ArgumentParser:
    p = arguments.Parser(prog="python -m training", description=__doc__,
                                formatter_class=arguments.DefaultsHelpFormatter)
    p.add_argument("--job-id", default=None, help="default: FTCOORD_JOB_ID from the launcher")
    p.add_argument("--steps", type=arguments.positive_int, default=DEFAULTS["steps"],
                   help="global steps to train in total")
    p.add_argument("--global-batch", type=arguments.positive_int, default=DEFAULTS["global_batch"],
                   help="samples per step over all ranks (constant through world-size changes)")
    p.add_argument("--model", choices=MODELS, default=DEFAULTS["model"])
    p.add_argument("--dataset", default=DEFAULTS["dataset"],
                   help="synthetic[:N] | fakedata[:N] | fakedata100[:N] | cifar10:PATH | cifar100:PATH | "
                   "imagefolder:PATH")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    p.add_argument("--lr", type=arguments.positive_float, default=DEFAULTS["lr"])
    p.add_argument("--optimizer", choices=("sgd", "adam"), default=DEFAULTS["optimizer"])
    p.add_argument("--ckpt-dir", default=None, help="checkpoint directory (resume is automatic)")
    p.add_argument("--ckpt-strategy", choices=STRATEGIES, default=DEFAULTS["ckpt_strategy"])
    p.add_argument("--ckpt-every", type=arguments.positive_int, default=DEFAULTS["ckpt_every"],
                   help="steps between checkpoints")
    p.add_argument("--ckpt-keep", type=arguments.positive_int, default=DEFAULTS["ckpt_keep"],
                   help="checkpoints kept on disk")
    p.add_argument("--ckpt-max-failures", type=arguments.positive_int, default=DEFAULTS["ckpt_max_failures"],
                   help="failed saves in a row (full disk, read-only, I/O error) before the job stops with an error "
                        "naming the directory; each failure is logged as checkpoint_failed")
    p.add_argument("--ckpt-start-over", action="store_true",
                   help="when checkpoints exist but none can be loaded, train from step 0 instead of refusing "
                        "(the unreadable ones are kept, renamed step_<N>.rejected)")
    p.add_argument("--warm-start", action="store_true",
                   help="accept a checkpoint from another configuration: load its weights only")
    p.add_argument("--log-dir", default=None, help="step ledger and logs (default: FTCOORD_LOG_DIR)")
    p.add_argument("--step-time", type=arguments.non_negative_float, default=DEFAULTS["step_time"],
                   help="extra seconds per step, to shape a run")
    p.add_argument("--sample-time", type=arguments.non_negative_float, default=DEFAULTS["sample_time"],
                   help="extra seconds per sample of this rank's shard (emulated compute: a rank with a "
                        "bigger shard, as after losing ranks, takes longer)")
    p.add_argument("--min-world-size", type=arguments.positive_int, default=DEFAULTS["min_world_size"])
    p.add_argument("--grad-reduction", choices=GRAD_REDUCTIONS, default=DEFAULTS["grad_reduction"],
                   help="fixed: gradients summed in rank order, so a run with faults ends bit-identical to a "
                        "fault-free run at every world size; allreduce: DDP's built-in (exact up to 2 ranks)")
    p.add_argument("--device", choices=DEVICE_CHOICES, default=DEFAULTS["device"],
                   help="where this rank trains: cuda is cuda:$LOCAL_RANK over NCCL, one GPU per process on a node "
                        "(workers and spares); auto is cuda when torch sees a GPU, else cpu over gloo")
    p.add_argument("--hook", action="append", default=[], help="MODULE:FACTORY step hook (fault injection)")
    timing = Timing()
    p.add_argument("--heartbeat-interval", type=arguments.positive_float, default=None,
                   help=f"seconds between two heartbeats (default: {timing.heartbeat_interval:g}: "
                        "ftcoord.config.Timing)")
    p.add_argument("--heartbeat-timeout", type=arguments.positive_float, default=None,
                   help=f"a heartbeat silent this long is a death (default: {timing.heartbeat_timeout:g})")
    p.add_argument("--join-timeout", type=arguments.positive_float, default=None,
                   help=f"how long the leader waits for missing ranks before a partial quorum (default: "
                        f"{timing.join_timeout:g})")
    p.add_argument("--progress-timeout", type=arguments.seconds_or_off, default=None,
                   help="a rank whose training thread made no step for this long while its heartbeat runs (and "
                        "that is not waiting on its peers) is stuck: fenced and replaced. Default: 12 heartbeat "
                        "timeouts and at most 2/3 of --pg-timeout (40 s); 'off' never. Raise it above your longest "
                        "step or checkpoint save")
    p.add_argument("--pg-timeout", type=arguments.positive_float, default=60.0,
                   help="process-group (collective) timeout, seconds")
    return p


def prepare(argv: list[str] | None) -> tuple[TrainConfig, Wrapper, int]:
    """Everything that can be checked before importing torch: the command line, the configuration, the
    dataset's folder, the job's world size against the global batch (from the launcher's environment).

    Raises:
        SystemExit: 2, argparse's answer to a malformed command line.
        FtcoordError: a value that cannot work (its message names it, the limit and what to do).
    """
    args = build_parser().parse_args(argv)
    config = TrainConfig(
        job_id=args.job_id or env.job_id_from_env(), steps=args.steps, global_batch=args.global_batch,
        model=args.model, dataset=args.dataset, seed=args.seed, lr=args.lr, optimizer=args.optimizer,
        ckpt_dir=args.ckpt_dir, ckpt_strategy=args.ckpt_strategy if args.ckpt_dir else "none",
        ckpt_every=args.ckpt_every, ckpt_keep=args.ckpt_keep, ckpt_max_failures=args.ckpt_max_failures,
        ckpt_start_over=args.ckpt_start_over, warm_start=args.warm_start,
        log_dir=args.log_dir or os.environ.get(env.LOG_DIR_ENV), step_time=args.step_time,
        sample_time=args.sample_time,
        min_world_size=args.min_world_size, grad_reduction=args.grad_reduction, device=args.device,
        hooks=tuple(args.hook))
    dataset = DatasetSpec.parse(config.dataset)
    dataset.check()
    if dataset.size:
        check_dataset_holds_a_batch(dataset.size, config.global_batch)
    for hook in config.hooks:
        check_hook(hook)
    wrapper = Wrapper(job_id=config.job_id, min_world_size=config.min_world_size,
                      global_batch=config.global_batch, heartbeat_interval=args.heartbeat_interval,
                      heartbeat_timeout=args.heartbeat_timeout, join_timeout=args.join_timeout,
                      progress_timeout=args.progress_timeout, pg_timeout=args.pg_timeout, log_dir=config.log_dir)
    wrapper.check_configuration()
    return config, wrapper, env.slot_from_env()


def ftcoord_preload(argv: list[str]) -> tuple[str, ...]:
    """What ftcoord-launch's warm standby imports ahead of time for this command line (torch, the loop,
    the models and their libraries). A command line `prepare` refuses raises here: the standby then
    imports nothing heavy, and the process it forks says what is wrong in a fraction of a second."""
    prepare(argv)
    return ("training.loop",)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done (or stopped for a preemption); 2 a bad argument or configuration, found before
    training starts (the launcher does not restart it); 4 the job failed (a fatal error, here or in a peer)."""
    try:
        config, wrapper, slot = prepare(argv)
        if config.ckpt_dir is not None:
            atomic.require_writable(Path(config.ckpt_dir))
        if config.log_dir:
            _configure_logs(config.log_dir, slot)
        elif not log.is_configured():
            log.configure(None)  # an entry point of ftcoord's: its events on stderr
        from training.loop import Trainer  # torch: only once the command line is known to be good

        trainer = Trainer(config, slot)
    except FtcoordError as exc:
        print(f"python -m training: {exc}", file=sys.stderr)
        return 2
    result = None
    try:
        result = wrapper.run(trainer)
    except ConfigError as exc:  # found when the job's coordination started: still nothing trained
        print(f"python -m training: {exc}", file=sys.stderr)
        return 2
    except FatalError as exc:
        print(f"python -m training: {exc}", file=sys.stderr)
        return 4
    except Superseded as exc:  # paused long enough to be replaced: the replacement carries on
        print(f"python -m training: {exc}", file=sys.stderr)
        return 1
    finally:
        trainer.close(finished=result == "done")
    return 0


def _configure_logs(log_dir: str, slot: int) -> None:
    try:
        log.configure(os.path.join(log_dir, f"train-slot{slot}-{os.getpid()}.jsonl"))
    except OSError as exc:
        raise TrainingConfigError(f"--log-dir {log_dir}: cannot write logs there ({exc.strerror}); create it or "
                                  f"point --log-dir (or FTCOORD_LOG_DIR) at a writable directory") from exc


if __name__ == "__main__":
    sys.exit(main())
