"""The store's layout has one owner (docs/store-format.md), checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "dopool"
LAYOUT = SRC / "_store" / "layout"

# The format key, the pool, instance and dedup prefixes, and the tags of an instance's keys.
KEY_BYTES = {b"F", b"P", b"I", b"K", b"E"} | {bytes([tag]) for tag in b"mqwdosnfev"}


def test_only_the_keys_module_of_the_layout_spells_a_key() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path == LAYOUT / "keys.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in KEY_BYTES:
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value!r}")
    assert offenders == []


def test_the_layouts_own_names_stay_inside_it() -> None:
    """A name with a leading underscore in ``_layout/`` is shared by its modules only."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path.is_relative_to(LAYOUT):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("dopool._store.layout")
                and any(alias.name.startswith("_") for alias in node.names)
            ):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == []
