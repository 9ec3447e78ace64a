"""Another checkout in a directory: the modules named, each of which says so and fails when run or imported.

A process that should run this checkout's code (chaos.own_code, ftcoord.host.interpreter, chaos.run.launchers) is
started in or
beside such a directory: if it ran the decoy instead, it fails with that message.
"""

from __future__ import annotations

from pathlib import Path


def decoy_checkout(root: Path, *modules: str) -> Path:
    """`root` holding `modules` (dotted names, their packages made too), each `raise SystemExit(...)`; `root`."""
    for module in modules:
        *packages, name = module.split(".")
        directory = root
        for package in packages:
            directory = directory / package
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "__init__.py").touch()
        (directory / f"{name}.py").write_text(f"raise SystemExit('the other checkout\\'s {module} ran')\n")
    return root
