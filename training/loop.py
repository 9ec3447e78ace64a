"""The DDP training loop under @Wrapper: one call per generation, exact resume on faults."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ftcoord import CallWrapper
from ftcoord.log import get_logger
from ftcoord.wrapper.device import local_device
from training import reduction
from training.buffers import BufferGuard
from training.checkpoint import atomic
from training.checkpoint.base import CheckpointStrategy, Loaded, SaveStats, load_latest, make_strategy
from training.config import TrainConfig
from training.data import batch_hash, collate, make_dataset
from training.heal import heal
from training.hooks import StepContext, StepHook, acts_in_writes, load_hook
from training.ledger import Ledger
from training.models import build_model, parameter_count
from training.sampler import ResumableGlobalBatchSampler, derive_seed, ids_hash, local_batch
from training.state import TrainState, build_optimizer, build_scheduler


class Trainer:
    """Holds the live state of this process across generations (in-process restarts)."""

    def __init__(self, config: TrainConfig, slot: int) -> None:
        self.config = config
        self.slot = slot
        self.device = local_device(config.device)
        self.dataset = make_dataset(config.dataset, config.seed)
        self.sampler = ResumableGlobalBatchSampler(len(self.dataset), config.global_batch, config.seed)
        sample = self.dataset[0][0]
        model = build_model(config.model, tuple(sample.shape), self.dataset.classes, config.seed)  # type: ignore[attr-defined]
        model.to(self.device)  # built on the CPU, so the first weights are the same bits on any device
        optimizer = build_optimizer(config, model)
        self.state = TrainState(model, optimizer, build_scheduler(config, optimizer), self.sampler)
        self.config_hash = config.config_hash()
        if config.ckpt_dir is not None:
            atomic.require_writable(Path(config.ckpt_dir))
        self.hooks: tuple[StepHook, ...] = tuple(load_hook(spec, config) for spec in config.hooks)
        writes = [(spec, hook) for spec, hook in zip(config.hooks, self.hooks, strict=True) if acts_in_writes(hook)]
        self.checkpoint: CheckpointStrategy | None = make_strategy(
            config.ckpt_strategy, config.ckpt_dir, config_hash=self.config_hash, keep=config.ckpt_keep,
            job_id=config.job_id, max_failures=config.ckpt_max_failures,
            hooks=tuple(spec for spec, _ in writes), write_hooks=tuple(hook for _, hook in writes))
        if self.checkpoint is not None:
            self.checkpoint.on_durable = self._checkpoint_durable
        self._saved_in: dict[int, int] = {}  # step -> generation that saved it (for the ledger line)
        self.ledger = Ledger(config.log_dir or os.environ.get("FTCOORD_LOG_DIR"), config.job_id, slot)
        self.log = get_logger(component="trainer", slot=slot)
        self.log.info("trainer_ready", device=str(self.device), parameters=parameter_count(model),
                      dataset_size=len(self.dataset),
                      steps_per_epoch=self.sampler.steps_per_epoch, config_hash=self.config_hash)

    # -- resume ---------------------------------------------------------------------

    def _load_checkpoint(self) -> Loaded | None:
        """Only when no member holds state: the newest flash image or disk checkpoint."""
        if self.config.ckpt_dir is None:
            return None
        if self.checkpoint is not None:
            loaded = self.checkpoint.load(self.config.warm_start, self.config.ckpt_start_over)
        else:
            loaded = load_latest(Path(self.config.ckpt_dir), self.config_hash, self.config.warm_start,
                                 self.config.ckpt_start_over)
        if loaded is not None and loaded.warm:
            # Warm start: the weights only; optimizer, schedule and data order start afresh.
            self.state.model.load_state_dict(loaded.payload["model"])
            self.state.has_state = True
            return None
        return loaded

    # -- one generation -------------------------------------------------------------------

    def __call__(self, call: CallWrapper) -> str:
        config, state = self.config, self.state
        call.init_process_group(device=self.device)
        rank, world = call.rank, call.world_size
        local_batch(config.global_batch, world)  # the leader only picks divisors; guard anyway
        report, loaded_from = heal(call, state, self._load_checkpoint)
        call.step = state.step
        # What the verifier needs to replay this generation exactly: the configuration, the gradient
        # reduction and the intra-op threads (a matmul may round differently with another count).
        self.ledger.write("generation", generation=call.iteration, rank=rank, world_size=world,
                          members=list(call.members), cause=call.cause, culprits=list(call.culprits),
                          start_step=state.step, heal_source=report.source,
                          heal_receivers=list(report.receivers), heal_bytes=report.bytes,
                          heal_s=round(report.seconds, 4), loaded_from=loaded_from,
                          restarts=call.restarts, config_hash=self.config_hash, trajectory=config.trajectory(),
                          grad_reduction=config.grad_reduction, threads=torch.get_num_threads(),
                          device=self.device.type)
        if self.checkpoint is not None and rank == 0:
            self.checkpoint.prepare()
        # Buffers (BatchNorm statistics) are synced after backward rather than at the next forward
        # (DDP's default) and rolled back when a step fails: see training.buffers.
        ddp = DDP(state.model, broadcast_buffers=False,
                  device_ids=[self.device.index] if self.device.type == "cuda" else None)
        mid = (lambda: self._run_hooks("mid_reduction", call, self.state.step)) if self.hooks else None
        reduction.install(ddp, config.grad_reduction, between_phases=mid)
        buffers = BufferGuard(state.model)
        try:
            while state.step < config.steps:
                if not self._step(call, ddp, buffers):
                    return self._stop(call)
        except BaseException as exc:
            buffers.roll_back()
            if call.store_lost is not None and isinstance(exc, Exception):
                # A peer stopped first and its group went down under our step: that step changed nothing, and
                # this rank's last committed step is still the newest anyone has.
                return self._stop(call)
            if call.store_away and isinstance(exc, Exception) and self.checkpoint is not None and rank == 0:
                # The step failed while the store is away (a peer gave up on it first, or died): rejoining waits
                # for the store, which may never come back; what this rank committed is saved first.
                self._save(call, world)
                self.checkpoint.flush()
            raise
        self.ledger.write("final", generation=call.iteration, rank=rank, world_size=world, step=state.step,
                          digest=state.digest())
        if rank == 0 and self.ledger.directory is not None:
            # The final parameters, for divergence (L2) against a reference run.
            final = {name: tensor.cpu() for name, tensor in state.model.state_dict().items()}
            torch.save(final, self.ledger.directory / "final_params.pt")
        if self.checkpoint is not None and rank == 0:
            self.checkpoint.flush()
        return "done"

    def _step(self, call: CallWrapper, ddp: DDP, buffers: BufferGuard) -> bool:
        """One global step; False when the job asks to stop instead. Every collective runs before
        the first change to parameters or optimizer state, so a failed step changes nothing."""
        config, state, hooks = self.config, self.state, self.hooks
        rank, world = call.rank, call.world_size
        call.check()  # before should_stop: a stop first ends the generation (see monitor)
        if call.should_stop:
            return False
        step = state.step
        torch.manual_seed(derive_seed(config.seed, "step", step, rank))
        shard = self.sampler.shard(step, rank, world)
        x, y, consumed = collate(self.dataset, shard)
        state.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x.to(self.device)), y.to(self.device))
        loss.backward()  # DDP all-reduces the gradients here (on a GPU: queues the all-reduce)
        if hooks:
            self._run_hooks("after_backward", call, step)
        if buffers.buffers:
            buffers.sync_from_rank0()
        call.wait_for_device()  # on a GPU: the step's collectives done, and not aborted, before anything changes
        state.optimizer.step()
        if hooks:
            self._run_hooks("after_optimizer_step", call, step, optimizer=state.optimizer)
        state.scheduler.step()
        state.step = step + 1  # committed: this rank applied the full global batch
        buffers.commit()
        call.step = state.step
        call.ping()
        sampler_state = self.sampler.state(step)
        self.ledger.write("step", generation=call.iteration, rank=rank, world_size=world, step=step,
                          epoch=sampler_state.epoch, cursor=sampler_state.cursor,
                          window_hash=ids_hash(self.sampler.window(step)), shard_hash=ids_hash(consumed),
                          shard_count=len(consumed), shard_ids=consumed.tolist(), batch_hash=batch_hash(x, y),
                          loss=loss.item(), lr=state.scheduler.get_last_lr()[0])
        if self.checkpoint is not None and rank == 0 and state.step % config.ckpt_every == 0:
            self._save(call, world)
        if hooks:
            self._run_hooks("at_boundary", call, state.step)
        extra = config.step_time + config.sample_time * len(shard)
        if extra:
            time.sleep(extra)
        return True

    def _save(self, call: CallWrapper, world: int) -> None:
        assert self.checkpoint is not None
        self._saved_in[self.state.step] = call.iteration
        started = time.monotonic()
        with call.atomic():
            self.checkpoint.save(self.state, world)
        call.checkpoint_stall(time.monotonic() - started)

    def _checkpoint_durable(self, stats: SaveStats) -> None:
        """A save reached disk (for the background strategies: their write completed): now it counts."""
        self.ledger.write("checkpoint", generation=self._saved_in.pop(stats.step, None), **stats.to_dict())

    def _stop(self, call: CallWrapper) -> str:
        """Preemption: an emergency checkpoint of the last committed step, then return."""
        if self.checkpoint is not None and call.rank == 0:
            self._save(call, call.world_size)
            self.checkpoint.flush()
        self.ledger.write("stopped", generation=call.iteration, rank=call.rank, step=self.state.step)
        self.log.info("training_stopped", step=self.state.step)
        return "stopped"

    def _run_hooks(self, point: str, call: CallWrapper, step: int, optimizer: Any = None) -> None:
        ctx = StepContext(step, call.iteration, call.rank, call.slot, call.world_size, call.is_leader, optimizer)
        for hook in self.hooks:
            method = getattr(hook, point, None)
            if method is not None:
                method(ctx)

    def close(self, finished: bool) -> None:
        if self.checkpoint is not None:
            self.checkpoint.close(finished)
        self.ledger.close()

