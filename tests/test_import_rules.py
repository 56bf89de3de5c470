"""Data flows one way, and imports with it: each room imports only its own
floor's modules and the floors below. Read from the source, imports inside
functions included."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "keras_memwatch"

#: The floors, from the ground up. A room is a top-level module or folder.
FLOORS: tuple[frozenset[str], ...] = tuple(frozenset(f.split()) for f in (
    # the ground: the vocabulary and small facts every room may use
    "options units columns files call_wrapping oom_errors variables deprecation version",
    "configure",    # memory settings, devices, ranks
    "record",       # probes -> sampler -> blocks -> pipeline, recorder, log
    "judge",        # detector, spikes, drift, XLA plans, derived figures
    "measure",      # a model's steps run apart from fit
    "explain",      # words, pictures, by-layer tables
    "capacity",     # what fits
    "ways",         # ways to fit: each lever measured as capacity measures
    "session",      # one watched call: what joins record and judge per batch
    "callback cycles",  # the Keras callbacks
    "__init__",     # the package's face: its public names
    "cli",          # the command line
    "__main__",     # python -m keras_memwatch
))


def _floor(room: str) -> int:
    for i, rooms in enumerate(FLOORS):
        if room in rooms:
            return i
    raise AssertionError(f"keras_memwatch/{room} is on no floor: add it to FLOORS")


def _room(path: pathlib.Path) -> str:
    first = path.relative_to(PACKAGE).parts[0]
    return first[:-3] if first.endswith(".py") else first


def _is_room(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()


def _imported_rooms(tree: ast.Module) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
            if node.module == "keras_memwatch":  # a room, or a public name
                names = [f"keras_memwatch.{alias.name}" if _is_room(alias.name)
                         else "keras_memwatch.__init__" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "keras_memwatch" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def _violations() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        room = _room(path)
        for line, imported in _imported_rooms(ast.parse(path.read_text())):
            below = _floor(imported) < _floor(room)
            on_the_ground = _floor(imported) == _floor(room) == 0
            if imported != room and not below and not on_the_ground:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line} "
                             f"imports keras_memwatch.{imported}")
    return found


def test_every_room_is_on_a_floor():
    rooms = {_room(p) for p in PACKAGE.rglob("*.py")}
    for room in rooms:
        _floor(room)


def test_no_import_runs_up_or_across_a_floor():
    """The ground's modules may use each other; any other room imports
    only rooms of lower floors."""
    assert _violations() == []


def test_the_rule_sees_an_import_inside_a_function_and_a_public_name():
    tree = ast.parse("from keras_memwatch import MemWatch, options\n"
                     "def f():\n    from keras_memwatch.capacity import search\n")
    assert _imported_rooms(tree) == [(1, "__init__"), (1, "options"), (3, "capacity")]
    assert _floor("capacity") > _floor("explain") > _floor("judge") > _floor("record")
