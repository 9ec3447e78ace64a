"""Hook points inside the training step, for fault injection (chaos) and instrumentation.

A hook is any object with any of: `at_boundary(ctx)` (after a committed step, before the next),
`after_backward(ctx)` (gradients reduced, optimizer not stepped yet), `mid_reduction(ctx)` (inside
the fixed-order gradient reduction, between its two collectives: its peers are waiting on this
rank), `after_optimizer_step(ctx)` (the optimizer stepped, the step not committed yet), and
`checkpoint_half_written(step)` (a checkpoint's payload is half on disk; called in whichever process
writes it: a writer process loads such a hook again, its factory given None). Hooks come only from
`--hook` on the command line: training reads no variable that changes what it does.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Protocol

from training.errors import TrainingConfigError


@dataclass
class StepContext:
    step: int
    """The step being trained (after_backward, mid_reduction, after_optimizer_step) or the number of committed
    steps (at_boundary)."""
    generation: int
    rank: int
    slot: int
    world_size: int
    is_leader: bool
    optimizer: Any = None
    """The optimizer (after_optimizer_step only)."""


class StepHook(Protocol):
    def at_boundary(self, ctx: StepContext) -> None: ...

    def after_backward(self, ctx: StepContext) -> None: ...

    def mid_reduction(self, ctx: StepContext) -> None: ...

    def after_optimizer_step(self, ctx: StepContext) -> None: ...

    def checkpoint_half_written(self, step: int) -> None: ...


def check_hook(spec: str) -> None:
    """Before importing anything heavy: the hook's module can be found (loading it may import torch)."""
    module_name, _, _ = spec.partition(":")
    try:
        found = bool(module_name) and importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError) as exc:
        raise TrainingConfigError(f"--hook {spec!r}: cannot load it ({exc}); use MODULE:FACTORY") from exc
    if not found:
        raise TrainingConfigError(f"--hook {spec!r}: cannot load it (no module named {module_name!r}); "
                                  f"use MODULE:FACTORY with a module on the Python path")


def load_hook(spec: str, config: Any) -> StepHook:
    """`package.module:factory` → factory(config); a checkpoint writer process, which has no training
    configuration, passes None."""
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr or "hook")
    except (ImportError, AttributeError) as exc:
        raise TrainingConfigError(f"--hook {spec!r}: cannot load it ({exc}); use MODULE:FACTORY") from exc
    return factory(config)


def acts_in_writes(hook: object) -> bool:
    """Whether `hook` acts inside a checkpoint write (it has `checkpoint_half_written`)."""
    return hasattr(hook, "checkpoint_half_written")


def hook_args(specs: tuple[str, ...] | list[str]) -> list[str]:
    """`--hook SPEC` for each spec: a writer process's command line (its --hook is load_write_hooks')."""
    return [arg for spec in specs for arg in ("--hook", spec)]


def load_write_hooks(specs: tuple[str, ...] | list[str]) -> tuple[Any, ...]:
    """The hooks of `specs` that act inside a checkpoint write, loaded in the process that writes (a writer
    process has no training configuration: factories get None)."""
    return tuple(hook for hook in (load_hook(spec, None) for spec in specs) if acts_in_writes(hook))
