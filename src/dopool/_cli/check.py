"""``dopool check``: a store's records and counters verified, as a report or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.text import Text

from dopool._cli._errors import FAILURE_EXIT
from dopool._cli._terminal import _clean, _console
from dopool._ops.check import CheckReport, report_json
from dopool._ops.storeview import open_view


@click.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a report")
def check(path: Path, as_json: bool) -> None:
    """Verify every record of the store at PATH and every instance's counters (read-only).

    Exits 0 if nothing is wrong, 1 if anything is (each problem is listed).
    """
    with open_view(path) as view:
        report = view.check()
    if as_json:
        click.echo(json.dumps(report_json(report), indent=2))
    else:
        _print_check(_console(), path, report)
    if not report.ok:
        raise SystemExit(FAILURE_EXIT)


def _print_check(out: Console, path: Path, report: CheckReport) -> None:
    pools = ", ".join(f"{_clean(name)} ({count})" for name, count in report.pools.items())
    out.print(
        Text(
            f"store {_clean(path)}: format {report.format_version}, {report.records:,} records, "
            f"{report.instances:,} instances; pools: {pools or 'none'}"
        ),
        soft_wrap=True,
    )
    if report.ok:
        out.print(Text("ok: every record and every counter checks out", style="green"))
        return
    out.print(Text(f"{len(report.problems):,} problems:", style="bold red"))
    for problem in report.problems:
        where = problem.instance or "store"
        key = "" if problem.key is None else f" (key {problem.key!r})"
        out.print(Text(_clean(f"  {where}: {problem.what}{key}")), soft_wrap=True)
