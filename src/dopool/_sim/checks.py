"""Scenario field checks: each names the bad field by its dotted path; and the base of
a scenario's tables, which checks its fields as it is made."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, ClassVar

from dopool._errors import ScenarioError


# -- the tables ---------------------------------------------------------------------
class Section:
    """A table of the scenario: its checks name fields as ``<section>.<field>``."""

    section: ClassVar[str]

    def __post_init__(self) -> None:
        try:
            self._check()
        except ScenarioError as exc:
            raise exc.within(self.section) from None

    def _check(self) -> None:
        """Validate the section's fields; each section overrides this."""

    #: Fields that are arrays of tables (``[[arrivals.phases]]``), and the class of an item.
    arrays: ClassVar[dict[str, type[Any]]] = {}
    #: Fields :meth:`to_dict` leaves out while unset (None or empty): the scenarios
    #: that do not use them read, as TOML and as JSON, as they did before them.
    sparse: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """Every field but the unset sparse ones; arrays of tables as lists of dicts."""
        result = {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        for name in self.arrays:
            result[name] = [{f.name: getattr(i, f.name) for f in fields(i)} for i in result[name]]
        return {k: v for k, v in result.items() if k not in self.sparse or v not in (None, [])}


# -- field checks ---------------------------------------------------------------
def number(
    path: str,
    value: object,
    *,
    integer: bool = False,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
) -> Any:
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
        raise ScenarioError(path, f"must be {kind}, got {value!r}")
    if not integer:
        value = float(value)
        if not math.isfinite(value):
            raise ScenarioError(path, f"must be finite, got {value!r}")
    if minimum is not None and value < minimum:
        raise ScenarioError(path, f"must be >= {_bound(minimum, integer)}, got {value!r}")
    if above is not None and value <= above:
        raise ScenarioError(path, f"must be > {_bound(above, integer)}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ScenarioError(path, f"must be <= {_bound(maximum, integer)}, got {value!r}")
    return value


def _bound(bound: float, integer: bool) -> str:
    """An integer field's bound in full (2**63 - 1, not 9.22337e+18)."""
    return str(int(bound)) if integer else f"{bound:g}"


def probability(path: str, value: object, maximum: float = 1.0) -> float:
    result: float = number(path, value, minimum=0.0, maximum=maximum)
    return result


def choice(path: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ScenarioError(path, f"must be one of {allowed}, got {value!r}")
    return value


def text(path: str, value: object) -> str:
    if not isinstance(value, str):
        raise ScenarioError(path, f"must be a string, got {value!r}")
    return value


def assign(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)
