"""In-memory healing of a TrainState: `call.heal`, and a checkpoint only when no member holds state.

The most advanced member heals the rest (ftcoord.heal: tensor-wise over the generation's group). A
process that neither trained a step nor restored state offers nothing (step NO_STATE); only when no
member holds anything does rank 0 read a checkpoint (flash image or disk), and a second heal hands it
to the others. Fresh weights are identical on every rank (same seed), so after a start from nothing
the second heal finds every member matching and moves nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ftcoord import CallWrapper
from ftcoord.heal import NO_STATE
from training.checkpoint.base import Loaded
from training.state import TrainState


@dataclass
class HealReport:
    source: int | None
    """Rank whose state everyone now holds (None: nobody held state, nothing was loaded)."""
    step: int
    receivers: list[int] = field(default_factory=list)
    loaded_from: str | None = None
    """Set when no member held state and a checkpoint was read."""
    bytes: int = 0
    seconds: float = 0.0


def heal(call: CallWrapper, state: TrainState, load_checkpoint: Callable[[], Loaded | None]) -> HealReport:
    """Make every member hold the most advanced state; returns what was done."""
    objects = {"model": state.model, "optimizer": state.optimizer, "scheduler": state.scheduler}
    step = call.heal(objects, state.step if state.has_state else NO_STATE)
    assert call.last_heal is not None
    seconds, loaded_from = call.last_heal.seconds, None
    if step < 0:  # nobody holds state: rank 0 reads the newest checkpoint, if any, and hands it on
        if call.rank == 0:
            loaded = load_checkpoint()
            if loaded is not None:
                state.restore(loaded.payload)
                loaded_from = loaded.source
        state.has_state = True
        step = call.heal(objects, state.step)
        seconds += call.last_heal.seconds
    state.step, state.has_state = step, True
    last = call.last_heal
    return HealReport(last.source, step, list(last.receivers), loaded_from, last.bytes, seconds)
