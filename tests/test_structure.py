"""Rules of the engine's structure (docs/design.md, "Module map"), checked on the source."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from types import ModuleType

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


def _imports(path: Path) -> set[str]:
    """The dopool modules ``path`` imports, at any depth, but not for type checking only."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dopool"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("dopool"))
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycle_between_the_modules() -> None:
    """Each module may import only what does not import it back, however indirectly."""
    names = {_module_name(path): path for path in modules()}
    graph = {
        name: {target for target in _imports(path) if target in names and target != name}
        for name, path in names.items()
        if name != "dopool"  # the package re-exports everything: the root, not part of a cycle
    }
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph.get(name, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


# The tools, the pool handle and the tools' port reach the engine through named
# operations (dopool._ports, the PoolContext a runtime hands its pools), never through
# another object's private attributes (docs/design.md, "Module map").
NO_PRIVATE_READS = ["_sim", "_chaos", "_pool.py", "_ports.py"]


def _module_names(tree: ast.Module) -> set[str]:
    """The names (dotted ones too) by which the file reaches the modules it imports."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                # ``import a.b.c`` binds ``a`` and reaches ``a.b`` and ``a.b.c`` through it.
                names.update(
                    [alias.asname]
                    if alias.asname
                    else [".".join(parts[: n + 1]) for n in range(len(parts))]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                value = getattr(importlib.import_module(node.module), alias.name, None)
                if isinstance(value, ModuleType):
                    names.add(alias.asname or alias.name)
    return names


def private_reads(source: str, filename: str = "<source>") -> list[str]:
    """Each ``x._name`` in ``source`` whose ``x`` is not ``self``, ``cls`` or a module."""
    tree = ast.parse(source, filename)
    own = {"self", "cls"} | _module_names(tree)
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and re.match(r"_[a-z]", node.attr)):
            continue
        left = ast.unparse(node.value)
        if left in own or left == "super()":
            continue
        found.append((node.lineno, node.col_offset, ast.unparse(node)))
    return [f"{line}: {text}" for line, _, text in sorted(found)]


def test_the_private_reads_detector() -> None:
    source = (
        "import dopool._layout\n"
        "from dopool import _ports\n"
        "from dopool._layout import Namespace\n"
        "self._pool._send(0)\n"
        "runtime._store.read()\n"
        "Namespace('p', 0)._meta\n"
        "self._store.read(); cls._x; super()._y; _ports.submit; dopool._layout._z\n"
        "pool.__class__\n"
    )
    assert private_reads(source) == [
        "4: self._pool._send",
        "5: runtime._store",
        "6: Namespace('p', 0)._meta",
    ]


def test_no_tool_reads_another_objects_private_attributes() -> None:
    paths = sorted(
        path
        for name in NO_PRIVATE_READS
        for path in ([SRC / name] if name.endswith(".py") else (SRC / name).rglob("*.py"))
    )
    assert len(paths) > len(NO_PRIVATE_READS)
    offenders = [
        f"{path.relative_to(SRC)}:{read}"
        for path in paths
        for read in private_reads(path.read_text(), str(path))
    ]
    assert offenders == []


def _mapped_modules() -> set[str]:
    """The modules docs/design.md's module map names (a row may name several)."""
    text = (SRC.parent.parent / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for row in re.findall(r"^\| (`[^|]+`) \|", section, re.MULTILINE):
        names.update(re.findall(r"`([^`]+\.py)`", row))
    return names


def test_the_module_map_names_every_module_and_only_those() -> None:
    actual = {str(path.relative_to(SRC)) for path in modules()}
    mapped = _mapped_modules()
    assert sorted(actual - mapped) == [], "modules missing from docs/design.md's module map"
    assert sorted(mapped - actual) == [], "the module map names modules that do not exist"
