"""Rules of the engine's structure (docs/design.md, "Module map"), checked on the source."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Collection
from pathlib import Path
from types import ModuleType

SRC = Path(__file__).parent.parent / "src" / "dopool"


def modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_only_the_clock_module_tells_the_clocks_apart() -> None:
    """The pool and runtime ask the clock (``orders_calls``, ``settle``, ``progress``)."""
    offenders = []
    for path in modules():
        if path == SRC / "_clock" / "clocks.py":
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


# Where waiting in wall time is the point: the real clock; and the store's writer lock,
# which processes take in wall time (a simulated runtime's store has none), pausing
# between tries of a lock another process holds.
# A Ray producer pauses between the tries of a call its host did not answer, and a
# restarted shard host between tries of its store's lock, in wall time: Ray's.
WALL_TIME = {
    SRC / "_clock" / "clocks.py",
    SRC / "_store" / "writerlock.py",
    SRC / "_ray" / "host.py",
    SRC / "_ray" / "producer.py",
}


def test_only_the_real_clock_reads_or_waits_on_wall_time() -> None:
    offenders = []
    for path in modules():
        if path in WALL_TIME:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and ast.unparse(node) in ("time.time", "time.sleep"):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == []


# -- the layers (docs/design.md, "Layers") -------------------------------------------------

# Bottom to top. A module imports only modules of its own layer or of a lower one, and
# counts every import: at the top of the file, inside a function, or for type checking
# only. A layer is a folder of src/dopool, or, for the leaves and the package's entry
# points, the modules named; a public module named beside a folder (``metrics``, which
# reads the handles and is read by ``dopool worker``; ``tracing``, which the engine's
# attempts and the handles' enqueues call) is of that folder's layer.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("leaves", ("_errors", "_types", "_pools", "_usercode", "_retry", "_rates", "chaos")),
    ("_clock", ()),
    ("_store", ()),
    ("_machine", ()),
    ("_cluster", ()),
    ("_engine", ("tracing",)),
    ("_handles", ()),
    ("_ops", ("metrics",)),
    ("_sim", ()),
    ("_chaos", ()),
    ("_ray", ("ray",)),
    ("_cli", ()),
    ("entry points", ("__init__", "__main__", "testing")),
]

# Imports that break a rule above, each with the reason it must (docs/design.md,
# "Layers"). The list only shrinks.
ALLOWED: dict[tuple[str, str], str] = {
    # WorkerPool.define(runtime=None) opens the process default Runtime, whose define
    # makes WorkerPools: the public API names each class from the other. The import is
    # function-local, and counted.
    ("dopool._handles.pool", "dopool._handles.runtime"): "the public API's own cycle",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The index in LAYERS of ``module`` (``dopool._store.layout.keys``)."""
    parts = module.split(".")
    if len(parts) == 1:
        return len(LAYERS) - 1  # the package itself: its entry point
    for rank, (name, members) in enumerate(LAYERS):
        if parts[1] == name or parts[1] in members:
            return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def imports(source: str, module: str, known: set[str]) -> dict[str, int]:
    """Each dopool module ``source`` imports (at any depth, for type checking too), with a
    line that does; ``from package import module`` names the module."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(node, module)
            named = [f"{base}.{alias.name}" for alias in node.names]
            targets = [name if name in known else base for name in named]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for name in targets:
            target = _enclosing(name, known)
            if target is not None and target != module:
                found.setdefault(target, node.lineno)
    return found


def _absolute(node: ast.ImportFrom, module: str) -> str:
    """The module an ``from ... import`` reads, its dots resolved against ``module``."""
    if not node.level:
        return node.module or ""
    package = module if module in _PACKAGES else module.rpartition(".")[0]
    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*parts, node.module] if node.module else parts)


def _enclosing(name: str, known: set[str]) -> str | None:
    """``name`` if it is a known module, else the nearest known module that holds it."""
    while name not in known and "." in name:
        name = name.rpartition(".")[0]
    return name if name in known else None


_PACKAGES = {_module_name(path) for path in SRC.rglob("__init__.py")}
_MODULES = {_module_name(path) for path in SRC.rglob("*.py")}


def import_graph() -> dict[str, dict[str, int]]:
    names = {_module_name(path): path for path in modules()}
    known = set(names)
    return {name: imports(path.read_text(), name, known) for name, path in names.items()}


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    return [
        f"{module}:{line} imports {target}"
        for module, targets in sorted(graph.items())
        for target, line in sorted(targets.items())
        if layer_of(target) > layer_of(module) and (module, target) not in ALLOWED
    ]


def test_every_import_points_down_the_layers() -> None:
    assert upward_imports(import_graph()) == []


def test_a_planted_upward_import_is_found() -> None:
    """``from dopool._engine ...`` in a store module, even for type checking only."""
    graph = import_graph()
    store = SRC / "_store" / "environment.py"
    planted = store.read_text() + (
        "\nif TYPE_CHECKING:\n    from dopool._engine.shell import InstanceMemory\n"
    )
    graph["dopool._store.environment"] = imports(planted, "dopool._store.environment", set(graph))
    (found,) = upward_imports(graph)
    assert found.startswith("dopool._store.environment:")
    assert found.endswith("imports dopool._engine.shell")


def cycles(
    graph: dict[str, dict[str, int]], allowed: Collection[tuple[str, str]] = ALLOWED.keys()
) -> list[str]:
    """A cycle for each group of modules that import each other, as a path; the imports
    ``allowed`` are left out."""
    found = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph.get(name, ())):
            if (name, target) in allowed:
                continue
            if state.get(target) == 1:
                found.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def test_no_import_cycle_at_all() -> None:
    """Each module imports only what does not import it back, however indirectly."""
    graph = import_graph()
    graph.pop("dopool")  # the package re-exports the public names: the root of the graph
    assert cycles(graph) == []


def test_the_cycle_finder_finds_one_closed_for_type_checking_only() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}
    assert cycles(graph) == ["a -> b -> c -> a"]


def test_every_allowed_import_is_still_there_and_still_breaks_a_rule() -> None:
    """An entry of ALLOWED goes when its import does, or when it points down and closes
    no cycle once the other entries are gone."""
    graph = import_graph()
    assert [pair for pair in ALLOWED if pair[1] not in graph.get(pair[0], {})] == []
    graph.pop("dopool")
    unneeded = []
    for module, target in ALLOWED:
        downward = layer_of(target) <= layer_of(module)
        others = {pair: why for pair, why in ALLOWED.items() if pair != (module, target)}
        alone = {name: dict(targets) for name, targets in graph.items()}
        for pair in others:
            alone[pair[0]].pop(pair[1], None)
        if downward and not cycles(alone, allowed=()):
            unneeded.append((module, target))
    assert unneeded == []


def test_no_module_imports_another_packages_private_name() -> None:
    """A name with a leading underscore is its own package's (``_cli/`` shares its own)."""
    offenders: list[str] = []
    for path in modules():
        module = _module_name(path)
        package = module if module in _PACKAGES else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            source = _absolute(node, module)
            owner = source if source in _PACKAGES else source.rpartition(".")[0]
            offenders.extend(
                f"{module}:{node.lineno} imports {source}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_")
                and owner != package
                and f"{source}.{alias.name}" not in _MODULES  # a module, not a name
            )
    assert offenders == []


# The tools, the pool handle and the tools' runtime reach the engine through named
# operations (dopool._handles.tools, the PoolContext a runtime hands its pools), never
# through another object's private attributes (docs/design.md, "Module map").
NO_PRIVATE_READS = ["_sim", "_chaos", "_ops", "_ray", "_handles/pool.py", "_handles/tools.py"]


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
        "import dopool._store.layout\n"
        "from dopool import _ports\n"
        "from dopool._store.layout import Namespace\n"
        "self._pool._send(0)\n"
        "runtime._store.read()\n"
        "Namespace('p', 0)._meta\n"
        "self._store.read(); cls._x; super()._y; _ports.submit; dopool._store.layout._z\n"
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
