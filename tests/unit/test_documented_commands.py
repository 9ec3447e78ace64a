"""The commands the README and the SLURM example show are commands the tools accept, and the README's Python teaches
no name the API lacks."""

from __future__ import annotations

import ast
import inspect
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from ftcoord import CallWrapper, Wrapper
from ftcoord.launcher.main import parse_config
from ftcoord.observe.cli import build_parser as ftcoord_parser
from ftcoord.sampler import ElasticBatchSampler
from ftcoord.store.main import build_parser as store_parser

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"
PLACEHOLDERS = {"STORE_HOST:29600": "127.0.0.1:29600", "STORE_HOST": "127.0.0.1", "P": "2", "N": "2", "i": "0",
                "DIR": "runs/x", "E": "3"}


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def _commands() -> list[list[str]]:
    """Every command line of the README's bash blocks (continuations joined, comments and prompts dropped)."""
    found = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                found.append([PLACEHOLDERS.get(w, w) for w in shlex.split(line, comments=True)])
    return found


def _tool(word: str) -> str:
    return word.rsplit("/", 1)[-1]


@pytest.fixture
def in_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The README's commands run from the checkout: a train.py there for the multi-node example."""
    monkeypatch.chdir(ROOT)
    for name in ("FTCOORD_STORE", "FTCOORD_JOB_ID", "SLURM_JOB_ID", "SLURM_NODEID"):
        monkeypatch.delenv(name, raising=False)
    return ROOT


def test_every_readme_command_is_accepted_by_its_tool(in_checkout: Path, tmp_path: Path) -> None:
    import chaos.cli

    seen = set()
    for words in _commands():
        tool, argv = _tool(words[0]), words[1:]
        seen.add(tool)
        if tool == "pip":
            extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
            assert argv[0] == "install" and argv[1].split("[")[0] == ".", words
            wanted = re.findall(r"\[(.*)\]", argv[1])
            assert all(e in extras for w in wanted for e in w.split(",")), words
        elif tool == "make":
            targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
            assert set(argv) <= set(targets), argv
        elif tool == "ftcoord-launch":
            argv = [str(tmp_path / "train.py") if w == "train.py" else w for w in argv]
            (tmp_path / "train.py").write_text("")
            config, _ = parse_config(argv)
            assert config.nproc == 2, words
        elif tool == "ftcoord-store":
            store_parser().parse_args(argv)
        elif tool == "ftcoord":
            ftcoord_parser().parse_args(argv)
        elif tool == "chaos":
            if argv[:1] == ["run"]:
                assert argv[1] in chaos.cli.bundled_names(), argv
            chaos.cli.build_parser().parse_args(argv)
        else:
            pytest.fail(f"a README command this test does not know how to check: {' '.join(words)}")
    assert {"pip", "make", "ftcoord-launch", "ftcoord-store", "ftcoord", "chaos"} <= seen, seen


def test_the_readme_python_uses_only_what_the_api_has() -> None:
    """Every `call.X` is a CallWrapper attribute, every Wrapper(...) keyword a parameter, every `sampler.X` an
    ElasticBatchSampler attribute; and the snippet assigns no name inside the function that it also reads before
    (the UnboundLocalError an older snippet taught)."""
    (diff,) = _blocks("diff")
    code = "\n".join(line[1:] for line in diff.splitlines() if not line.startswith("-"))  # the script after
    tree = ast.parse(code)
    wrapper_parameters = set(inspect.signature(Wrapper).parameters)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = {"call": CallWrapper, "sampler": ElasticBatchSampler}.get(node.value.id)
            if owner is not None:
                assert node.attr in _attributes(owner), f"{node.value.id}.{node.attr} does not exist"
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Wrapper":
            assert {k.arg for k in node.keywords} <= wrapper_parameters, ast.dump(node)
    (train,) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    both = _assigned(ast.walk(train)) & _assigned(tree.body)
    assert not both, f"assigned in the function, and read from outside it: {both}"


def _attributes(cls: type) -> set[str]:
    """A class's attributes and those its __init__ sets on the instance."""
    init = ast.parse(inspect.getsource(cls.__init__).strip())
    own = {n.attr for n in ast.walk(init) if isinstance(n, ast.Attribute) and getattr(n.value, "id", None) == "self"}
    return set(dir(cls)) | own


def _assigned(nodes: object) -> set[str]:
    return {t.id for n in nodes if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}


def test_the_sbatch_script_is_bash_and_its_launcher_command_forms_one_job(in_checkout: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """What each node's launcher of examples/slurm/train.sbatch gets from srun: one job, this node's slots."""
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True).returncode == 0
    text = SBATCH.read_text().replace("\\\n", " ")
    commands = [line for line in text.splitlines() if line.lstrip().startswith("srun ")]
    (store_line,) = [line for line in commands if "ftcoord-store" in line]
    store_words = shlex.split(store_line.replace("&", ""))
    fill = {"$STORE_HOST": "node-a", "$PORT": "29600"}
    store_parser().parse_args([fill.get(w, w) for w in store_words[store_words.index("ftcoord-store") + 1:]])
    (launch_line,) = [line for line in commands if "ftcoord-launch" in line]
    words = shlex.split(launch_line.replace("&", ""))
    fill = {"$NPROC_PER_NODE": "4", "logs/$SLURM_JOB_ID": str(tmp_path / "logs")}
    argv = [fill.get(w, w) for w in words[words.index("ftcoord-launch") + 1:]]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    monkeypatch.setenv("FTCOORD_STORE", "node-a:29600")
    for node in (0, 1):
        for name, value in {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2",
                            "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": str(node)}.items():
            monkeypatch.setenv(name, value)
        config, _ = parse_config(argv)
        assert (config.job_id, config.store, config.world_size) == ("4242", "node-a:29600", 8)
        assert config.slots == [4 * node + i for i in range(4)], config.slots
