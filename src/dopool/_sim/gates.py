"""Gates: pass/fail checks of a run's figures (``--assert 'p99 <= 0.5'``, ``[[assert]]``).

A check reads ``FIGURE OP NUMBER``: a figure's name (:data:`dopool._sim.figures.DESCRIPTIONS`,
any name there), one of the operators ``<=``, ``<``, ``>=``, ``>``, ``==``, ``!=``, and a
plain number in the figure's own unit (virtual seconds for latencies, a share from 0 to 1
for utilisation). Whitespace around the operator is optional. :func:`parse` reads a check,
:func:`evaluate` compares it with a run's figures (:func:`dopool._sim.figures.figures`).

This module knows nothing of scenarios: a :class:`GateError` says what is wrong with a
check's text, and the scenario (``assert[1].check``) or the flag (``--assert``) that
holds the text names where.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from dopool._sim.figures import NAMES

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
    "==": operator.eq,
    "!=": operator.ne,
}
SHAPE = "expected FIGURE OP NUMBER, e.g. 'p99 <= 0.5'"
LIST_HINT = "see 'dopool simulate --list-figures'"

_OPERATOR_CHARS = frozenset("<>=!")
_MISTAKES = {"=": "==", "=<": "<=", "=>": ">=", "<>": "!=", "===": "==", "!==": "!="}
# A plain decimal number, ASCII only: no nan, no inf, no unit.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
# A number with a time unit, only to say what to write instead.
_WITH_UNIT = re.compile(rf"({_NUMBER.pattern})\s*(ms|us|s)", re.ASCII)
_UNIT_SECONDS = {"ms": 1e-3, "us": 1e-6, "s": 1.0}


class GateError(ValueError):
    """A check's text is not ``FIGURE OP NUMBER`` with a known figure.

    Its message completes a sentence about the text ("... names no figure 'p999'").
    """


@dataclass(frozen=True, slots=True)
class Check:
    """A parsed check: ``figure op bound``; ``number`` is the bound as written."""

    figure: str
    op: str
    bound: float
    number: str

    @property
    def expr(self) -> str:
        """The check with its spacing made regular: ``p99 <= 0.5``."""
        return f"{self.figure} {self.op} {self.number}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """A check compared with a run: the figure's value and whether the check held."""

    check: Check
    value: float
    passed: bool
    why: str | None = None

    @property
    def value_text(self) -> str:
        """The value, short, but never so short that it reads as the bound it missed."""
        value = self.value
        if math.isnan(value):
            return "nan"
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        short = f"{value:.6g}"
        return repr(value) if float(short) == self.check.bound else short

    def failure(self) -> str:
        """One line for stderr: ``assertion failed: p99 <= 0.5 (p99 = 0.731)``."""
        line = f"assertion failed: {self.check.expr} ({self.check.figure} = {self.value_text})"
        return f"{line}: {self.why}" if self.why else line

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "expr": self.check.expr,
            "figure": self.check.figure,
            "op": self.check.op,
            "bound": self.check.bound,
            "value": self.value,
            "passed": self.passed,
            "why": self.why,
        }


def parse(text: str, names: Collection[str] = NAMES) -> Check:
    """Read ``FIGURE OP NUMBER``; ``names`` are the figures it may name.

    Raises:
        GateError: the text is empty, has no operator or a wrong one, names no figure
            of ``names``, or its bound is not a plain finite number.
    """
    if not isinstance(text, str):
        raise GateError(f"must be a string, got {text!r}")
    stripped = text.strip()
    if not stripped:
        raise GateError(f"is empty: {SHAPE}")
    start = next((i for i, char in enumerate(stripped) if char in _OPERATOR_CHARS), None)
    if start is None:
        raise GateError(f"has no comparison: {SHAPE}")
    end = start
    while end < len(stripped) and stripped[end] in _OPERATOR_CHARS:
        end += 1
    figure, op, number = stripped[:start].strip(), stripped[start:end], stripped[end:].strip()
    if op not in OPERATORS:
        better = _MISTAKES.get(op)
        hint = f"did you mean '{better}'?" if better else f"use one of {' '.join(OPERATORS)}"
        raise GateError(f"uses '{op}', which is not an operator ({hint})")
    if not figure:
        raise GateError(f"has no figure before '{op}': {SHAPE}")
    if not number:
        raise GateError(f"has no number after '{op}': {SHAPE}")
    if figure not in names:
        raise GateError(unknown_figure(figure, names))
    if not _NUMBER.fullmatch(number):
        raise GateError(f"compares with '{number}', which is not a number{_unit_hint(number)}")
    bound = float(number)
    if not math.isfinite(bound):
        raise GateError(f"compares with '{number}', which is not a finite number")
    return Check(figure=figure, op=op, bound=bound, number=number)


def unknown_figure(figure: str, names: Collection[str] = NAMES) -> str:
    """``names no figure 'p999' (closest: 'p99', ...; see ...)``."""
    close = difflib.get_close_matches(figure, list(names), n=3)
    closest = f"closest: {', '.join(repr(name) for name in close)}; " if close else ""
    return f"names no figure '{figure}' ({closest}{LIST_HINT})"


def _unit_hint(number: str) -> str:
    match = _WITH_UNIT.fullmatch(number)
    if match is None:
        return ""
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    return f" (write seconds as a plain number: {seconds:g})"


def evaluate(check: Check, named: Mapping[str, float], why: str | None = None) -> Outcome:
    """Compare ``check`` with a run's figures by name. A NaN figure fails every check.

    Raises:
        GateError: the run has no figure of that name.
    """
    if check.figure not in named:
        raise GateError(unknown_figure(check.figure, named))
    value = float(named[check.figure])
    passed = not math.isnan(value) and OPERATORS[check.op](value, check.bound)
    return Outcome(check=check, value=value, passed=passed, why=why)
