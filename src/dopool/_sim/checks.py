"""Scenario field checks: each names the bad field by its dotted path."""

from __future__ import annotations

import math
from typing import Any

from dopool._errors import ConfigurationError


class ScenarioError(ConfigurationError):
    """A scenario field is missing, unknown, of the wrong type or out of range.

    Attributes:
        field: the dotted path of the field (``"arrivals.rate"``), or ``""`` for the whole.
        problem: what is wrong with it.
        source: where the scenario came from (a file path, a flag), if known.
    """

    def __init__(self, field: str, problem: str, *, source: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.source = source
        where = f"{source}: " if source else ""
        name = f"field '{field}'" if field else "scenario"
        super().__init__(f"{where}{name} {problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Back from a sweep's worker process: rebuilt from its fields, not its message.
        return (_scenario_error, (self.field, self.problem, self.source))

    def within(self, prefix: str) -> ScenarioError:
        """The same error for a field nested under ``prefix`` (``pauses[0]``)."""
        path = f"{prefix}.{self.field}" if self.field else prefix
        return ScenarioError(path, self.problem, source=self.source)

    def from_source(self, source: str) -> ScenarioError:
        return ScenarioError(self.field, self.problem, source=source)


def _scenario_error(field: str, problem: str, source: str | None) -> ScenarioError:
    return ScenarioError(field, problem, source=source)


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
