"""Building a scenario from TOML data: every table checked, errors named by dotted path.

A path in a scenario file (a replay's ``arrivals.file``, a ``partitions.file``, an
app's file) is relative to the file: :func:`read_file` joins it to the file's folder as
it reads it, before flags change anything, so a path a flag gives stays relative to
where dopool runs.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, fields
from importlib import resources
from pathlib import Path
from typing import Any

from dopool._errors import ScenarioError
from dopool._sim.checks import Section
from dopool._sim.pools import PoolTable
from dopool._sim.scenario import (
    APP_PARAMS,
    GATES,
    LISTS,
    NO_APP,
    PRESETS,
    SECTIONS,
    Arrivals,
    Gate,
    Scenario,
)

BUILTINS = (
    "steady",
    "burst",
    "hot-partition",
    "poison",
    "crash-storm",
    "maintenance",
    "daily-cycle",
    "chat-rooms",
)


# -- building from plain data -------------------------------------------------------
def from_mapping(data: Mapping[str, Any]) -> Scenario:
    """Build a scenario from TOML-like data, refusing unknown keys by their path.

    A ``preset`` fills in what the data leaves out (:data:`PRESETS`).
    """
    if not isinstance(data, Mapping):
        raise ScenarioError("", f"must be a table, got {data!r}")
    preset = data.get("preset")
    if isinstance(preset, str) and preset in PRESETS:
        data = _under(PRESETS[preset], data)
    top = {GATES if f.name == "asserts" else f.name for f in fields(Scenario)} - {"app_params"}
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
            arguments[key] = _build_array(key, LISTS[key], value)
        elif key == GATES:
            arguments["asserts"] = _build_array(key, Gate, value)
        elif key == "app" and isinstance(value, Mapping):
            arguments.update(_app(value))
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


def _app(table: Mapping[str, Any]) -> dict[str, Any]:
    """``[app]``: its ``function`` (what ``app = "..."`` names) and its ``params``."""
    _refuse_unknown("app", table, {"function", "params"})
    params = table.get("params", {})
    if not isinstance(params, Mapping):
        raise ScenarioError(APP_PARAMS, f"must be a table, got {params!r}")
    if "function" not in table:
        if params:  # set by a flag (app.NAME), or the file leaves the app to --app
            raise ScenarioError(f"app.{next(iter(params))}", NO_APP)
        raise ScenarioError("app.function", "is required: the app's 'module:function'")
    return {"app": table["function"], "app_params": params}


def _build(path: str, kind: type[Any], value: object, *, nested: bool = False) -> Any:
    if not isinstance(value, Mapping):
        raise ScenarioError(path, f"must be a table, got {value!r}")
    _refuse_unknown(path, value, {f.name for f in fields(kind)})
    arguments = dict(value)
    for name, item in getattr(kind, "arrays", {}).items():  # [[arrivals.phases]]
        if name in arguments:
            arguments[name] = _build_array(f"{path}.{name}", item, arguments[name])
    try:
        return _construct(path, kind, arguments)
    except ScenarioError as exc:
        if not nested:
            raise
        # A section names its fields ``arrivals.x``; in an array they are ``arrivals[k].x``.
        inner = exc.field.split(".", 1)[1] if "." in exc.field else ""
        raise ScenarioError(f"{path}.{inner}" if inner else path, exc.problem) from None


def _build_array(path: str, kind: type[Any], value: object) -> tuple[Any, ...]:
    if not isinstance(value, list):
        raise ScenarioError(path, f"must be an array of tables ([[{path}]]), got {value!r}")
    return tuple(_build(f"{path}[{position}]", kind, item) for position, item in enumerate(value))


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


def read(name_or_path: str) -> tuple[dict[str, Any], str]:
    """The TOML data of a built-in scenario or a scenario file, and where it came from."""
    if name_or_path in BUILTINS:
        source = f"built-in scenario '{name_or_path}'"
        path = resources.files("dopool._sim").joinpath("scenarios", f"{name_or_path}.toml")
        return parse(path.read_text("utf-8"), source), source
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists() or "/" in name_or_path:
        return read_file(path)
    raise ScenarioError(
        "",
        f"'{name_or_path}' is neither a built-in scenario ({', '.join(BUILTINS)}) nor a file",
    )


def read_file(path: Path) -> tuple[dict[str, Any], str]:
    """A scenario file's TOML data, its relative paths joined to its folder, and its name."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError("", f"cannot be read: {exc.strerror or exc}", source=source) from None
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise ScenarioError("", problem, source=source) from None
    return _located(parse(text, source), os.path.dirname(source)), source


def _located(data: dict[str, Any], folder: str) -> dict[str, Any]:
    """``data`` with its relative paths joined to ``folder``: each stream's replay ``file``,
    each ``partitions.file`` (a pool's too), and the app's when it names a file
    (``path/app.py:build``; a module is no path)."""
    streams = data.get("arrivals")
    for stream in streams if isinstance(streams, list) else [streams]:
        if isinstance(stream, dict) and isinstance(stream.get("file"), str):
            stream["file"] = _joined(folder, stream["file"])
    pools = data.get("pools")
    for where in [data, *(pools if isinstance(pools, list) else [])]:
        section = where.get("partitions") if isinstance(where, dict) else None
        if isinstance(section, dict) and isinstance(section.get("file"), str):
            section["file"] = _joined(folder, section["file"])
    table, key = (data["app"], "function") if isinstance(data.get("app"), dict) else (data, "app")
    spec = table.get(key)
    if isinstance(spec, str):
        target, colon, name = spec.rpartition(":")
        if colon and (target.endswith(".py") or "/" in target):  # as load_app tells a file
            table[key] = f"{_joined(folder, target)}:{name}"
    return data


def _joined(folder: str, path: str) -> str:
    """``path`` relative to ``folder``, or as it is if absolute."""
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(folder, path))


def parse(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError("", f"is not valid TOML: {exc}", source=source) from None


def built(data: Mapping[str, Any], source: str) -> Scenario:
    """The scenario ``data`` gives; an error names ``source``."""
    try:
        return from_mapping(data)
    except ScenarioError as exc:
        raise exc.from_source(source) from None


def normalized(data: Mapping[str, Any]) -> dict[str, Any]:
    """TOML data in the shape of a scenario's ``to_dict``: arrivals as a list of tables."""
    result = dict(data)
    streams = result.get("arrivals", {})
    result["arrivals"] = [dict(streams)] if isinstance(streams, Mapping) else list(streams)
    result.setdefault("pools", [])
    return result


def _under(defaults: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with ``defaults`` filled in where it has no value (tables merged)."""
    merged = dict(data)
    for key, value in defaults.items():
        mine = merged.get(key)
        if isinstance(value, Mapping) and isinstance(mine, Mapping):
            merged[key] = _under(value, mine)
        elif key not in merged:
            merged[key] = value
    return merged
