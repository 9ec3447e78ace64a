"""Your own DDP loop under ftcoord: the PyTorch DDP tutorial's Trainer, made to survive any rank's death.

The shape is pytorch/examples' `distributed/ddp-tutorial-series/multigpu_torchrun.py` (a Trainer with
_run_batch / _run_epoch / train, a DataLoader, rank 0 saving an epoch snapshot). The lines ftcoord
adds are marked `# ftcoord`:

    ftcoord-launch --embedded-store --job-id own-loop --nproc-per-node 2 -- python examples/own_loop.py 20 5

`--device cuda` trains on cuda:$LOCAL_RANK over NCCL, one GPU per process (built to torch's API and tested on
the CPU, not yet run on a GPU: README's support matrix); `auto`, the default, is cuda when torch sees a GPU.

Kill any process (kill -9 PID), rank 0's included: the survivor keeps its live state, the
replacement is healed from it (model, optimizer *and* data position), and the epoch goes on at the
exact next sample: nothing is trained twice, nothing skipped, on 2 ranks or after the world size
changed. The snapshot is only for when every process is gone.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

from ftcoord import CallWrapper, Wrapper  # ftcoord
from ftcoord.errors import ConfigError  # ftcoord
from ftcoord.sampler import ElasticBatchSampler  # ftcoord: instead of DistributedSampler
from ftcoord.wrapper.device import DEVICE_CHOICES, local_device  # ftcoord


class MyTrainDataset(Dataset):
    """The tutorial's random regression data, fixed by a seed, and each item's index (its sample id)."""

    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.x, self.y = torch.rand(size, 20, generator=generator), torch.rand(size, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return index, self.x[index], self.y[index]


class Trainer:
    def __init__(self, model: torch.nn.Module, dataset: Dataset, optimizer: torch.optim.Optimizer, batch_size: int,
                 save_every: int, snapshot_path: Path, sample_log: str | None, device: torch.device) -> None:
        self.model, self.optimizer, self.save_every, self.snapshot_path = model, optimizer, save_every, snapshot_path
        self.device = device
        self.sampler = ElasticBatchSampler(len(dataset), batch_size)  # ftcoord: a data position that heals
        self.train_data = DataLoader(dataset, batch_sampler=self.sampler)
        self.step = 0  # ftcoord: steps committed (what call.heal compares)
        self.sample_log = sample_log
        self._log = None
        if snapshot_path.exists():
            self._load_snapshot()

    def _load_snapshot(self) -> None:
        snapshot = torch.load(self.snapshot_path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.sampler.load_state_dict(snapshot["DATA_STATE"])
        self.step = snapshot["STEP"]
        print(f"resuming from the snapshot at epoch {self.sampler.epoch}, step {self.step}", flush=True)

    def _save_snapshot(self) -> None:
        snapshot = {"MODEL_STATE": self.model.state_dict(), "OPTIMIZER_STATE": self.optimizer.state_dict(),
                    "DATA_STATE": self.sampler.state_dict(), "STEP": self.step}
        temporary = self.snapshot_path.with_suffix(".tmp")
        torch.save(snapshot, temporary)
        os.replace(temporary, self.snapshot_path)  # a kill mid-save leaves the previous snapshot whole

    def _run_batch(self, call: CallWrapper, ddp: DDP, source: torch.Tensor, targets: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = F.mse_loss(ddp(source.to(self.device)), targets.to(self.device))
        loss.backward()
        call.wait_for_device()  # ftcoord: on a GPU, the all-reduce done (not aborted) before the step changes weights
        self.optimizer.step()

    def _run_epoch(self, call: CallWrapper, ddp: DDP, epoch: int) -> bool:
        """Train what is left of `epoch`; False when the job was asked to stop (SIGTERM, a preemption notice)."""
        self.sampler.set_epoch(epoch)  # keeps the position when resuming this epoch
        for ids, source, targets in self.train_data:
            call.check()  # ftcoord: leave at a step boundary if a peer died, hung or rejoined
            if call.should_stop:  # ftcoord: a stop asked anywhere ends the generation first: every rank stops here
                return False
            self._record(call, epoch, ids)
            self._run_batch(call, ddp, source, targets)
            self.sampler.step()  # ftcoord: this global batch is consumed
            self.step += 1
            call.step = self.step  # ftcoord
            call.ping()  # ftcoord
        return True

    def train(self, call: CallWrapper, max_epochs: int) -> None:
        call.init_process_group(device=self.device)  # ftcoord: this generation's group (NCCL on a GPU, else gloo)
        # ftcoord: the member that trained furthest hands model, optimizer and data position to the others.
        self.step = call.heal({"model": self.model, "optimizer": self.optimizer, "data": self.sampler}, step=self.step)
        print(f"generation {call.iteration}: rank {call.rank} of {call.world_size} at epoch {self.sampler.epoch}, "
              f"sample {self.sampler.consumed} of {self.sampler.size} (step {self.step})", flush=True)
        ddp = DDP(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        for epoch in range(self.sampler.epoch, max_epochs):
            if not self._run_epoch(call, ddp, epoch):
                if call.rank == 0:  # the position mid-epoch is in the snapshot: a relaunch resumes there
                    self._save_snapshot()
                    print(f"stopped: snapshot saved at step {self.step}", flush=True)
                return
            if call.rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot()
                print(f"epoch {epoch}: snapshot saved at step {self.step}", flush=True)

    def _record(self, call: CallWrapper, epoch: int, ids: torch.Tensor) -> None:
        """The evidence for `chaos check-samples` (only with --sample-log), written before the step's forward
        pass: see chaos.proof.samples for why."""
        if self.sample_log is None:
            return
        if self._log is None:
            from chaos.proof.samples import SampleLog

            self._log = SampleLog(self.sample_log, call.slot)
        self._log.record(epoch, self.step, call.rank, call.world_size, call.iteration, ids.tolist())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("total_epochs", type=int, help="total epochs to train the model")
    parser.add_argument("save_every", type=int, help="how often to save a snapshot (epochs)")
    parser.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=32,
                        help="samples each rank trains per step (default: 32)")
    parser.add_argument("--dataset-size", type=int, default=2048, help="samples (default: 2048)")
    parser.add_argument("--snapshot", type=Path, default=Path("snapshot.pt"), help="default: snapshot.pt")
    parser.add_argument("--save", metavar="PATH", help="rank 0 writes the final model's state_dict here")
    parser.add_argument("--sample-log", metavar="DIR", help="record every trained sample id (chaos check-samples)")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                        help="cuda: this process's GPU, cuda:$LOCAL_RANK, over NCCL; auto: cuda when torch sees a GPU, "
                             "else cpu over gloo (default: auto)")
    args = parser.parse_args()
    try:
        device = local_device(args.device)  # ftcoord: cuda:$LOCAL_RANK, checked against the GPUs this node has
    except ConfigError as exc:
        parser.error(str(exc))

    torch.manual_seed(0)  # the same initial weights on every process
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    trainer = Trainer(model, MyTrainDataset(args.dataset_size), optimizer, args.batch_size, args.save_every,
                      args.snapshot, args.sample_log, device)

    @Wrapper()  # ftcoord: store, job, slot and world size from ftcoord-launch's environment
    def run(call: CallWrapper) -> None:
        trainer.train(call, args.total_epochs)
        if call.rank == 0 and args.save:
            torch.save(model.state_dict(), args.save)

    run()


if __name__ == "__main__":
    main()
