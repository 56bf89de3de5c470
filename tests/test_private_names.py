"""No module of the package reaches into another's private names: what two
modules share is a public attribute or a small object of its own. Read from
the source (best effort: the attribute rule knows a name, not a type)."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "keras_memwatch"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _modules() -> dict[pathlib.Path, ast.Module]:
    return {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def _defined(tree: ast.Module) -> set[str]:
    """The private names a module gives its own objects: its functions,
    classes and methods, `self._x = ...` and `__slots__` entries."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            names.add(node.attr)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names.update(c.value for c in ast.walk(node.value)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return {name for name in names if _private(name)}


def test_no_module_imports_a_private_name_of_another():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: "
        f"from {node.module or '.'} import {alias.name}"
        for path, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.level or (node.module or "").startswith("keras_memwatch"))
        for alias in node.names if _private(alias.name)]
    assert found == []


def test_no_module_reads_a_private_attribute_another_module_defines():
    modules = _modules()
    defined = {path: _defined(tree) for path, tree in modules.items()}
    found = []
    for path, tree in modules.items():
        elsewhere = set().union(*(names for other, names in defined.items()
                                  if other != path)) - defined[path]
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in elsewhere
                    and not (isinstance(node.value, ast.Name)
                             and node.value.id in ("self", "cls"))):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: "
                             f"{ast.unparse(node)}")
    assert found == []


def test_only_the_callback_touches_the_watchs_private_attributes():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}"
        for path, tree in _modules().items() if path.name != "callback.py"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and _private(node.attr)
        and isinstance(node.value, ast.Name) and node.value.id == "watch"]
    assert found == []
