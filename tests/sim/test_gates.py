"""Gates: ``--assert 'p99 <= 0.5'`` and ``[[assert]]`` (docs/simulate.md, "Gates").

The checks are parsed and compared on their own first, then in scenarios, then through
``dopool simulate``. Each simulation is small (150 events).
"""

from __future__ import annotations

import json
import math
import re
import shlex
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cli_support import assert_one_line_error, invoke
from dopool._cli import _gates as cli_gates
from dopool._cli import simulate as simulate_cli
from dopool._errors import ScenarioError
from dopool._sim import gates
from dopool._sim import loading as sc
from dopool._sim.driver import Run, run
from dopool._sim.figures import DESCRIPTIONS
from dopool._sim.gates import Check, GateError, Outcome, evaluate, parse
from dopool._sim.metrics import Invariant
from dopool._sim.scenario import Gate, Scenario

SMALL = ("--events", "150", "-q")


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


# -- dopool simulate --assert --------------------------------------------------------------
def test_gates_that_pass_exit_0_and_are_shown() -> None:
    result = invoke("simulate", *SMALL, "--assert", "p99 <= 60", "--assert", "lost==0")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    gates_at = next(i for i, line in enumerate(lines) if line.startswith("gates (--assert"))
    assert gates_at > next(i for i, line in enumerate(lines) if line.startswith("invariants"))
    shown = [line.split() for line in lines[gates_at:]]
    assert shown[4][:3] == ["p99", "<=", "60"]
    assert shown[4][-1] == "PASS"
    assert shown[5] == ["lost", "==", "0", "0", "PASS"]


def test_a_failing_gate_exits_1_with_one_line_each() -> None:
    result = invoke(
        "simulate",
        *SMALL,
        "--assert",
        "p99 <= 0.001",
        "--assert",
        "lost == 0",
        "--assert",
        "succeeded != 150",
    )
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert re.fullmatch(r"assertion failed: p99 <= 0\.001 \(p99 = 0\.\d+\)", lines[0])
    assert lines[1] == "assertion failed: succeeded != 150 (succeeded = 150)"
    assert result.stdout.count("FAIL") == 2
    assert result.stdout.count("PASS") == 1


def test_gates_without_a_gate_change_nothing() -> None:
    result = invoke("simulate", *SMALL)
    assert result.exit_code == 0
    assert "gates" not in result.stdout


@pytest.mark.parametrize(
    ("check", "words"),
    [
        ("p999 <= 0.5", ("--assert 'p999 <= 0.5'", "names no figure 'p999'", "closest: 'p99'",
                         "--list-figures")),
        ("p99 = 0.5", ("--assert 'p99 = 0.5'", "did you mean '=='?")),
        ("p99 <= fast", ("'fast', which is not a number",)),
        ("p99", ("has no comparison",)),
        ("p99\x1b[2J <= 1", ("\\x1b[2J",)),
    ],
)  # fmt: skip
def test_a_bad_assert_is_a_usage_error(check: str, words: tuple[str, ...]) -> None:
    assert_one_line_error(invoke("simulate", *SMALL, "--assert", check), 2, *words)


def test_gates_from_a_file_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "gated.toml"
    path.write_text(GATED)
    result = invoke("simulate", "-s", str(path), "-q", "--assert", "throughput > 0")
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [
        "assertion failed: succeeded != 150 (succeeded = 150): shows a failing gate"
    ]
    checks = [line.split()[:3] for line in result.stdout.splitlines() if "PASS" in line]
    assert checks == [["lost", "==", "0"], ["throughput", ">", "0"]]
    assert "shows a failing gate" in result.stdout


def test_a_why_is_printed_inert(tmp_path: Path) -> None:
    path = tmp_path / "inert.toml"
    path.write_text('[[assert]]\ncheck = "lost != 0"\nwhy = "clear\\u001b[2J[bold]x"\n')
    result = invoke("simulate", "-s", str(path), *SMALL)
    assert result.exit_code == 1, result.output
    assert result.stderr == "assertion failed: lost != 0 (lost = 0): clear\\x1b[2J[bold]x\n"
    assert "\x1b" not in result.stdout
    assert "clear\\x1b[2J[bold]x" in result.stdout


def test_a_bad_gate_in_a_file_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[assert]]\ncheck = "lost == 0"\n[[assert]]\ncheck = "p99 <= 500ms"\n')
    assert_one_line_error(
        invoke("simulate", "-s", str(path)),
        2,
        "bad.toml: field 'assert[1].check'",
        "'500ms', which is not a number",
    )


def test_print_scenario_writes_the_flags_gates_after_the_files(tmp_path: Path) -> None:
    path = tmp_path / "gated.toml"
    path.write_text(GATED)
    result = invoke("simulate", "-s", str(path), "--assert", "p99<=0.5", "--print-scenario")
    assert result.exit_code == 0, result.output
    assert tomllib.loads(result.stdout)["assert"][-1] == {"check": "p99<=0.5"}
    assert [gate.check for gate in sc.loads(result.stdout).asserts] == [
        "lost == 0",
        "succeeded != 150",
        "p99<=0.5",
    ]


