"""``dopool simulate``'s gates: ``--assert`` read, checked and shown; ``--list-figures``."""

from __future__ import annotations

from dataclasses import replace

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dopool._cli._errors import CliUsageError
from dopool._cli._terminal import _clean
from dopool._sim import gates
from dopool._sim.figures import DESCRIPTIONS, E2E_DESCRIPTIONS, POOL_DESCRIPTIONS, figures
from dopool._sim.metrics import Result
from dopool._sim.scenario import Gate, Scenario


def _with_flag_gates(scenario: Scenario, texts: tuple[str, ...]) -> Scenario:
    """``scenario`` with each ``--assert`` added after its file's gates."""
    if not texts:
        return scenario
    added = []
    for text in texts:
        try:
            gates.parse(text)
        except gates.GateError as exc:
            raise CliUsageError(_clean(f"--assert {text!r} {exc}")) from None
        added.append(Gate(check=text.strip()))
    return replace(scenario, asserts=(*scenario.asserts, *added))


def _check_gates(scenario: Scenario, result: Result) -> list[gates.Outcome]:
    """Every gate of ``scenario`` (its file's, then the flags') checked on ``result``."""
    if not scenario.asserts:
        return []
    named = figures(result)
    outcomes = []
    for gate in scenario.asserts:
        try:
            outcomes.append(gates.evaluate(gates.parse(gate.check), named, why=gate.why))
        except gates.GateError as exc:  # a figure named by the docs that this run lacks
            raise CliUsageError(_clean(f"gate {gate.check!r} {exc}")) from None
    return outcomes


def _gates_table(outcomes: list[gates.Outcome]) -> Table:
    """The gates after the report: each check, the figure's value, PASS or FAIL."""
    # Titles and cells as Text: rich would read "[[assert]]" as markup.
    shown = Table(
        title=Text("gates (--assert, [[assert]])"), title_justify="left", box=box.SIMPLE_HEAD
    )
    shown.add_column("check", no_wrap=True)
    shown.add_column("value", justify="right", no_wrap=True)
    shown.add_column("result", no_wrap=True)
    with_why = any(outcome.why for outcome in outcomes)
    if with_why:
        shown.add_column("why")
    for outcome in outcomes:
        verdict = Text("PASS", style="green") if outcome.passed else Text("FAIL", style="bold red")
        row = [Text(_clean(outcome.check.expr)), Text(outcome.value_text), verdict]
        if with_why:
            row.append(Text(_clean(outcome.why or "")))
        shown.add_row(*row)
    return shown


def _report_failures(outcomes: list[gates.Outcome]) -> bool:
    """One line on stderr per failed gate; whether any failed."""
    failed = [outcome for outcome in outcomes if not outcome.passed]
    for outcome in failed:
        click.echo(_clean(outcome.failure()), err=True)
    return bool(failed)


def _list_figures(out: Console) -> None:
    """``--list-figures``: every figure a gate may name, with what it means."""
    listed = Table(
        title=Text("figures (what --assert and [[assert]] compare)"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    listed.add_column("figure", style="bold", no_wrap=True)
    listed.add_column("meaning")
    for name, meaning in DESCRIPTIONS.items():
        listed.add_row(Text(name), Text(meaning))
    for name, meaning in E2E_DESCRIPTIONS.items():
        listed.add_row(Text(f"e2e.{name}"), Text(f"with follow-ups: {meaning}"))
    for name, meaning in POOL_DESCRIPTIONS.items():
        listed.add_row(Text(f"<pool>.{name}"), Text(f"with several pools: {meaning}"))
    out.print(listed)
    out.print("gate a run: dopool simulate --assert 'p99 <= 0.5' (latencies in virtual seconds)")
