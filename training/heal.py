"""In-memory healing of a TrainState: `call.heal`, and a checkpoint only when no member holds state.

The most advanced member heals the rest (ftcoord.wrapper.heal: tensor-wise over the generation's group). A
process that neither trained a step nor restored state offers nothing (step NO_STATE); only when no
member holds anything does rank 0 read a checkpoint (flash image or disk), and a second heal hands it
to the others. Fresh weights are identical on every rank (same seed), so after a start from nothing
the second heal finds every member matching and moves nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ftcoord import CallWrapper
from ftcoord.wrapper.heal import NO_STATE, HealReport
from training.checkpoint.base import Loaded
from training.state import TrainState


def heal(call: CallWrapper, state: TrainState,
         load_checkpoint: Callable[[], Loaded | None]) -> tuple[HealReport, str | None]:
    """Make every member hold the most advanced state; returns what was done (the seconds of both heals
    when a checkpoint was read) and the checkpoint read, if this rank read one."""
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
    return replace(call.last_heal, seconds=seconds), loaded_from
