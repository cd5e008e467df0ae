"""Loading a scenario: from a TOML file, a built-in name, or either changed by flags."""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from dopool._sim.checks import ScenarioError
from dopool._sim.pools import POOL_FIELDS, POOL_SECTIONS, Pool, PoolTable
from dopool._sim.scenario import LISTS, SECTIONS, Arrivals, Scenario
from dopool._sim.sections import Section

BUILTINS = ("steady", "burst", "hot-partition", "poison", "crash-storm", "maintenance")


# -- building from plain data -------------------------------------------------------
def from_mapping(data: Mapping[str, Any]) -> Scenario:
    """Build a scenario from TOML-like data, refusing unknown keys by their path."""
    if not isinstance(data, Mapping):
        raise ScenarioError("", f"must be a table, got {data!r}")
    top = {f.name for f in fields(Scenario)}
    _refuse_unknown("", data, top)
    arguments: dict[str, Any] = {}
    for key, value in data.items():
        if key == "arrivals":
            arguments[key] = _streams(value)
        elif key in SECTIONS:
            arguments[key] = _build(key, SECTIONS[key], value)
        elif key == "pools":
            arguments[key] = _pool_tables(value)
        elif key in LISTS:
            if not isinstance(value, list):
                raise ScenarioError(key, f"must be an array of tables ([[{key}]]), got {value!r}")
            arguments[key] = tuple(
                _build(f"{key}[{position}]", LISTS[key], item)
                for position, item in enumerate(value)
            )
        else:
            arguments[key] = value
    scenario: Scenario = _construct("", Scenario, arguments)
    return scenario


def _streams(value: object) -> tuple[Arrivals, ...]:
    """``[arrivals]`` (one stream) or ``[[arrivals]]`` (several)."""
    if isinstance(value, list):
        if not value:
            raise ScenarioError("arrivals", "must list at least one arrival stream")
        if len(value) == 1:  # named as one stream is: ``arrivals.rate``
            return (_build("arrivals", Arrivals, value[0]),)
        return tuple(
            _build(f"arrivals[{position}]", Arrivals, item, nested=True)
            for position, item in enumerate(value)
        )
    return (_build("arrivals", Arrivals, value),)


def _pool_tables(value: object) -> tuple[PoolTable, ...]:
    if not isinstance(value, list):
        raise ScenarioError("pools", f"must be an array of tables ([[pools]]), got {value!r}")
    tables = []
    for position, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise ScenarioError(f"pools[{position}]", f"must be a table, got {item!r}")
        if "name" not in item:
            raise ScenarioError(f"pools[{position}].name", "is required")
        settings = {key: item[key] for key in item if key != "name"}
        tables.append(PoolTable(item["name"], settings))
    return tuple(tables)


def _build(path: str, kind: type[Any], value: object, *, nested: bool = False) -> Any:
    if not isinstance(value, Mapping):
        raise ScenarioError(path, f"must be a table, got {value!r}")
    _refuse_unknown(path, value, {f.name for f in fields(kind)})
    try:
        return _construct(path, kind, dict(value))
    except ScenarioError as exc:
        if not nested:
            raise
        # A section names its fields ``arrivals.x``; in an array they are ``arrivals[k].x``.
        inner = exc.field.split(".", 1)[1] if "." in exc.field else ""
        raise ScenarioError(f"{path}.{inner}" if inner else path, exc.problem) from None


def _construct(path: str, kind: type[Any], arguments: dict[str, Any]) -> Any:
    required = [
        f.name
        for f in fields(kind)
        if f.default is MISSING and f.default_factory is MISSING and f.name not in arguments
    ]
    if required:
        name = f"{path}.{required[0]}" if path else required[0]
        raise ScenarioError(name, "is required")
    try:
        return kind(**arguments)
    except ScenarioError as exc:
        # Sections name their own fields; list items only know their own names.
        nested = path and not issubclass(kind, Section) and kind is not Scenario
        raise (exc.within(path) if nested else exc) from None


def _refuse_unknown(path: str, data: Mapping[str, Any], known: set[str]) -> None:
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            name = f"{path}.{key}" if path else str(key)
            raise ScenarioError(name, f"is not a scenario field{hint}")


def load_file(path: str | Path) -> Scenario:
    """Read a scenario from a TOML file; errors name the file and the field."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError("", f"cannot be read: {exc.strerror or exc}", source=source) from None
    return loads(text, source=source)


def loads(text: str, *, source: str = "<scenario>") -> Scenario:
    """Parse a scenario from TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError("", f"is not valid TOML: {exc}", source=source) from None
    try:
        return from_mapping(data)
    except ScenarioError as exc:
        raise exc.from_source(source) from None


def builtin(name: str) -> Scenario:
    """One of the built-in scenarios (:data:`BUILTINS`), shipped as TOML files."""
    if name not in BUILTINS:
        raise ScenarioError("", f"'{name}' is not a built-in scenario ({', '.join(BUILTINS)})")
    text = resources.files("dopool._sim").joinpath("scenarios", f"{name}.toml").read_text("utf-8")
    return loads(text, source=f"built-in scenario '{name}'")


def resolve(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario file by path."""
    if name_or_path in BUILTINS:
        return builtin(name_or_path)
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists() or "/" in name_or_path:
        return load_file(path)
    raise ScenarioError(
        "",
        f"'{name_or_path}' is neither a built-in scenario ({', '.join(BUILTINS)}) nor a file",
    )


# -- overrides (flags) --------------------------------------------------------------
_STREAM = re.compile(r"arrivals\[(\d+)\]")


def _split(path: str) -> tuple[str, list[str]]:
    """``(where, rest)``: where a dotted path points (``""`` the top, ``arrivals``,
    ``arrivals[k]``, a section, or ``pools.NAME``) and the names after it.

    A pool's path is read from the right (``pools.NAME.field`` or
    ``pools.NAME.section.field``), so a pool name may hold dots.
    """
    parts = path.split(".")
    if parts[0] == "pools":
        if len(parts) >= 4 and parts[-2] in POOL_SECTIONS:
            return "pools." + ".".join(parts[1:-2]), parts[-2:]
        if len(parts) >= 3:
            return "pools." + ".".join(parts[1:-1]), parts[-1:]
        raise ScenarioError(path, "names a pool's setting as 'pools.NAME.field'")
    if len(parts) == 2 and (parts[0] in SECTIONS or _STREAM.fullmatch(parts[0])):
        return parts[0], parts[1:]
    return "", parts


def _field_kind(path: str) -> tuple[type[Any], str, str]:
    """``(dataclass, field name, annotation)`` of a dotted path, or a ScenarioError."""
    where, rest = _split(path)
    if where.startswith("pools."):
        if len(rest) == 2:
            kind: type[Any] = POOL_SECTIONS[rest[0]]
        elif rest[0] in POOL_FIELDS:
            kind = Pool
        else:
            raise ScenarioError(
                path, _not_a_field(path, f"is not a pool setting ({', '.join(POOL_FIELDS)})")
            )
        name = rest[-1]
    elif where:
        kind = Arrivals if where.startswith("arrivals") else SECTIONS[where]
        name = rest[0]
    elif len(rest) == 1:
        kind, name = Scenario, rest[0]
    elif rest[0] in LISTS:
        raise ScenarioError(rest[0], "can only be set in a scenario file")
    else:
        raise ScenarioError(path, _not_a_field(path))
    specs = {f.name: f for f in fields(kind)}
    if kind is Scenario and name in ("pools", *LISTS):
        raise ScenarioError(name, "can only be set in a scenario file")
    if kind is Scenario and name in SECTIONS:
        raise ScenarioError(
            name, f"is a table; set one of its fields, e.g. '{name}.{_first(name)}'"
        )
    if name not in specs or (kind is Pool and name == "name"):
        raise ScenarioError(path, _not_a_field(path))
    return kind, name, str(specs[name].type)


def _not_a_field(path: str, problem: str = "is not a scenario field") -> str:
    close = difflib.get_close_matches(path, settable_fields(), n=1)
    return problem + (f" (did you mean '{close[0]}'?)" if close else "")


def _first(section: str) -> str:
    return fields(SECTIONS[section])[0].name


def settable_fields(scenario: Scenario | None = None) -> list[str]:
    """Every dotted path a flag can set (a pool's too, given the scenario)."""
    paths = [
        f.name
        for f in fields(Scenario)
        if f.name not in SECTIONS and f.name not in LISTS and f.name != "pools"
    ]
    for section, kind in SECTIONS.items():
        paths.extend(f"{section}.{f.name}" for f in fields(kind))
    for table in () if scenario is None else scenario.pools:
        paths.extend(f"pools.{table.name}.{name}" for name in POOL_FIELDS)
        for section, kind in POOL_SECTIONS.items():
            paths.extend(f"pools.{table.name}.{section}.{f.name}" for f in fields(kind))
    return paths


def numeric_fields(scenario: Scenario | None = None) -> list[str]:
    """Every dotted path that holds a number (what ``--sweep`` accepts)."""
    result = []
    for path in settable_fields(scenario):
        annotation = _field_kind(path)[2]
        if annotation.startswith(("int", "float")):
            result.append(path)
    return result


def parse_value(path: str, text: str) -> Any:
    """Turn a flag's text into the field's type; ``none`` clears an optional field."""
    _, _, annotation = _field_kind(path)
    optional = "None" in annotation
    if optional and text.strip().lower() in ("none", ""):
        return None
    base = annotation.split("|")[0].strip()
    if base == "int":
        try:
            return int(text.replace("_", ""))
        except ValueError:
            raise ScenarioError(path, f"must be an integer, got {text!r}") from None
    if base == "float":
        try:
            return float(text.replace("_", ""))
        except ValueError:
            raise ScenarioError(path, f"must be a number, got {text!r}") from None
    return text


def with_overrides(scenario: Scenario, overrides: Mapping[str, Any]) -> Scenario:
    """A copy with dotted-path fields replaced (values already typed, or flag text).

    ``arrivals.x`` sets the only arrival stream's field (``arrivals[k].x`` one of
    several); ``pools.NAME.x`` a pool's. Setting one of a stream's ``total`` /
    ``duration`` clears the other unless both are given.
    """
    data = scenario.to_dict()
    for path, raw in overrides.items():
        _field_kind(path)
        value = parse_value(path, raw) if isinstance(raw, str) else raw
        where, rest = _split(path)
        target = _table(data, where, path)
        for name in rest[:-1]:
            target = target.setdefault(name, {})
        target[rest[-1]] = value
    for position, stream in enumerate(data["arrivals"]):
        prefixes = ("arrivals", f"arrivals[{position}]")
        given = {path.rsplit(".", 1)[1] for path in overrides if path.rsplit(".", 1)[0] in prefixes}
        if "total" in given and "duration" not in given:
            stream["duration"] = None
        if "duration" in given and "total" not in given:
            stream["total"] = None
    return from_mapping(_without_none(data))


def _table(data: dict[str, Any], where: str, path: str) -> dict[str, Any]:
    """The part of ``data`` (a scenario's ``to_dict``) that ``where`` names."""
    if not where:
        return data
    if where.startswith("pools."):
        name = where.removeprefix("pools.")
        for table in data["pools"]:
            if table["name"] == name:
                found: dict[str, Any] = table
                return found
        names = ", ".join(repr(t["name"]) for t in data["pools"]) or "none: it has no [[pools]]"
        raise ScenarioError(path, f"names no pool of the scenario (its pools: {names})")
    streams = data["arrivals"]
    match = _STREAM.fullmatch(where)
    if match is None and where == "arrivals":
        if len(streams) != 1:
            raise ScenarioError(
                path,
                f"is ambiguous: the scenario has {len(streams)} arrival streams; "
                "name one as 'arrivals[k].field'",
            )
        first: dict[str, Any] = streams[0]
        return first
    if match is not None:
        position = int(match.group(1))
        if position >= len(streams):
            raise ScenarioError(path, f"names no arrival stream (the scenario has {len(streams)})")
        chosen: dict[str, Any] = streams[position]
        return chosen
    section: dict[str, Any] = data[where]
    return section


def _without_none(data: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            result[key] = _without_none(value)
        elif isinstance(value, list):
            result[key] = [_without_none(item) for item in value]
        elif value is not None:
            result[key] = value
    return result


# -- what overrides changed ------------------------------------------------------------
#: Fields that change no part of the design: the title shows them, or they are its words.
UNCHANGING = ("name", "description", "seed")


@dataclass(frozen=True, slots=True)
class Change:
    """One field that flags changed: its dotted path, its value before and after."""

    field: str
    before: Any
    after: Any

    def __str__(self) -> str:
        return f"{self.field} {show(self.before)} → {show(self.after)}"

    def to_json_dict(self) -> dict[str, Any]:
        return {"field": self.field, "from": self.before, "to": self.after}


def show(value: Any) -> str:
    """A field's value as a flag would give it: ``40`` for 40.0, ``none`` for None."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def changes(base: Scenario, scenario: Scenario) -> list[Change]:
    """Every field of the design that differs between ``base`` and ``scenario``, by
    dotted path (as ``--set`` names it), in the order of ``scenario``'s fields.

    The name, description and seed are left out (:data:`UNCHANGING`). A pool table's
    setting it does not write is its resolved value (what the top level gave it).
    """
    before, after = _flatten(base.to_dict()), _flatten(scenario.to_dict())
    found = []
    for path in [*after, *(path for path in before if path not in after)]:
        if path.split(".", 1)[0] in UNCHANGING:
            continue
        old, new = before.get(path), after.get(path)
        if path.startswith("pools."):
            old = _pool_value(base, path) if old is None else old
            new = _pool_value(scenario, path) if new is None else new
        if old != new:
            found.append(Change(path, old, new))
    return found


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{dotted path: value}`` of a scenario's ``to_dict``; one arrival stream is
    ``arrivals``, several ``arrivals[k]``, a pool ``pools.NAME``."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping):
            flat.update(_flatten(value, path))
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            for position, item in enumerate(value):
                where, table = f"{path}[{position}]", item
                if path == "pools":
                    where = f"pools.{item['name']}"
                    table = {k: v for k, v in item.items() if k != "name"}
                elif path == "arrivals" and len(value) == 1:
                    where = "arrivals"
                flat.update(_flatten(table, where))
        else:
            flat[path] = value
    return flat


def _pool_value(scenario: Scenario, path: str) -> Any:
    """A resolved pool's value at ``pools.NAME.field`` (or ``.section.field``), if any."""
    try:
        where, rest = _split(path)
    except ScenarioError:
        return None
    name = where.removeprefix("pools.")
    value: Any = next((p for p in scenario.resolved_pools if p.name == name), None)
    for part in rest:
        value = getattr(value, part, None)
    return value


def with_seed(scenario: Scenario, seed: int) -> Scenario:
    """A copy with another seed."""
    return replace(scenario, seed=seed)
