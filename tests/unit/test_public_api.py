"""The public surface stays small, consistent and documented.

`ftcoord.__all__`, the lazy map and the type-checking imports name the same things; every public class, function
and public method says what each parameter is (an `Args:` section, or a field docstring for a dataclass field).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

import ftcoord

ROOT = Path(__file__).resolve().parents[2]

# Beyond `ftcoord.__all__`: what a user's own loop or an operator's script calls.
EXTRA_PUBLIC = {
    "ftcoord.sampler": ["ElasticBatchSampler"],
    "ftcoord.observe.job_view": ["JobReader", "JobView", "SlotView"],
}


def _type_checking_imports() -> dict[str, str]:
    tree = ast.parse((ROOT / "ftcoord" / "__init__.py").read_text())
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module, ast.dump(stmt)
                for alias in stmt.names:
                    names[alias.asname or alias.name] = stmt.module
    return names


def test_all_the_lazy_map_and_the_type_checking_imports_agree() -> None:
    lazy = ftcoord._WHERE
    assert sorted(ftcoord.__all__) == sorted(lazy), "__all__ and the lazy map differ"
    assert _type_checking_imports() == lazy, "the TYPE_CHECKING imports and the lazy map differ"
    for name, module in lazy.items():
        value = getattr(ftcoord, name)
        assert value is getattr(importlib.import_module(module), name), name
        assert getattr(value, "__module__", module) == module, f"{name} is defined in {value.__module__}, not {module}"


def test_a_name_not_exported_is_a_clear_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        ftcoord.nothing_here  # noqa: B018


def _documented(doc: str | None) -> set[str]:
    """Parameter names under an `Args:` (or `Attributes:`) section of a Google-style docstring."""
    names: set[str] = set()
    section = False
    for line in inspect.cleandoc(doc or "").splitlines():
        if re.fullmatch(r"(Args|Arguments|Attributes|Keyword Args):", line.strip()):
            section, indent = True, None
            continue
        if section:
            if not line.strip():
                continue
            if not line.startswith(" "):
                section = False
                continue
            match = re.match(r"(\s+)\*{0,2}(\w+)(\s*\(.*?\))?:", line)
            if match and (indent is None or len(match.group(1)) == indent):
                indent = len(match.group(1))
                names.add(match.group(2))
    return names


def _field_docstrings(cls: type) -> set[str]:
    """Dataclass fields followed by a docstring in the class body."""
    source = inspect.getsource(cls)
    body = ast.parse(source.lstrip() if source.startswith(" ") else source).body[0]
    names: set[str] = set()
    statements = getattr(body, "body", [])
    for stmt, after in zip(statements, statements[1:], strict=False):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            value = after.value if isinstance(after, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                names.add(stmt.target.id)
    return names


def _parameters(function: object) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p not in ("self", "cls")]


def _public() -> list[tuple[str, object]]:
    found = [(name, getattr(ftcoord, name)) for name in ftcoord.__all__]
    for module, names in EXTRA_PUBLIC.items():
        found += [(f"{module}.{name}", getattr(importlib.import_module(module), name)) for name in names]
    return found


def _problems() -> list[str]:
    problems: list[str] = []
    for name, value in _public():
        if not (value.__doc__ or "").strip():
            problems.append(f"{name}: no docstring")
            continue
        if inspect.isclass(value) and issubclass(value, BaseException):
            continue
        if inspect.isclass(value):
            init = value.__dict__.get("__init__")
            documented = _documented(value.__doc__) | _documented(getattr(init, "__doc__", None))
            if dataclasses.is_dataclass(value):
                documented |= _field_docstrings(value)
            missing = [p for p in _parameters(value) if p not in documented]
            if missing:
                problems.append(f"{name}: parameters without an Args: line: {missing}")
            for method_name, method in vars(value).items():
                if method_name.startswith("_") or not callable(method):
                    continue
                if not (method.__doc__ or "").strip():
                    problems.append(f"{name}.{method_name}: no docstring")
                    continue
                missing = [p for p in _parameters(method) if p not in _documented(method.__doc__)]
                if missing:
                    problems.append(f"{name}.{method_name}: parameters without an Args: line: {missing}")
        elif callable(value):
            missing = [p for p in _parameters(value) if p not in _documented(value.__doc__)]
            if missing:
                problems.append(f"{name}: parameters without an Args: line: {missing}")
    return problems


def test_every_public_parameter_is_documented() -> None:
    assert _problems() == []


def test_the_documentation_check_sees_a_missing_args_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a public function whose docstring lost its Args: section is named."""

    def undocumented(store: object, job_id: str) -> None:
        """Scope a store to one job."""

    monkeypatch.setitem(ftcoord._WHERE, "job_store", "tests.unit.test_public_api")
    monkeypatch.setattr(ftcoord, "job_store", undocumented, raising=False)
    assert "job_store: parameters without an Args: line: ['store', 'job_id']" in _problems()


def test_every_console_script_names_a_callable_entry_point() -> None:
    """`ftcoord`, `ftcoord-store`, `ftcoord-launch` and `chaos` still point at a function after the moves."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"ftcoord", "ftcoord-store", "ftcoord-launch", "chaos"}
    for name, target in scripts.items():
        module, _, attribute = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attribute)), f"{name} = {target}"


def test_the_api_page_is_what_the_docstrings_say_now() -> None:
    """docs/api.md is generated from the docstrings (scripts/api-doc): a change to the public API or its
    documentation without the page regenerated fails here, with the command to run."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "api-doc")], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (ROOT / "docs" / "api.md").read_text(), \
        "docs/api.md is stale: run `.venv/bin/python scripts/api-doc > docs/api.md`"
