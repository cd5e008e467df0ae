"""Gates: ``--assert 'p99 <= 0.5'`` and ``[[assert]]`` (docs/simulate.md, "Gates").

The checks are parsed and compared on their own first, then in scenarios.
"""

from __future__ import annotations

import math

import pytest

from dopool._sim import gates
from dopool._sim import loading as sc
from dopool._sim.figures import DESCRIPTIONS
from dopool._sim.gates import Check, GateError, Outcome, evaluate, parse
from dopool._sim.scenario import Gate, Scenario, ScenarioError


# -- parsing -----------------------------------------------------------------------------
@pytest.mark.parametrize("op", list(gates.OPERATORS))
@pytest.mark.parametrize("spacing", ["{f} {op} {n}", "{f}{op}{n}", "  {f}\t{op}   {n}  "])
def test_every_operator_with_or_without_whitespace(op: str, spacing: str) -> None:
    check = parse(spacing.format(f="p99", op=op, n="0.5"))
    assert check == Check(figure="p99", op=op, bound=0.5, number="0.5")
    assert check.expr == f"p99 {op} 0.5"


@pytest.mark.parametrize("name", list(DESCRIPTIONS))
def test_every_figure_name_parses(name: str) -> None:
    assert parse(f"{name}<=1").figure == name
    assert parse(f"{name} >= -1").bound == -1.0


@pytest.mark.parametrize(
    ("number", "bound"),
    [("0.5", 0.5), (".5", 0.5), ("5.", 5.0), ("-1", -1.0), ("+2", 2.0), ("1e-3", 0.001)],
)
def test_numbers_are_plain_and_kept_as_written(number: str, bound: float) -> None:
    check = parse(f"p99 < {number}")
    assert (check.bound, check.number, check.expr) == (bound, number, f"p99 < {number}")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("p99", "has no comparison"),
        ("p99 0.5", "has no comparison"),
        ("p99 = 0.5", "did you mean '=='?"),
        ("p99 =< 0.5", "did you mean '<='?"),
        ("p99 => 0.5", "did you mean '>='?"),
        ("p99 <> 0.5", "did you mean '!='?"),
        ("p99 <<= 0.5", "'<<=', which is not an operator (use one of <= < >= > == !=)"),
        ("p99 ! 0.5", "'!', which is not an operator"),
        ("<= 0.5", "has no figure before '<='"),
        ("p99 <=", "has no number after '<='"),
        ("p999 <= 0.5", "names no figure 'p999' (closest: 'p99'"),
        ("latency <= 0.5", "names no figure 'latency' ("),
        ("P99 <= 0.5", "closest: 'p99'"),
        ("p99 <= fast", "compares with 'fast', which is not a number"),
        ("p99 <= 500ms", "not a number (write seconds as a plain number: 0.5)"),
        ("p99 <= 2 s", "not a number (write seconds as a plain number: 2)"),
        ("p99 <= nan", "not a number"),
        ("p99 <= inf", "not a number"),
        ("p99 <= 1e999", "not a finite number"),
        ("p99 <= 1_000", "not a number"),
        ("p99 <= ٣", "not a number"),  # a digit, but not an ASCII one
        ("p99 <= 0.5 0.6", "not a number"),
    ],
)
def test_bad_checks_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(GateError) as caught:
        parse(text)
    assert words in str(caught.value)


def test_an_unknown_figure_points_to_the_list() -> None:
    with pytest.raises(GateError, match=r"see 'dopool simulate --list-figures'\)$"):
        parse("zzz < 1")


def test_the_names_a_check_may_use_can_be_given() -> None:
    assert parse("api.p99 < 1", names={"api.p99"}).figure == "api.p99"
    with pytest.raises(GateError, match=r"closest: 'api\.p99'"):
        parse("api.p98 < 1", names={"api.p99"})


# -- evaluating --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("op", "below", "equal", "above"),
    [
        ("<=", True, True, False),
        ("<", True, False, False),
        (">=", False, True, True),
        (">", False, False, True),
        ("==", False, True, False),
        ("!=", True, False, True),
    ],
)
def test_every_operator_compares(op: str, below: bool, equal: bool, above: bool) -> None:
    check = parse(f"p99 {op} 0.5")
    passed = [evaluate(check, {"p99": value}).passed for value in (0.4, 0.5, 0.6)]
    assert passed == [below, equal, above]


