"""The documentation keeps up with the code: every public name has a docstring (the API page is
generated from them), and the command-line page covers every command and option of the parser.

The site itself is built by CI (`mkdocs build --strict`); these checks need no mkdocs.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import re
import types
from pathlib import Path

import pytest

import ansor
import ansor.graph
import ansor.te
import ansor.te.ops
from ansor.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _hooks():
    """docs/_hooks/generated.py, the mkdocs hook that writes the generated parts of the pages."""
    spec = importlib.util.spec_from_file_location("ansor_docs_hooks", DOCS / "_hooks" / "generated.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _undocumented(module: types.ModuleType, names) -> list[str]:
    missing = []
    for name in names:
        obj = getattr(module, name)
        if not isinstance(obj, (type, types.ModuleType)) and not callable(obj):
            continue  # data (a version string, a table): documented beside its assignment
        if not (getattr(obj, "__doc__", None) or "").strip():  # a class's own, never inherited
            missing.append(f"{module.__name__}.{name}")
    return missing


def _attribute_docstring(path: Path, name: str) -> str:
    """The string literal right after `name = ...` at module level (how the API page documents
    a module attribute)."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    for stmt, after in zip(body, body[1:]):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                return str(after.value.value)
    return ""


def test_every_public_name_of_ansor_has_a_docstring():
    assert "__version__" in ansor.__all__
    assert _attribute_docstring(Path(ansor.__file__), "__version__").strip()
    assert _undocumented(ansor, [n for n in ansor.__all__ if n != "__version__"]) == []


def test_every_public_name_of_te_has_a_docstring():
    assert ansor.te.__doc__.strip()
    assert _undocumented(ansor.te, ansor.te.__all__) == []
    assert _undocumented(ansor.te.ops, ansor.te.ops.__all__) == []


def test_te_exports_its_public_names():
    """A function or class added to `ansor.te` without `__all__` would escape the docstring
    check and the API page; submodules imported along the way are not public names."""
    public = {n for n, v in vars(ansor.te).items()
              if not n.startswith("_") and not (inspect.ismodule(v) and n not in ansor.te.__all__)}
    assert public == set(ansor.te.__all__)
    for math_name in ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "pow",
                      "maximum", "minimum", "sum", "max", "min", "cast", "const", "if_then_else"):
        assert math_name in ansor.te.__all__


def test_graph_public_functions_have_docstrings():
    assert _undocumented(ansor.graph, ansor.graph.__all__) == []


def test_the_docstring_check_finds_a_missing_docstring(monkeypatch):
    monkeypatch.setattr(ansor.te.exp, "__doc__", None)
    assert _undocumented(ansor.te, ansor.te.__all__) == ["ansor.te.exp"]


def test_api_page_documents_every_public_name():
    page = (DOCS / "api.md").read_text(encoding="utf-8")
    for name in ansor.__all__:
        assert f"`ansor.{name}`" in page, f"api.md: no row for ansor.{name}"
    for name in ansor.te.__all__:
        if name != "ops":
            assert f"::: ansor.te.{name}\n" in page, f"api.md: ansor.te.{name} is not rendered"
    for name in ansor.graph.__all__:
        if callable(getattr(ansor.graph, name)):
            assert f"::: ansor.graph.{name}\n" in page, f"api.md: ansor.graph.{name} is not rendered"


# ------------------------------------------------------------------------------ command line

def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every subcommand, nested ones as "costmodel eval", with its parser."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[prefix + name] = sub
                found.update(_commands(sub, f"{prefix}{name} "))
    return found


def _section(page: str, command: str) -> str:
    """The part of the page under the heading `ansor COMMAND`, up to the next heading."""
    match = re.search(rf"^#+ ansor {re.escape(command)}\n(.*?)(?=^#+ |\Z)", page, re.M | re.S)
    assert match, f"cli.md: no heading 'ansor {command}'"
    return match.group(1)


def test_cli_page_names_every_subcommand():
    commands = _commands(build_parser())
    assert {"tune", "show", "workloads", "export", "import", "costmodel eval"} <= set(commands)
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    for command in commands:
        _section(page, command)
        assert f"<!-- ansor-cli: {command} -->" in page


def test_cli_page_lists_every_option_of_every_subcommand():
    page = _hooks().render_cli_page((DOCS / "cli.md").read_text(encoding="utf-8"))
    for command, parser in _commands(build_parser()).items():
        section = _section(page, command)
        assert f"usage: ansor {command}" in section
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                names = list(action.choices)  # a command's own subcommands
            else:
                names = action.option_strings or [action.metavar or action.dest]
            for name in names:
                assert f"`{name}" in section, f"cli.md, ansor {command}: {name} is not listed"
    assert "`--version`" in page


def test_cli_page_refuses_to_drift():
    hooks = _hooks()
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="ansor sample"):
        hooks.render_cli_page(page.replace("<!-- ansor-cli: sample -->", ""))
    with pytest.raises(ValueError, match="not an ansor command"):
        hooks.render_cli_page(page + "\n<!-- ansor-cli: no-such-command -->\n")


def test_tutorials_page_lists_every_example():
    page = _hooks().render_examples_page((DOCS / "tutorials.md").read_text(encoding="utf-8"), ROOT)
    examples = sorted((ROOT / "examples").glob("*.py"))
    for path in examples:
        assert f"`examples/{path.name}`" in page


def test_docs_pages_are_in_the_navigation():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in DOCS.glob("*.md"):
        assert f": {page.name}" in config, f"mkdocs.yml: {page.name} is not in nav"
