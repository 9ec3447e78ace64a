"""`pip install ftcoord` is a library install: the coordination layer's own dependencies, nothing of chaos's."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
IMPORT_NAMES = {"prometheus-client": "prometheus_client"}  # distribution -> module, where they differ
THROUGH_TORCH = {"numpy"}  # needed at run time by Tensor.numpy(), which ftcoord calls; never imported by name

pytestmark = pytest.mark.timeout(120)


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def _third_party_imports(package: str) -> set[str]:
    """Top-level modules that `package` imports anywhere (functions included) and that are neither ours nor stdlib."""
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("ftcoord", "training", "chaos")}


def test_the_core_dependencies_are_exactly_what_ftcoord_imports() -> None:
    core = {IMPORT_NAMES.get(name, name) for name in _names(PROJECT["dependencies"])}
    assert core == _third_party_imports("ftcoord") | THROUGH_TORCH, "pyproject's dependencies and ftcoord's differ"
    assert not core & {"matplotlib", "torchvision", "gevent", "pytest"}


def test_the_extras_cover_what_training_and_chaos_import() -> None:
    extras = PROJECT["optional-dependencies"]
    training = _names(extras["training"]) | _names(PROJECT["dependencies"])
    assert _third_party_imports("training") <= training, sorted(_third_party_imports("training") - training)
    chaos = training | _names(extras["chaos"]) | _names(extras["scale"])
    assert _third_party_imports("chaos") <= chaos, sorted(_third_party_imports("chaos") - chaos)
    assert "ftcoord[chaos,scale]" in extras["dev"], "make setup installs the dev extra: it must bring the others"


def test_ftcoord_runs_without_the_extras() -> None:
    """Every ftcoord module imports, and the heal's fingerprint of a tensor is taken, with matplotlib, torchvision and
    gevent
    made unimportable, as in an environment that installed no extra."""
    code = (
        "import sys, importlib, pkgutil\n"
        "for name in ('matplotlib', 'torchvision', 'gevent'):\n"
        "    sys.modules[name] = None\n"
        "import torch\n"
        "import ftcoord\n"
        "from ftcoord import CallWrapper, Wrapper\n"
        "for info in pkgutil.walk_packages(ftcoord.__path__, 'ftcoord.'):\n"
        "    importlib.import_module(info.name)\n"
        "from ftcoord.wrapper.state_tree import fingerprint\n"
        "fingerprint(torch.zeros(3000))\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