@pytest.mark.parametrize("op", list(gates.OPERATORS))
def test_a_nan_figure_fails_every_check(op: str) -> None:
    assert not evaluate(parse(f"p99 {op} 0.5"), {"p99": math.nan}).passed


def test_a_figure_the_run_lacks_is_an_error() -> None:
    with pytest.raises(GateError, match="names no figure 'p99'"):
        evaluate(parse("p99 < 1"), {"p95": 0.1})


def test_the_outcome_line_and_json() -> None:
    outcome = evaluate(parse("p99<=0.5"), {"p99": 0.73125}, why="the checkout SLO")
    assert outcome.failure() == "assertion failed: p99 <= 0.5 (p99 = 0.73125): the checkout SLO"
    assert outcome.to_json_dict() == {
        "expr": "p99 <= 0.5",
        "figure": "p99",
        "op": "<=",
        "bound": 0.5,
        "value": 0.73125,
        "passed": False,
        "why": "the checkout SLO",
    }
    assert evaluate(parse("rejected == 0"), {"rejected": 12.0}).failure() == (
        "assertion failed: rejected == 0 (rejected = 12)"
    )


@pytest.mark.parametrize(
    ("value", "bound", "text"),
    [
        (12.0, 0.0, "12"),
        (0.7312449, 0.5, "0.731245"),
        (0.5000000001, 0.5, "0.5000000001"),  # never shown as the bound it missed
        (math.nan, 0.5, "nan"),
    ],
)
def test_values_are_short_but_never_misleading(value: float, bound: float, text: str) -> None:
    outcome = Outcome(check=parse(f"p99 <= {bound}"), value=value, passed=False)
    assert outcome.value_text == text


# -- in a scenario -----------------------------------------------------------------------
GATED = """\
name = "gated"
instances = 2

[arrivals]
process = "steady"
rate = 40.0
total = 150

[[assert]]
check = "lost == 0"

[[assert]]
check = "succeeded != 150"
why = "shows a failing gate"
"""


def test_a_file_holds_gates_and_round_trips() -> None:
    scenario = sc.loads(GATED)
    assert scenario.asserts == (
        Gate(check="lost == 0"),
        Gate(check="succeeded != 150", why="shows a failing gate"),
    )
    assert sc.loads(scenario.to_toml()) == scenario
    assert scenario.to_dict()["assert"][1] == {
        "check": "succeeded != 150",
        "why": "shows a failing gate",
    }
    assert sc.with_overrides(scenario, {"instances": 3}).asserts == scenario.asserts
    assert Scenario().asserts == ()


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ('[[assert]]\ncheck = "lost == 0"\n[[assert]]\ncheck = "p999 < 1"', "assert[1].check",
         "names no figure 'p999'"),
        ('[[assert]]\ncheck = "p99 = 1"', "assert[0].check", "did you mean '=='?"),
        ('[[assert]]\ncheck = 0.5', "assert[0].check", "must be a string"),
        ('[[assert]]\ncheck = "p99 < 1"\nwhy = 3', "assert[0].why", "must be a string"),
        ('[[assert]]\nwhy = "x"', "assert[0].check", "is required"),
        ('[[assert]]\ncheck = "p99 < 1"\nwhen = 1', "assert[0].when", "not a scenario field"),
        ('[assert]\ncheck = "p99 < 1"', "assert", "array of tables ([[assert]])"),
        ('assert = ["p99 < 1"]', "assert[0]", "must be a table"),
        ('asserts = []', "asserts", "did you mean 'assert'?"),
    ],
)  # fmt: skip
def test_bad_gates_in_a_file_are_named(text: str, field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        sc.loads(text, source="my.toml")
    assert caught.value.field == field
    assert str(caught.value).startswith(f"my.toml: field '{field}'")
    assert words in str(caught.value)


def test_control_characters_in_a_gate_round_trip_through_toml() -> None:
    why = "tab\there, escape\x1b[2J, delete\x7f, bell\x07"
    scenario = Scenario(description="a\x01b", asserts=(Gate(check="p99 <= 0.5", why=why),))
    assert sc.loads(scenario.to_toml()) == scenario


def test_a_scenario_holds_only_gates() -> None:
    assert Scenario(asserts=[Gate(check="p99 < 1")]).asserts == (Gate(check="p99 < 1"),)  # type: ignore[arg-type]
    with pytest.raises(ScenarioError, match=r"field 'assert\[0\]' must be a Gate"):
        Scenario(asserts=("p99 < 1",))  # type: ignore[arg-type]
