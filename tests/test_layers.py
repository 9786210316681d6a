"""The layers of ``docs/architecture.md`` hold in the code: every module of ``xbench/`` is in one room
of its table, imports only what its room's row allows (every import statement, also inside
functions), and every row allows only rooms on lower floors, so no import runs back up a floor
and no two rooms import each other. The document cannot drift from the code, nor the code from it."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "xbench"
DOCUMENT = ROOT / "docs" / "architecture.md"


@dataclass(frozen=True)
class Room:
    name: str
    floor: int
    files: tuple[str, ...]  # paths under xbench/: a module, or a folder ending in "/"
    may_import: tuple[str, ...] | None  # None: every room


def rooms() -> dict[str, Room]:
    """The table under ``## Layers``: floor | room | files | may import."""
    section = DOCUMENT.read_text().split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    found = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].isdigit():
            continue
        floor, name, files, allowed = cells
        may_import = None if allowed == "every room" else () if allowed == "nothing" else tuple(
            part.strip() for part in allowed.split(","))
        found[name] = Room(name, int(floor), tuple(re.findall(r"`([^`]+)`", files)), may_import)
    return found


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def room_of(module: str, table: dict[str, Room]) -> str | None:
    """The room whose files hold ``module`` (``xbench.data.base``: ``data/``; ``xbench``: ``__init__.py``)."""
    relative = module.split(".")[1:]
    as_file = "/".join(relative) + ".py" if relative else "__init__.py"
    for room in table.values():
        for entry in room.files:
            if entry == as_file or (entry.endswith("/") and relative[:1] == [entry.rstrip("/")]):
                return room.name
    return None


def imports(module: str, path: Path) -> set[str]:
    """The XBench modules ``module`` imports, anywhere in its file (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
    return {name for name in found if name == "xbench" or name.startswith("xbench.")}


def test_the_table_is_read_and_points_only_down():
    table = rooms()
    assert {"foundation", "geometry", "data", "metrics", "results", "analysis", "models", "reporting",
            "commands"} <= set(table), sorted(table)
    for room in table.values():
        for other in room.may_import or ():
            assert other in table, f"{room.name} may import {other!r}, which is no room of the table"
            assert table[other].floor < room.floor, (
                f"{room.name} (floor {room.floor}) may import {other} (floor {table[other].floor}): a row may "
                "only name rooms on lower floors")
        if room.may_import is None:
            assert room.floor == max(r.floor for r in table.values()), "only the top floor may import every room"


def test_every_module_is_in_one_room():
    table = rooms()
    homeless = [name for name in modules() if room_of(name, table) is None]
    assert not homeless, f"modules in no room of docs/architecture.md's Layers table: {homeless}"
    entries = [entry for room in table.values() for entry in room.files]
    assert len(entries) == len(set(entries)), "a file or folder is named in two rooms"


def test_no_import_the_table_does_not_allow():
    table, found = rooms(), modules()
    wrong = []
    for name, path in found.items():
        room = table[room_of(name, table)]
        for target in imports(name, path):
            other = room_of(target if target in found else target.rpartition(".")[0], table)
            if other == room.name or room.may_import is None:
                continue
            if other not in room.may_import:
                wrong.append(f"{path.relative_to(ROOT)} ({room.name}, floor {room.floor}) imports {target} "
                             f"({other}, floor {table[other].floor})")
    assert not wrong, "imports docs/architecture.md does not allow:\n" + "\n".join(wrong)


def test_no_two_rooms_import_each_other():
    table, found = rooms(), modules()
    edges = {(room_of(name, table), room_of(target if target in found else target.rpartition(".")[0], table))
             for name, path in found.items() for target in imports(name, path)}
    mutual = sorted({tuple(sorted(edge)) for edge in edges if edge[0] != edge[1] and edge[::-1] in edges})
    assert not mutual, f"rooms that import each other: {mutual}"


@pytest.mark.parametrize(("source", "expected"), [
    ("from xbench.models.base import XBenchModel\n", {"xbench.models.base"}),
    ("def f():\n    from xbench.analysis import phrases\n", {"xbench.analysis"}),
    ("from . import augment\nfrom .io import read_coded\n", {"xbench.data", "xbench.data.io"}),
    ("import xbench.reporting.wandb as w\nimport numpy\n", {"xbench.reporting.wandb"}),
])
def test_imports_are_read_wherever_they_stand(tmp_path, source, expected):
    path = tmp_path / "module.py"
    path.write_text(source)
    assert imports("xbench.data.module", path) == expected
