"""A member's objects as one tree: a skeleton with every tensor replaced by its index, and the tensors.

`flatten` walks each object's `state_dict()` (or takes a tensor as it is); `rebuild` puts tensors back
into a skeleton; `tensor_paths` names where each tensor sits, so a receiver can find its own tensor
at the same place and receive into it. `digest` summarizes a tree for "do two members hold the same
state?": a cheap fingerprint per tensor, computed on the tensor's own device (`fingerprint`), not a
cryptographic hash. It decides only whether to skip a transfer.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

TENSOR = "\x00ftcoord:tensor"  # a tensor's place in a skeleton: (TENSOR, index)
_ROW_WORDS = 1024


@dataclass
class StateTree:
    """A member's objects as one skeleton (tensors replaced by their index) and the tensors in order."""

    skeleton: dict[str, Any]
    tensors: list[torch.Tensor] = field(default_factory=list)
    paths: list[tuple[Any, ...]] = field(default_factory=list)

    def meta(self) -> list[tuple[str, tuple[int, ...], str]]:
        """Each tensor's (dtype name without "torch.", shape, device type), in order."""
        return [(str(t.dtype).removeprefix("torch."), tuple(t.shape), t.device.type) for t in self.tensors]


def flatten(objects: Mapping[str, Any]) -> StateTree:
    """The objects' state dicts (names in sorted order) as one tree; tensors are detached, not copied."""
    flat = StateTree({})

    def strip(value: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            flat.tensors.append(value.detach())
            flat.paths.append(path)
            return (TENSOR, len(flat.tensors) - 1)
        if isinstance(value, dict):
            out = type(value)() if type(value) in (dict, OrderedDict) else {}
            for key, item in value.items():
                out[key] = strip(item, (*path, key))
            metadata = getattr(value, "_metadata", None)  # nn.Module's state_dict versions
            if metadata is not None:
                out._metadata = metadata  # type: ignore[attr-defined]
            return out
        if isinstance(value, (list, tuple)):
            items = [strip(item, (*path, i)) for i, item in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return value

    for name in sorted(objects):
        obj = objects[name]
        flat.skeleton[name] = strip(obj if isinstance(obj, torch.Tensor) else obj.state_dict(), (name,))
    return flat


def rebuild(value: Any, tensors: list[torch.Tensor]) -> Any:
    """A skeleton with its tensor places filled from `tensors` (containers are new, tensors are not)."""
    if isinstance(value, tuple) and len(value) == 2 and value[0] == TENSOR:
        return tensors[value[1]]
    if isinstance(value, dict):
        out = type(value)()
        for key, item in value.items():
            out[key] = rebuild(item, tensors)
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:
            out._metadata = metadata
        return out
    if isinstance(value, (list, tuple)):
        items = [rebuild(item, tensors) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def check_objects(objects: Mapping[str, Any]) -> None:
    """Every value is a tensor or has state_dict() and load_state_dict() (a TypeError naming it otherwise)."""
    for name, obj in objects.items():
        if not isinstance(name, str):
            raise TypeError(f"call.heal: object names must be strings, got {name!r}")
        if isinstance(obj, torch.Tensor):
            continue
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise TypeError(f"call.heal: {name!r} is a {type(obj).__name__}, which has no state_dict() and "
                            f"load_state_dict(); pass a module, optimizer, scheduler, tensor or any object with both")


# -- digests --------------------------------------------------------------------------------------

def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as a 1-D uint8 tensor (a view, no copy, when it can be)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def fingerprint(tensor: torch.Tensor) -> bytes:
    """Row and column sums of the tensor's 64-bit words, on its own device, hashed.

    The tensor's bytes are read as 64-bit words laid out in rows of 1024; the row sums and the column sums
    (mod 2^64) are computed where the tensor lives and only they are hashed, so a CUDA tensor is not copied
    to the host whole. Any difference confined to one row or one column changes the fingerprint; only a
    difference that cancels in every row and every column at once goes unseen. Equal steps with different
    state are rare (fresh weights from different seeds, a warm start), and the digest decides only whether
    to skip a transfer, so that is enough.
    """
    data = as_bytes(tensor.detach())
    words = data.numel() // 8
    rows = words // _ROW_WORDS
    h = hashlib.blake2b(digest_size=16)
    if rows:
        grid = data[: rows * _ROW_WORDS * 8]
        if grid.storage_offset() % 8:  # a view at an odd offset cannot be read as int64 in place
            grid = grid.clone()
        grid = grid.view(torch.int64).view(rows, _ROW_WORDS)
        h.update(grid.sum(dim=1).cpu().numpy().tobytes())
        h.update(grid.sum(dim=0).cpu().numpy().tobytes())
    h.update(data[rows * _ROW_WORDS * 8:].cpu().numpy().tobytes())
    return h.digest()


def digest(flat: StateTree) -> str:
    """A hash of the tree's skeleton, its tensors' dtypes, shapes and devices, and their fingerprints."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(flat.skeleton).encode())
    for meta, tensor in zip(flat.meta(), flat.tensors, strict=True):
        h.update(repr(meta).encode())
        h.update(fingerprint(tensor))
    return h.hexdigest()


def tensor_paths(skeleton: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The path of every tensor in a skeleton, by index (the same walk `flatten` makes)."""
    found: dict[int, tuple[Any, ...]] = {}

    def walk(value: Any, path: tuple[Any, ...]) -> None:
        if isinstance(value, tuple) and len(value) == 2 and value[0] == TENSOR:
            found[value[1]] = path
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, (*path, key))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, (*path, i))

    for name, state in skeleton.items():
        walk(state, (name,))
    return [found[i] for i in range(len(found))]
