"""A real full disk for tests: a small tmpfs, mounted for the test and unmounted after."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(path: Path, size_kib: int, leave_free_kib: int | None = None) -> Iterator[Path]:
    """Mount a `size_kib` tmpfs at `path` (optionally filled until `leave_free_kib` is left).

    Skips the test with the reason where this machine cannot mount one (needs root / CAP_SYS_ADMIN).
    """
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a {size_kib} KiB tmpfs to make a full disk here ({mounted.stderr.strip()}); "
                    f"run the tests as root (CI does)")
    try:
        if leave_free_kib is not None:
            filler = path / "filler"
            with open(filler, "wb") as f:
                while os.statvfs(path).f_bavail * os.statvfs(path).f_frsize > leave_free_kib * 1024:
                    try:
                        f.write(b"\0" * 4096)
                        f.flush()
                    except OSError:
                        break
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
