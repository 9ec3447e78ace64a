"""`chaos bench --only device`: what ftcoord costs on a GPU: @Wrapper's step-time overhead over bare DDP on NCCL, and
what a flash checkpoint of GPU tensors stalls training for, beside the copy speeds between the GPU and its host.

The overhead: chaos.bench.suite.bench_overhead's probe (a 3-layer MLP, each step timed to its kernels' end), with
one rank per GPU, at most 2, bare DDP and the same loop under @Wrapper alternating which goes first.

Side by side, each repetition in turn: the host-device copy bandwidth of one buffer as large as the state (GPU to
pageable memory, GPU to pinned memory, pinned memory to the GPU), and the flash checkpoint's copy of the state, the
part of its stall that grows with the state (`training.checkpoint.shm.write_image`: the GPU's tensors into the
reused pinned staging buffer, one wait, then into the shared-memory image), per GiB; the same copy of the same state
held on the CPU beside it. The first flash copy, which allocates and pins the staging buffer, is reported apart.
Medians with min-max. Needs a CUDA GPU: without one it says so and exits 2.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from chaos.bench.recovery import summary
from training.checkpoint import shm

GIB = 1 << 30
TENSOR_MIB = 16
"""The state is made of tensors of this size (a model's are many and of many sizes; one big copy would flatter it)."""


def _timed(action: Callable[[], None]) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    action()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def bench_device(state_mib: int, reps: int) -> dict[str, Any]:
    """The figures (module docstring) for a state of `state_mib` MiB on cuda:0."""
    device = torch.device("cuda", 0)
    count = max(1, state_mib // TENSOR_MIB)
    on_gpu = [torch.randn(TENSOR_MIB << 18, device=device) for _ in range(count)]  # float32: 4 bytes each
    on_cpu = [t.cpu() for t in on_gpu]
    nbytes = sum(t.numel() * t.element_size() for t in on_gpu)
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    layout, total = shm.layout_of(on_gpu)
    staging = shm.PinnedStaging()
    samples: dict[str, list[float]] = {k: [] for k in ("d2h_pageable", "d2h_pinned", "h2d_pinned",
                                                        "flash_gpu", "flash_cpu")}
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as directory:
        buffer = shm.SharedBuffer(Path(directory))
        try:
            first = _timed(lambda: shm.write_image(buffer, on_gpu, layout, total, staging))
            for _ in range(reps):
                samples["d2h_pageable"].append(_timed(lambda: pageable.copy_(flat)))
                samples["d2h_pinned"].append(_timed(lambda: pinned.copy_(flat, non_blocking=True)))
                samples["h2d_pinned"].append(_timed(lambda: flat.copy_(pinned, non_blocking=True)))
                samples["flash_gpu"].append(_timed(lambda: shm.write_image(buffer, on_gpu, layout, total, staging)))
                samples["flash_cpu"].append(_timed(lambda: shm.write_image(buffer, on_cpu, layout, total)))
            image = buffer.view(total)
            first_tensor = image[: layout[0]["nbytes"]].view(torch.float32)
            faithful = torch.equal(first_tensor, on_cpu[0])  # the image holds the GPU's bytes
        finally:
            buffer.close()
    gib = nbytes / GIB
    bandwidth = {k: summary([gib / s for s in samples[k]], 2) for k in ("d2h_pageable", "d2h_pinned", "h2d_pinned")}
    per_gib = {k: summary([s / gib for s in samples[k]], 4) for k in ("flash_gpu", "flash_cpu")}
    return {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "state_bytes": nbytes,
            "tensors": count, "reps": reps, "bandwidth_gib_s": bandwidth, "flash_copy_s_per_gib": per_gib,
            "flash_first_copy_s": round(first, 4), "image_faithful": faithful}


def markdown(results: dict[str, Any]) -> str:
    b, f = results["bandwidth_gib_s"], results["flash_copy_s_per_gib"]

    def cell(s: dict[str, Any]) -> str:
        return f"{s['median']} ({s['min']}-{s['max']})"

    return "\n".join([
        f"# Device bench: {results['gpu']}, state {results['state_bytes'] / GIB:.2f} GiB in {results['tensors']} "
        f"tensors, {results['reps']} repetitions (median, min-max)", "",
        "| what | figure |", "| --- | --- |",
        f"| GPU → pageable host memory, GiB/s | {cell(b['d2h_pageable'])} |",
        f"| GPU → pinned host memory, GiB/s | {cell(b['d2h_pinned'])} |",
        f"| pinned host memory → GPU, GiB/s | {cell(b['h2d_pinned'])} |",
        f"| flash copy of the state on the GPU (staging, then image), s per GiB | {cell(f['flash_gpu'])} |",
        f"| flash copy of the same state on the CPU, s per GiB | {cell(f['flash_cpu'])} |",
        f"| first flash copy (allocates and pins the staging buffer), s | {results['flash_first_copy_s']} |",
        f"| image holds the GPU's bytes | {results['image_faithful']} |",
        *([f"| step time under @Wrapper / bare DDP, {o['world']} rank(s) on NCCL (ratio of medians; per repetition) "
           f"| {o['ratio_of_medians']} ({cell(o['ratio'])}) |",
           f"| step time, bare DDP / under @Wrapper, ms | {cell(o['bare_step_ms'])} / {cell(o['wrapped_step_ms'])} |"]
          if (o := results.get("overhead")) else []), ""])


def overhead(out: Path, quick: bool) -> dict[str, Any]:
    """@Wrapper over bare DDP on NCCL (module docstring), on a store of its own."""
    from chaos.bench.suite import bench_overhead
    from ftcoord import StoreServer

    server = StoreServer("127.0.0.1", 0)
    try:
        world = min(2, torch.cuda.device_count())
        return {"world": world, **bench_overhead(server.address, out, 3 if quick else 5, 150 if quick else 300,
                                                  device="cuda", world=world)}
    finally:
        server.close()


def run_device_bench(out: Path, quick: bool) -> int:
    """`chaos bench --only device`: writes device.json and device.md; exit 2 without a GPU, 1 when the image did not
    hold the GPU's bytes.

    Args:
        out: the directory the results are written into.
        quick: a 256 MiB state and 3 repetitions, instead of 1 GiB and 5.
    """
    if not torch.cuda.is_available():
        print("chaos bench --only device: this machine has no CUDA device torch can use (it measures a GPU's "
              "copies); run it on a machine with a GPU", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    results = bench_device(256 if quick else 1024, 3 if quick else 5)
    results["overhead"] = overhead(out, quick)
    (out / "device.json").write_text(json.dumps(results, indent=1))
    (out / "device.md").write_text(markdown(results))
    print(markdown(results))
    print(f"wrote {out / 'device.json'}")
    return 0 if results["image_faithful"] else 1
