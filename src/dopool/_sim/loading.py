"""Loading a scenario: from a TOML file, a built-in name, or either changed by flags."""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from dopool._sim.scenario import (
    GATES,
    LISTS,
    SECTIONS,
    Gate,
    Scenario,
    ScenarioError,
    Section,
)

BUILTINS = ("steady", "burst", "hot-partition", "poison", "crash-storm", "maintenance")


# -- building from plain data -------------------------------------------------------
def from_mapping(data: Mapping[str, Any]) -> Scenario:
    """Build a scenario from TOML-like data, refusing unknown keys by their path."""
    if not isinstance(data, Mapping):
        raise ScenarioError("", f"must be a table, got {data!r}")
    top = {GATES if f.name == "asserts" else f.name for f in fields(Scenario)}
    _refuse_unknown("", data, top)
    arguments: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS:
            arguments[key] = _build(key, SECTIONS[key], value)
        elif key in LISTS or key == GATES:
            if not isinstance(value, list):
                raise ScenarioError(key, f"must be an array of tables ([[{key}]]), got {value!r}")
            kind = Gate if key == GATES else LISTS[key]
            arguments["asserts" if key == GATES else key] = tuple(
                _build(f"{key}[{position}]", kind, item) for position, item in enumerate(value)
            )
        else:
            arguments[key] = value
    scenario: Scenario = _construct("", Scenario, arguments)
    return scenario


def _build(path: str, kind: type[Any], value: object) -> Any:
    if not isinstance(value, Mapping):
        raise ScenarioError(path, f"must be a table, got {value!r}")
    _refuse_unknown(path, value, {f.name for f in fields(kind)})
    return _construct(path, kind, dict(value))


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
def _field_kind(path: str) -> tuple[type[Any], str, str]:
    """``(dataclass, field name, annotation)`` of a dotted path, or a ScenarioError."""
    parts = path.split(".")
    if parts[0] in (GATES, "asserts"):
        raise ScenarioError(
            parts[0], "can only be set in a scenario file ([[assert]]) or by --assert"
        )
    if len(parts) == 1:
        kind: type[Any] = Scenario
        name = parts[0]
    elif len(parts) == 2 and parts[0] in SECTIONS:
        kind, name = SECTIONS[parts[0]], parts[1]
    elif parts[0] in LISTS:
        raise ScenarioError(parts[0], "can only be set in a scenario file")
    else:
        raise ScenarioError(path, "is not a scenario field")
    specs = {f.name: f for f in fields(kind)}
    if name in SECTIONS or name in LISTS:
        if name in LISTS:
            raise ScenarioError(name, "can only be set in a scenario file")
        raise ScenarioError(
            name, f"is a table; set one of its fields, e.g. '{name}.{_first(name)}'"
        )
    if name not in specs:
        close = difflib.get_close_matches(path, settable_fields(), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ScenarioError(path, f"is not a scenario field{hint}")
    return kind, name, str(specs[name].type)


def _first(section: str) -> str:
    return fields(SECTIONS[section])[0].name


def settable_fields() -> list[str]:
    """Every dotted path a flag can set."""
    arrays = {*LISTS, "asserts"}
    paths = [f.name for f in fields(Scenario) if f.name not in SECTIONS and f.name not in arrays]
    for section, kind in SECTIONS.items():
        paths.extend(f"{section}.{f.name}" for f in fields(kind))
    return paths


def numeric_fields() -> list[str]:
    """Every dotted path that holds a number (what ``--sweep`` accepts)."""
    result = []
    for path in settable_fields():
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

    Setting one of ``arrivals.total`` / ``arrivals.duration`` clears the other
    unless both are given.
    """
    data = scenario.to_dict()
    for path, raw in overrides.items():
        _field_kind(path)
        value = parse_value(path, raw) if isinstance(raw, str) else raw
        parts = path.split(".")
        target = data if len(parts) == 1 else data[parts[0]]
        target[parts[-1]] = value
    arrivals = data["arrivals"]
    if "arrivals.total" in overrides and "arrivals.duration" not in overrides:
        arrivals["duration"] = None
    if "arrivals.duration" in overrides and "arrivals.total" not in overrides:
        arrivals["total"] = None
    return from_mapping(_without_none(data))


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


def with_seed(scenario: Scenario, seed: int) -> Scenario:
    """A copy with another seed."""
    return replace(scenario, seed=seed)
