"""A helper process (a checkpoint writer, a store server) runs the code of the process that starts it.

`python -m module` puts the working directory first on the module path: a rank started with `-P` (it found its
packages on PYTHONPATH or installed, as `chaos run` starts them, chaos.own_code) that started its helpers with a plain
`-m` from a directory holding another checkout ran that checkout's writer beside its own trainer. A helper is started
with this interpreter's path options: `-I` when this process runs isolated, `-P` when it runs without the working
directory on its path, neither otherwise (then both find the same packages anyway).
"""

from __future__ import annotations

import sys


def path_options() -> list[str]:
    """This interpreter's options that decide where a child finds its modules."""
    if sys.flags.isolated:
        return ["-I"]
    return ["-P"] if sys.flags.safe_path else []


def module_command(module: str, *args: str) -> list[str]:
    """`python [-I | -P] -m module args`: a child that imports what this process imports."""
    return [sys.executable, *path_options(), "-m", module, *args]
