"""Scenario field checks: each names the bad field by its dotted path."""

from __future__ import annotations

import math
from typing import Any

from dopool._errors import ScenarioError


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
