"""What one launcher runs, with its defaults in one place (`ftcoord-launch --help` prints them).

Pure Python on purpose: the launcher parses and checks its command line before it imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftcoord.protocol.spares import spare_slot


@dataclass(frozen=True)
class LaunchConfig:
    """What one launcher runs; defaults live here and are printed by --help."""

    command: list[str]
    job_id: str
    store: str
    nproc: int = 1
    spares: int = 0
    first_slot: int = 0
    world_size: int | None = None
    max_restarts: int = 3
    restart_policy: str = "slot"
    warm_standby: int = 1
    grace_s: float = 30.0
    log_dir: str | None = None
    metrics_port: int | None = None
    """Serve Prometheus metrics on this port (0: any free one; None: no metrics)."""
    metrics_host: str = "127.0.0.1"
    store_timeout_s: float = 300.0
    """How long the launcher and its processes ride through a store that went away before they give up."""
    poll_s: float = 0.02

    @property
    def slots(self) -> list[int]:
        workers = [self.first_slot + i for i in range(self.nproc)]
        spares = [spare_slot(self.first_slot, i) for i in range(self.spares)]
        return workers + spares

    @property
    def target_world_size(self) -> int:
        return self.world_size if self.world_size is not None else self.nproc