def test_json_holds_the_assertions_byte_identical(tmp_path: Path) -> None:
    outputs = []
    for attempt in range(2):
        target = tmp_path / f"r{attempt}.json"
        result = invoke(
            "simulate",
            *SMALL,
            "--seed",
            "5",
            "--assert",
            "p99 <= 60",
            "--assert",
            "retries>0",
            "--json",
            str(target),
        )
        assert result.exit_code == 1, result.output
        outputs.append(target.read_bytes())
    assert outputs[0] == outputs[1]
    document = json.loads(outputs[0])
    assert [item["expr"] for item in document["assertions"]] == ["p99 <= 60", "retries > 0"]
    first, second = document["assertions"]
    assert set(first) == {"expr", "figure", "op", "bound", "value", "passed", "why"}
    assert (first["figure"], first["op"], first["bound"], first["passed"]) == (
        "p99",
        "<=",
        60.0,
        True,
    )
    assert first["value"] == pytest.approx(document["latency"]["p99"], abs=1e-6)
    assert (second["value"], second["passed"], second["why"]) == (0.0, False, None)
    assert document["scenario"]["assert"] == [
        {"check": "p99 <= 60", "why": None},
        {"check": "retries>0", "why": None},
    ]


def test_json_without_gates_has_an_empty_list(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    assert invoke("simulate", *SMALL, "--json", str(target)).exit_code == 0
    assert json.loads(target.read_text())["assertions"] == []


def test_list_figures_names_every_figure_plainly() -> None:
    result = invoke("simulate", "--list-figures")
    assert result.exit_code == 0
    assert "\x1b" not in result.stdout  # not a terminal: no colours
    lines = result.stdout.splitlines()
    assert lines[0].strip() == "figures (what --assert and [[assert]] compare)"
    rows = {words[0]: " ".join(words[1:]) for line in lines[4:] if (words := line.split())}
    for name, meaning in DESCRIPTIONS.items():
        assert rows[name] == meaning
    assert lines[-1].startswith("gate a run: dopool simulate --assert 'p99 <= 0.5'")


def test_assert_applies_to_a_single_run_not_a_sweep(tmp_path: Path) -> None:
    assert_one_line_error(
        invoke("simulate", "--sweep", "instances=1,2", "--assert", "p99 < 1"),
        2,
        "--assert applies to a single run",
    )
    path = tmp_path / "gated.toml"
    path.write_text(GATED)
    result = invoke("simulate", "-s", str(path), "-q", "--sweep", "instances=1,2")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "note: a sweep does not check the scenario's 2 [[assert]] gates; run one value "
        "without --sweep to check them"
    ]


def test_gates_cannot_be_set_as_a_field() -> None:
    assert_one_line_error(
        invoke("simulate", "--set", "assert=p99<1"), 2, "field 'assert'", "or by --assert"
    )


def test_a_failed_gate_and_a_broken_invariant_both_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Run:
        finished = run(*args, **kwargs)
        invariants = [Invariant("no loss", passed=False, detail="made up for the test")]
        return replace(finished, result=replace(finished.result, invariants=invariants))

    monkeypatch.setattr(simulate_cli, "run", broken)  # what the command calls
    result = invoke("simulate", *SMALL, "--assert", "lost != 0", "--assert", "invariants_passed==1")
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert lines[:2] == [
        "assertion failed: lost != 0 (lost = 0)",
        "assertion failed: invariants_passed == 1 (invariants_passed = 0)",
    ]
    assert lines[2].startswith("Error: invariants failed: no loss")


def test_a_gate_on_a_figure_the_run_lacks_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_gates, "figures", lambda result: {})
    result = invoke("simulate", *SMALL, "--assert", "p99 < 1")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: gate 'p99 < 1' names no figure 'p99'")
    assert len(result.stderr.splitlines()) == 1


# -- the documented examples ---------------------------------------------------------------
DOCS = Path(__file__).parents[2] / "docs" / "simulate.md"


def documented_runs() -> list[tuple[list[str], int, list[str]]]:
    """docs/simulate.md's gate commands: (arguments, the exit status and the failure lines
    shown after them). A command shown without ``echo $?`` is one that passes."""
    text = DOCS.read_text(encoding="utf-8").split("\n## Gates\n", 1)[1].split("\n## ", 1)[0]
    text = text.replace("\\\n", " ")
    runs: list[tuple[list[str], int, list[str]]] = []
    lines = text.splitlines()
    for position, line in enumerate(lines):
        command = line.strip().removeprefix("$ ")
        if command.startswith("dopool simulate "):
            runs.append((shlex.split(command)[1:], 0, []))
        elif line.startswith("assertion failed: ") and runs and lines[position - 1] != "```text":
            runs[-1][2].append(line)
        elif line == "$ echo $?":
            runs[-1] = (runs[-1][0], int(lines[position + 1]), runs[-1][2])
    return runs


def test_the_documented_gates_run_as_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the CI step writes capacity.json
    runs = documented_runs()
    assert [status for _, status, _ in runs] == [1, 0, 0]
    for args, status, failures in runs:
        result = invoke(*args)
        assert result.exit_code == status, (args, result.output)
        assert result.stderr.splitlines() == failures
    assert (tmp_path / "capacity.json").exists()
