"""Rules of the engine's structure (docs/design.md, "Module map"), checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parent.parent / "src" / "dopool"


def modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_only_the_clock_module_tells_the_clocks_apart() -> None:
    """The pool and runtime ask the clock (``orders_calls``, ``settle``, ``progress``)."""
    offenders = []
    for path in modules():
        if path.name == "_clock.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
                and "SimulatedClock" in ast.unparse(node.args[1])
            ):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == []


def test_only_the_real_clock_reads_or_waits_on_wall_time() -> None:
    offenders = []
    for path in modules():
        if path.name == "_clock.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and ast.unparse(node) in ("time.time", "time.sleep"):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == []
