"""Loading a scenario: from a TOML file or a built-in name (:mod:`dopool._sim.building`
reads and checks the data), changed by flags, and what the flags changed."""

from __future__ import annotations

import datetime
import difflib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from dopool._errors import ScenarioError
from dopool._sim.building import (
    BUILTINS,
    built,
    from_mapping,
    normalized,
    parse,
    read,
    read_file,
)
from dopool._sim.pools import POOL_FIELDS, POOL_SECTIONS, Pool
from dopool._sim.scenario import GATES, LISTS, SECTIONS, Arrivals, Scenario

__all__ = [
    "BUILTINS",
    "Change",
    "builtin",
    "changes",
    "from_mapping",
    "load_file",
    "loads",
    "numeric_fields",
    "parse_value",
    "resolve",
    "settable_fields",
    "show",
    "with_overrides",
    "with_seed",
]


def load_file(path: str | Path) -> Scenario:
    """Read a scenario from a TOML file; errors name the file and the field."""
    return built(*read_file(Path(path)))


def loads(text: str, *, source: str = "<scenario>") -> Scenario:
    """Parse a scenario from TOML text."""
    return built(parse(text, source), source)


def builtin(name: str) -> Scenario:
    """One of the built-in scenarios (:data:`BUILTINS`), shipped as TOML files."""
    if name not in BUILTINS:
        raise ScenarioError("", f"'{name}' is not a built-in scenario ({', '.join(BUILTINS)})")
    return resolve(name)


def resolve(name_or_path: str, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """A built-in scenario by name, or a scenario file by path, with ``overrides``
    (dotted paths, as :func:`with_overrides` takes) applied before it is checked:
    a flag may give what the file leaves to it (``--app`` for a scenario naming an
    app's pools)."""
    data, source = read(name_or_path)
    if overrides:
        data = _without_none(_applied(normalized(data), overrides))
    return built(data, source)


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
    if rest[0] == "app" and len(rest) > 1 and not where:
        return Scenario, _param(path), "Any"
    if rest[0] in (GATES, "asserts") and not where:
        raise ScenarioError(
            rest[0], "can only be set in a scenario file ([[assert]]) or by --assert"
        )
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
    if name in getattr(kind, "arrays", {}):
        raise ScenarioError(path, "can only be set in a scenario file")
    specs = {f.name: f for f in fields(kind)}
    if kind is Scenario and name in ("pools", *LISTS):
        raise ScenarioError(name, "can only be set in a scenario file")
    if kind is Scenario and name in SECTIONS:
        raise ScenarioError(
            name, f"is a table; set one of its fields, e.g. '{name}.{_first(name)}'"
        )
    if name not in specs or (kind is Pool and name == "name") or name == "app_params":
        raise ScenarioError(path, _not_a_field(path))
    return kind, name, str(specs[name].type)


def _param(path: str) -> str:
    """The name of the app's parameter that ``app.NAME`` sets."""
    name = path.removeprefix("app.")
    if not name.isidentifier():
        raise ScenarioError(path, "names a parameter of the app as 'app.NAME'")
    return name


def _not_a_field(path: str, problem: str = "is not a scenario field") -> str:
    close = difflib.get_close_matches(path, settable_fields(), n=1)
    return problem + (f" (did you mean '{close[0]}'?)" if close else "")


def _first(section: str) -> str:
    return fields(SECTIONS[section])[0].name


def settable_fields(scenario: Scenario | None = None) -> list[str]:
    """Every dotted path a flag can set (a pool's too, given the scenario)."""
    tables = ("pools", "asserts", "app_params")
    paths = [
        f.name
        for f in fields(Scenario)
        if f.name not in SECTIONS and f.name not in LISTS and f.name not in tables
    ]
    for section, kind in SECTIONS.items():
        paths.extend(f"{section}.{f.name}" for f in fields(kind) if f.name not in kind.arrays)
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
    """Turn a flag's text into the field's type; ``none`` clears an optional field.

    An app's parameter (``app.NAME``) has no type here: its text is read as a TOML value
    (``30``, ``0.5``, ``true``, ``"text"``, ``[1, 2]``), else it is the text itself
    (``fast``); ``none`` removes it, so the app's default applies.
    """
    _, _, annotation = _field_kind(path)
    optional = "None" in annotation or annotation == "Any"
    if optional and text.strip().lower() in ("none", ""):
        return None
    if annotation == "Any":
        try:
            value = tomllib.loads(f"value = {text.strip()}")["value"]
        except tomllib.TOMLDecodeError:
            return text.strip()
        return text.strip() if isinstance(value, datetime.date | datetime.time) else value
    base = annotation.split("|")[0].strip()
    word = text.strip()
    if word and (f"Literal['{word}']" in annotation or f'Literal["{word}"]' in annotation):
        return word  # the field's word: "per-key" instances
    if base == "int":
        try:
            return int(text.replace("_", ""))
        except ValueError:
            raise ScenarioError(path, f"must be an integer, got {text!r}") from None
    if base == "float":
        try:
            return float(text.replace("_", ""))
        except ValueError:
            if "str" in annotation:  # a number or text: a rate limit's "30/m"
                return text.strip()
            raise ScenarioError(path, f"must be a number, got {text!r}") from None
    return text


def with_overrides(scenario: Scenario, overrides: Mapping[str, Any]) -> Scenario:
    """A copy with dotted-path fields replaced (values already typed, or flag text).

    ``arrivals.x`` sets the only arrival stream's field (``arrivals[k].x`` one of
    several); ``pools.NAME.x`` a pool's. Setting one of a stream's ``total`` /
    ``duration`` clears the other unless both are given.
    """
    return from_mapping(_without_none(_applied(scenario.to_dict(), overrides)))


def _applied(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` (in ``to_dict``'s shape) with the dotted-path ``overrides`` set."""
    for path, raw in overrides.items():
        _field_kind(path)
        value = parse_value(path, raw) if isinstance(raw, str) else raw
        if path.startswith("app.") or (path == "app" and isinstance(data.get("app"), dict)):
            _set_app(data, path, value)
            continue
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
    return data


def _set_app(data: dict[str, Any], path: str, value: Any) -> None:
    """Set the app (``app``: its function) or one of its parameters (``app.NAME``, None
    removes it) in ``data``, whose ``app`` becomes a table (``[app]``) when it has some."""
    table = data.get("app")
    if path == "app" and value is None:  # no app: no parameters either
        data["app"] = None
        return
    if value is None and not isinstance(table, dict):
        return  # no parameter to remove
    if not isinstance(table, dict):
        table = data["app"] = {"function": table, "params": {}}
    if path == "app":
        table["function"] = value
    else:
        table.setdefault("params", {})[_param(path)] = value


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
    section: dict[str, Any] = data.setdefault(where, {})
    return section


def _without_none(data: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            result[key] = _without_none(value)
        elif isinstance(value, list):
            result[key] = [_without_none(i) if isinstance(i, dict) else i for i in value]
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
        if path == "app" and isinstance(value, Mapping):  # its function, its parameters
            flat["app"] = value["function"]
            flat.update({f"app.{name}": item for name, item in value["params"].items()})
        elif isinstance(value, Mapping):
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
