"""A flat shared-memory image of a state dict: tensors in one buffer, the rest in a skeleton.

Copying tensors into a reused, memory-mapped buffer costs a memcpy and no pickling, which
is what keeps a flash checkpoint's stall small. The skeleton (nested dicts, numbers and
tensor placeholders) is tiny and saved with torch.save / loaded with weights_only=True.
The buffer lives in /dev/shm, so it survives the death of the process that wrote it.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any

import torch

BUFFER = "buffer.bin"
META = "meta.pt"
WRITING = "writing"  # the seq the trainer is copying into the buffer (set before the copy starts)
REQUEST = "request"  # the seq the trainer asks the persister to write to disk (set after the copy)
PERSISTED = "persisted"  # the seq the persister is done with: committed to disk, or refused (FAILED)
FAILED = "failed.json"  # {"seq", "path", "errno", "error", "free_bytes"} of the last seq that failed
PERSISTER_LOCK = "persister.lock"  # held (flock) by the one persister of this image for its lifetime
PERSISTER_PID = "persister.pid"
FILES = (BUFFER, META, WRITING, REQUEST, PERSISTED, FAILED, PERSISTER_LOCK, PERSISTER_PID, "persister.err")
ALIGN = 64


def flatten(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """Replace every tensor by {"__tensor__": index}, collecting them in order."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return {"__tensor__": len(tensors) - 1}
    if isinstance(obj, dict):
        return {k: flatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [flatten(v, tensors) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def unflatten(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        return {k: unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unflatten(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(unflatten(v, tensors) for v in obj)
    return obj


def layout_of(tensors: list[torch.Tensor]) -> tuple[list[dict[str, Any]], int]:
    """Offsets of each tensor's bytes in the buffer (aligned), and the total size."""
    layout, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        layout.append({"offset": offset, "nbytes": nbytes, "dtype": str(t.dtype).removeprefix("torch."),
                       "shape": list(t.shape)})
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    return layout, offset


class SharedBuffer:
    """A memory-mapped file in a shm directory, grown when the state grows, else reused."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / BUFFER
        self._mmap: mmap.mmap | None = None
        self._size = 0

    def view(self, size: int) -> torch.Tensor:
        """A uint8 tensor over the first `size` bytes (no copy)."""
        if self._mmap is None or self._size < size:
            self.close()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size < size:
                    os.ftruncate(fd, size)
                self._size = max(size, os.fstat(fd).st_size)
                self._mmap = mmap.mmap(fd, self._size)
            finally:
                os.close(fd)
        if not size:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(self._mmap, dtype=torch.uint8, count=size)

    def close(self) -> None:
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:  # a tensor still views it; the OS unmaps at exit
                pass
            self._mmap = None


class PinnedStaging:
    """A page-locked host buffer between a GPU's tensors and the image, reused from save to save (grown when the
    state grows): every device tensor is copied into it by DMA, at the copy engine's speed, with one wait at the end;
    then into the image by memcpy. A copy from a GPU straight into the image's pageable memory is several times
    slower and waits at each tensor. It costs host memory exactly as large as the state on the GPU, kept for the
    process's life (registered with cudaHostRegister, as torch's own checkpoint stager does: torch's pinned-memory
    cache would round it up to a power of two and keep the old one when it grows); taken at the first save of a state
    that holds device tensors, never for a state on the CPU."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None

    def view(self, size: int) -> torch.Tensor:
        """A uint8 tensor over the first `size` bytes of the buffer (grown, and registered anew, when smaller).

        Raises:
            RuntimeError: CUDA refused to register the memory (its error code is in the message).
        """
        if self._buffer is None or self._buffer.numel() < size:
            self.close()
            buffer = torch.empty(size, dtype=torch.uint8)
            code = int(torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), size, 0))
            if code != 0:
                raise RuntimeError(f"flash checkpoint: CUDA could not page-lock {size} bytes of host memory for the "
                                   f"staging buffer (cudaError {code}); the host may be short of lockable memory "
                                   f"(ulimit -l), or use --ckpt-strategy blocking")
            self._buffer = buffer
        return self._buffer[:size]

    def close(self) -> None:
        """Unregister and drop the buffer (the next view makes a new one)."""
        if self._buffer is not None:
            torch.cuda.cudart().cudaHostUnregister(self._buffer.data_ptr())
            self._buffer = None


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def write_image(buffer: SharedBuffer, tensors: list[torch.Tensor], layout: list[dict[str, Any]], total: int,
                staging: PinnedStaging | None = None) -> None:
    """Copy `tensors` into the image at `layout`'s offsets; a GPU's tensors through `staging`.

    Raises:
        ValueError: a tensor on a GPU and no staging buffer given.
    """
    flat = buffer.view(total)
    on_device = [(tensor, place) for tensor, place in zip(tensors, layout, strict=True)
                 if place["nbytes"] and tensor.device.type != "cpu"]
    if on_device:
        if staging is None:
            raise ValueError("write_image: the state holds tensors on a GPU; give it a PinnedStaging to copy them "
                             "through")
        stage = staging.view(total)
        for tensor, place in on_device:
            stage[place["offset"] : place["offset"] + place["nbytes"]].copy_(_as_bytes(tensor), non_blocking=True)
        torch.cuda.synchronize()  # every copy landed before the image is read from the stage
    for tensor, place in zip(tensors, layout, strict=True):
        if place["nbytes"]:
            window = slice(place["offset"], place["offset"] + place["nbytes"])
            flat[window].copy_(stage[window] if tensor.device.type != "cpu" else _as_bytes(tensor))


def read_image(directory: Path, copy: bool = True) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(meta, payload) from a shm directory, or None when there is no complete image.

    copy=False returns tensors that view a private mapping of the image: fine for reading
    it once (the persister), but a later save into the same image would show through the
    pages not written yet, so anything that keeps the tensors must copy (the default).
    """
    meta_path, buffer_path = directory / META, directory / BUFFER
    if not meta_path.is_file() or not buffer_path.is_file():
        return None
    if meta_path.stat().st_uid != os.getuid() or buffer_path.stat().st_uid != os.getuid():
        return None
    meta = torch.load(meta_path, weights_only=True)
    if buffer_path.stat().st_size < meta["total"]:
        return None
    if meta["total"]:
        # Zero-copy: tensors view a copy-on-write mapping of the image (the restore that
        # follows copies them into the model once; the image itself is never modified).
        with open(buffer_path, "rb") as f:
            mapping = mmap.mmap(f.fileno(), meta["total"], access=mmap.ACCESS_COPY)
        flat = torch.frombuffer(mapping, dtype=torch.uint8)
    else:
        flat = torch.empty(0, dtype=torch.uint8)
    # torch.save refuses views of one storage as different dtypes: without a copy, only the
    # dtype holding most bytes stays a view (the parameters); the rest (BatchNorm counters) is tiny.
    bytes_by_dtype: dict[str, int] = {}
    for place in meta["layout"]:
        bytes_by_dtype[place["dtype"]] = bytes_by_dtype.get(place["dtype"], 0) + place["nbytes"]
    viewed = max(bytes_by_dtype, key=bytes_by_dtype.__getitem__) if bytes_by_dtype and not copy else None
    tensors = []
    for place in meta["layout"]:
        dtype = getattr(torch, place["dtype"])
        chunk = flat[place["offset"] : place["offset"] + place["nbytes"]]
        if place["nbytes"]:
            tensor = chunk.view(dtype).reshape(place["shape"])
        else:
            tensor = torch.empty(place["shape"], dtype=dtype)
        tensors.append(tensor if place["dtype"] == viewed else tensor.clone())
    return meta, unflatten(meta["skeleton"], tensors)


def write_marker(directory: Path, name: str, value: int) -> None:
    temp = directory / f"{name}.tmp"
    temp.write_text(str(value))
    os.replace(temp, directory / name)


def read_marker(directory: Path, name: str) -> int:
    try:
        return int((directory / name).read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def write_failure(directory: Path, seq: int, facts: dict[str, Any]) -> None:
    temp = directory / f"{FAILED}.tmp"
    temp.write_text(json.dumps({"seq": seq, **facts}))
    os.replace(temp, directory / FAILED)


def read_failure(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / FAILED).read_text())
    except (FileNotFoundError, ValueError):
        return None


def remove_image(directory: Path) -> None:
    """Remove an image directory's files (then the directory, if nothing else is left in it)."""
    for name in FILES:
        (directory / name).unlink(missing_ok=True)
    for user in directory.glob("user-*.json"):
        user.unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError:
        pass
