"""Run a script as `python SCRIPT ARGS` would, in a process forked by tests/helpers/forker.py (torch already
imported: the process is training within a fraction of a second).

    main([SCRIPT, *ARGS]) -> the script's exit code
"""

from __future__ import annotations

import runpy
import sys


def main(argv: list[str]) -> int:
    sys.argv = list(argv)
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0
