"""Healing: the most advanced member hands its state to every member that is behind or differs.

At the start of a generation some members may hold less than others: a replacement forked from a warm standby
holds fresh weights, a member left out of the last generation holds an older step. `heal` makes every member hold
the state of the member with the highest step (lowest rank on ties), for any set of objects with
`state_dict()`/`load_state_dict()` and for plain tensors, over the generation's process group (the protocol: `heal`).
A peer's state is read with `weights_only=True`: it can never run code here. Every member reaches the same
decisions from the same gathered data, so none is left waiting in a collective. The skeleton, the tensors and the
digests are `ftcoord.wrapper.state_tree`.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ftcoord.errors import FatalError
from ftcoord.wrapper.state_tree import StateTree, as_bytes, check_objects, digest, flatten, rebuild, tensor_paths

NO_STATE = -1
"""The step of a member that holds nothing worth sharing (any negative step means the same)."""

_DIRECT_BYTES = 1 << 20  # tensors this large travel on their own (in place); smaller ones are packed
_ALIGN = 16  # packed tensors start at multiples of the largest element size (complex128)


class StateMismatch(FatalError):
    """Members asked to heal different sets of objects, or a state that cannot travel: no restart fixes it."""


@dataclass(frozen=True)
class HealReport:
    """What one heal did (source, step and receivers are equal on every member)."""

    source: int | None
    """The rank whose state every member now holds; None when nobody held state."""
    step: int
    """The healed step (the given step when nobody held state)."""
    receivers: tuple[int, ...] = ()
    """Ranks that received state (behind, or at the source's step with a different digest)."""
    bytes: int = 0
    """Bytes this member sent to each receiver or received (tensors and skeleton); 0 when it took no part."""
    seconds: float = 0.0
    """How long the heal took on this member, in seconds."""


# -- the transfer ------------------------------------------------------------------------------------

def _wire_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _home_device(device_type: str) -> torch.device:
    """Where a receiver keeps a tensor it did not hold before: on its GPU when the source's was on one."""
    if device_type == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _Wire:
    """Moves tensors from the source to the receivers, the cheapest way for who takes part."""

    def __init__(self, rank: int, world: int, source: int, receivers: tuple[int, ...]) -> None:
        self.rank, self.source, self.receivers = rank, source, receivers
        self.group: dist.ProcessGroup | None = None
        self.subgroup = False
        if len(receivers) == 1 and world > 2:
            self.mode = "p2p"
        else:
            self.mode = "broadcast"
            if len(receivers) < world - 1:  # new_group is collective over every member
                self.group = dist.new_group(sorted((source, *receivers)))
                self.subgroup = True

    def move(self, tensor: torch.Tensor) -> None:
        if self.mode == "p2p":
            if self.rank == self.source:
                dist.send(tensor, dst=self.receivers[0])
            else:
                dist.recv(tensor, src=self.source)
        else:
            dist.broadcast(tensor, src=self.source, group=self.group)

    def close(self) -> None:
        if self.subgroup and self.group is not None and self.group != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(self.group)


def _wait_for(device: torch.device) -> None:
    """Wait for a GPU's queued transfers here, in torch.cuda's synchronisation, where a wait counts as one on the peers
    (ftcoord.liveness.still_stack); `.item()` would wait as long in native code, and look stuck."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _send_skeleton(wire: _Wire, device: torch.device, flat: StateTree | None) -> tuple[dict[str, Any], int]:
    """The source's skeleton and tensor metadata on every participant, and its size in bytes (StateMismatch
    on all if it cannot travel safely)."""
    size = torch.zeros(1, dtype=torch.int64, device=device)
    payload = b""
    if flat is not None:  # the source
        buffer = io.BytesIO()
        message = {"skeleton": flat.skeleton, "tensors": flat.meta()}
        try:
            torch.save(message, buffer)
            payload = buffer.getvalue()
            torch.load(io.BytesIO(payload), weights_only=True)  # what the receivers will do
            size.fill_(len(payload))
        except Exception as exc:
            size.fill_(-1)
            wire.move(size)
            raise StateMismatch(f"call.heal: the state cannot travel safely ({exc}); state_dict() must hold only "
                                f"tensors, numbers, strings, lists, tuples and dicts") from exc
    wire.move(size)
    _wait_for(device)
    length = int(size.item())
    if length < 0:
        raise StateMismatch("call.heal: the source's state cannot travel safely (its process names the value)")
    data = (torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device) if flat is not None
            else torch.empty(length, dtype=torch.uint8, device=device))
    wire.move(data)
    if flat is not None:
        return message, length
    _wait_for(device)
    return torch.load(io.BytesIO(data.cpu().numpy().tobytes()), weights_only=True), length


def _layout(meta: list[tuple[str, tuple[int, ...], str]], wire_type: str) -> tuple[list[int], dict[int, int], int]:
    """Which tensors travel alone and where each packed one starts in the packed buffer."""
    direct, offsets, total = [], {}, 0
    for i, (dtype, shape, device_type) in enumerate(meta):
        nbytes = _nbytes(dtype, shape)
        if nbytes >= _DIRECT_BYTES and device_type == wire_type:
            direct.append(i)
        else:
            offsets[i] = total
            total += -(-nbytes // _ALIGN) * _ALIGN
    return direct, offsets, total


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * getattr(torch, dtype).itemsize


def _send_tensors(wire: _Wire, device: torch.device, flat: StateTree,
                  meta: list[tuple[str, tuple[int, ...], str]]) -> None:
    direct, offsets, total = _layout(meta, device.type)
    for i in direct:
        wire.move(flat.tensors[i].contiguous())
    if total:
        packed = torch.zeros(total, dtype=torch.uint8, device=device)
        for i, offset in offsets.items():
            data = as_bytes(flat.tensors[i])
            packed[offset:offset + data.numel()].copy_(data)
        wire.move(packed)


def _receive_tensors(wire: _Wire, device: torch.device, meta: list[tuple[str, tuple[int, ...], str]],
                     mine: dict[tuple[Any, ...], torch.Tensor], paths: list[tuple[Any, ...]]) -> list[torch.Tensor]:
    """The source's tensors, received into this member's own tensors where their shape and dtype match."""
    direct, offsets, total = _layout(meta, device.type)
    received: list[torch.Tensor | None] = [None] * len(meta)

    def own(i: int) -> torch.Tensor | None:
        dtype, shape, _ = meta[i]
        tensor = mine.get(paths[i])
        if tensor is not None and tensor.dtype == getattr(torch, dtype) and tuple(tensor.shape) == shape:
            return tensor
        return None

    for i in direct:
        dtype, shape, device_type = meta[i]
        target = own(i)
        if target is not None and target.device == device and target.is_contiguous():
            wire.move(target)  # in place: a module's parameter, an optimizer's moment
            received[i] = target
        else:
            buffer = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
            wire.move(buffer)
            received[i] = buffer if target is None else target.copy_(buffer)
    if total:
        packed = torch.empty(total, dtype=torch.uint8, device=device)
        wire.move(packed)
        for i, offset in offsets.items():
            dtype, shape, device_type = meta[i]
            piece = packed[offset:offset + _nbytes(dtype, shape)].view(getattr(torch, dtype)).view(shape)
            target = own(i)
            received[i] = (target.copy_(piece) if target is not None
                           else piece.to(_home_device(device_type), copy=True))
    return [t for t in received if t is not None]


# -- the call ------------------------------------------------------------------------------------------

def heal(objects: Mapping[str, Any], step: int) -> HealReport:
    """Make every member of the default process group hold the most advanced member's state, in place.

    1. Members gather (step, names). Different names on different members is a `StateMismatch` on
       every member (decided from the same gathered data, so nobody is left waiting in a collective).
    2. When several members share the highest step they gather a digest of their state (skeleton and
       a fingerprint per tensor): only a member whose digest differs from the source's receives. A
       member at a lower step receives without any digest being computed, so the usual case (survivors
       and one fresh replacement) hashes nothing.
    3. The source sends a small skeleton (the state dicts with every tensor replaced by its index,
       shapes, dtypes and devices), serialized with `torch.save` and read with `weights_only=True`: a
       peer's state can never run code here. A skeleton the source cannot send that way fails on every
       participant, named.
    4. Tensors travel as tensors over the generation's process group, on the device they live on (gloo
       for CPU, NCCL for CUDA): large ones one by one, received in place when the receiver already
       holds a tensor of that shape and dtype at that place (a module's parameters), small ones (and
       ones not on the wire's device) packed into one buffer. One transfer serves every receiver: a
       broadcast over the whole group when everyone else receives, a send/recv pair for one receiver,
       a subgroup's broadcast otherwise. Members that already match take part in nothing after step 2.
    5. Each receiver rebuilds its state dicts from the skeleton and calls `load_state_dict`, so state
       that does not exist yet on a fresh process (Adam's moments before its first step) is created by
       the object's own code, on the device the object wants it.

    Args:
        objects: names to tensors or to objects with state_dict()/load_state_dict(); the same names on
            every member.
        step: how far this member's objects are (steps trained); negative when they hold nothing
            worth sharing (a fresh process that should take anyone's state).

    Returns:
        The report; `report.step` is the step every member now holds (the given step when nobody held
        state).

    Raises:
        StateMismatch: the members' names differ, or the source's state cannot travel safely.
    """
    check_objects(objects)
    started = time.perf_counter()
    rank, world = dist.get_rank(), dist.get_world_size()
    names = sorted(objects)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, (int(step), names))
    _check_names(everyone)
    steps = [s for s, _ in everyone]
    source = max(range(world), key=lambda r: (steps[r], -r))
    if steps[source] < 0:
        return HealReport(None, step, seconds=time.perf_counter() - started)
    tied = [r for r in range(world) if steps[r] == steps[source]]
    flat = flatten(objects)
    digests = [""] * world
    if len(tied) > 1:
        dist.all_gather_object(digests, digest(flat) if rank in tied else "")
    receivers = tuple(r for r in range(world)
                      if r != source and (steps[r] != steps[source] or digests[r] != digests[source]))
    if not receivers:
        return HealReport(source, steps[source], seconds=time.perf_counter() - started)
    wire = _Wire(rank, world, source, receivers)  # on every member: a subgroup is created by all
    moved = 0
    try:
        if rank == source or rank in receivers:
            device = _wire_device()
            message, moved = _send_skeleton(wire, device, flat if rank == source else None)
            moved += sum(_nbytes(dtype, shape) for dtype, shape, _ in message["tensors"])
            if rank == source:
                _send_tensors(wire, device, flat, message["tensors"])
            else:
                mine = dict(zip(flat.paths, flat.tensors, strict=True))
                paths = tensor_paths(message["skeleton"])
                tensors = _receive_tensors(wire, device, message["tensors"], mine, paths)
                with torch.no_grad():
                    _load(objects, message["skeleton"], tensors)
    finally:
        wire.close()
    return HealReport(source, steps[source], receivers, moved, time.perf_counter() - started)


def _check_names(everyone: list[tuple[int, list[str]]]) -> None:
    first = everyone[0][1]
    if all(names == first for _, names in everyone):
        return
    every = sorted({n for _, names in everyone for n in names})
    lines = "; ".join(f"rank {r}: {names} (missing {sorted(set(every) - set(names))})"
                      for r, (_, names) in enumerate(everyone) if names != every)
    raise StateMismatch(f"call.heal: members hold different names (all names: {every}; {lines}); pass the same "
                        f"names on every rank")


def _load(objects: Mapping[str, Any], skeleton: dict[str, Any], tensors: list[torch.Tensor]) -> None:
    for name, obj in objects.items():
        state = rebuild(skeleton[name], tensors)
        if isinstance(obj, torch.Tensor):
            if state.shape != obj.shape or state.dtype != obj.dtype:
                raise StateMismatch(f"call.heal: tensor {name!r} is {tuple(obj.shape)} {obj.dtype} here but "
                                    f"{tuple(state.shape)} {state.dtype} on the source; a tensor is healed in "
                                    f"place, so its shape and dtype must agree on every rank")
            if state.data_ptr() != obj.data_ptr() or state.stride() != obj.stride():
                obj.copy_(state)
        else:
            obj.load_state_dict(state)
