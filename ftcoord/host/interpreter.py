"""Command lines for helper processes (a checkpoint writer, a store server) that run the code of their parent.

`python -m module` puts the working directory first on the module path, so a helper started with a plain `-m`
from a directory that holds another checkout would run that checkout's code beside its parent's. A helper is
started with this interpreter's path options instead: `-I` when this process runs isolated, `-P` when it runs
without the working directory on its path (as `chaos run` starts ranks: chaos.own_code), neither otherwise
(then both find the same packages anyway).
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
