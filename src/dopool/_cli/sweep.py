"""``dopool simulate --sweep/--repeat``: the flags, the runs' progress, the table, JSON, plot.

The sweep itself (the grid, the runs, the statistics) is :mod:`dopool._sim.sweep`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from dopool._cli._errors import CliError, CliUsageError
from dopool._cli._terminal import _clean, _console
from dopool._cli._values import _write_json
from dopool._errors import ConfigurationError
from dopool._sim.executors import Executor, check_available
from dopool._sim.scenario import Scenario
from dopool._sim.sweep import (
    DEFAULT_FIGURES,
    MAX_REPEAT,
    Estimate,
    SweepError,
    SweepResult,
    check_axes,
    check_figures,
    label,
    parse_axis,
    run_sweep,
    unit,
    value_text,
)
from dopool._sim.sweep_plot import plot_sweep

DEFAULT_PLOT_FIGURE = "p99"


def sweep_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The flags of a sweep, as click options of ``dopool simulate``."""
    options = (
        click.option(
            "--sweep",
            "sweep_specs",
            multiple=True,
            metavar="FIELD=VALUES",
            help="run once per value of a numeric field; give it again for a grid. "
            "VALUES: 1,2,4 or a range 1..8 (step 1), 2..32x2 (factor), 0.1..0.5+0.1 (step)",
        ),
        click.option(
            "--repeat",
            type=click.IntRange(1, MAX_REPEAT),
            default=None,
            metavar="K",
            help="run each point with seeds seed..seed+K-1 and show mean ± 95% interval",
        ),
        click.option(
            "--jobs",
            "-j",
            type=click.IntRange(min=1),
            default=None,
            metavar="N",
            help="run a sweep in N processes (the output does not depend on N) "
            "[the number of CPUs this process may use]; with --executor ray, N runs at a "
            "time [all: the cluster schedules them]",
        ),
        click.option(
            "--executor",
            callback=executor_option,
            default=None,
            metavar="local|ray[=ADDRESS]",
            help="where a sweep's runs run: local processes, or Ray tasks on a local Ray "
            "or the cluster at ADDRESS (the ray extra; the output is the same) [local]",
        ),
        click.option(
            "--sweep-figures",
            metavar="NAME,...",
            help=f"a sweep table's columns, figure names [{', '.join(DEFAULT_FIGURES)}]",
        ),
        click.option(
            "--plot-figure",
            metavar="NAME",
            help=f"the figure a sweep's --plot draws [{DEFAULT_PLOT_FIGURE}]",
        ),
    )
    for option in reversed(options):
        function = option(function)
    return function


def executor_option(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> Executor | None:
    """``--executor local|ray[=ADDRESS]`` read (a bad one is a usage error)."""
    if value is None:
        return None
    try:
        return Executor.parse(value)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


@dataclass(frozen=True, slots=True)
class SweepFlags:
    """What ``--sweep``, ``--repeat``, ``--jobs``, ``--executor``, ``--sweep-figures``,
    ``--plot-figure`` said."""

    specs: tuple[str, ...]
    repeat: int | None
    jobs: int | None
    figures: str | None
    plot_figure: str | None
    executor: Executor | None = None

    @property
    def active(self) -> bool:
        """A sweep table rather than one run's report: ``--sweep`` or ``--repeat`` given."""
        return bool(self.specs) or self.repeat is not None

    def check_unused(self) -> None:
        """Refuse the sweep-only flags on a single run."""
        for flag, value in (
            ("--jobs", self.jobs),
            ("--executor", self.executor),
            ("--sweep-figures", self.figures),
            ("--plot-figure", self.plot_figure),
        ):
            if value is not None:
                raise CliUsageError(f"{flag} needs --sweep or --repeat")


def run_sweep_command(
    out: Console,
    chosen: Scenario,
    flags: SweepFlags,
    *,
    json_path: Path | None,
    plot_path: Path | None,
    store_path: Path | None,
    quiet: bool,
) -> None:
    """Check every flag, run the sweep, print its table, write its JSON and plot."""
    try:
        axes = [parse_axis(spec, chosen) for spec in flags.specs]
        repeat = flags.repeat or 1
        check_axes(axes, repeat)
        names: tuple[str, ...] = DEFAULT_FIGURES
        if flags.figures is not None:
            names = check_figures([n.strip() for n in flags.figures.split(",") if n.strip()])
        plot_name = check_figures([flags.plot_figure or DEFAULT_PLOT_FIGURE], "--plot-figure")[0]
    except SweepError as exc:
        raise CliUsageError(str(exc)) from None
    if plot_path is not None and not axes:
        raise CliUsageError("--plot with --repeat needs a --sweep to draw against")
    executor = flags.executor or Executor()
    check_available(executor)
    started = time.perf_counter()
    with _progress(quiet) as progress:
        result = run_sweep(
            chosen,
            axes,
            repeat=repeat,
            jobs=flags.jobs,
            store=store_path,
            progress=progress,
            executor=executor,
        )
    elapsed = time.perf_counter() - started
    for name in [*names, plot_name] if plot_path is not None else names:
        if any(name not in point.figures for point in result.points):
            raise CliError(f"the figure '{name}' was not measured in this sweep")
    _render(out, result, names)
    runs = len(result.points) * repeat
    out.print(f"{runs:,} runs · wall time {elapsed:.1f} s")
    written = []
    if json_path is not None:
        _write_json(json_path, result.to_json_dict())
        written.append(f"json {json_path}")
    if plot_path is not None:
        plot_sweep(result, plot_name, plot_path)
        written.append(f"plot {plot_path}")
    if store_path is not None:
        written.append(f"stores under {store_path}")
    if written:
        click.echo("wrote " + ", ".join(written))
    broken = [
        f"{label(result.axes, point.values) or 'the scenario'} "
        f"(seed{'s' if len(point.failed) > 1 else ''} "
        f"{', '.join(str(seed) for seed, _ in point.failed)})"
        for point in result.points
        if not point.passed
    ]
    if broken:
        raise CliError(f"invariants failed at {'; '.join(broken)}; see the table above")


@contextmanager
def _progress(quiet: bool) -> Iterator[Callable[[int, int], None]]:
    """A bar of runs done on stderr (only on a terminal)."""
    err = _console(stderr=True)
    bar = Progress(
        TextColumn("sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("runs"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=quiet or not err.is_terminal,
    )
    task = bar.add_task("sweep", total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    with bar:
        yield update


def _render(out: Console, result: SweepResult, names: Sequence[str]) -> None:
    fields = [axis.field for axis in result.axes]
    seed = result.scenario.seed
    if result.repeat == 1:
        seeds = f"seed {seed}"
    elif "seed" in fields:
        seeds = f"{result.repeat} seeds per point, mean ± 95% interval"
    else:
        seeds = f"seeds {seed}..{seed + result.repeat - 1}, mean ± 95% interval"
    swept = f" · sweep {', '.join(fields)}" if fields else ""
    name = _clean(result.scenario.name)
    out.print(Text(f"dopool simulate · {name}{swept} · {seeds}", style="bold"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for field in fields:
        table.add_column(field, justify="right", style="bold", no_wrap=True)
    for name in names:
        symbol = unit(name)
        table.add_column(f"{name}\n{symbol}", justify="right", no_wrap=True)
    table.add_column("invariants", no_wrap=True)
    for point in result.points:
        cells: list[str | Text] = [value_text(v) for v in point.values]
        cells.extend(estimate_text(point.figures[name], unit(name)) for name in names)
        if point.passed:
            cells.append(Text("pass", style="green"))
        else:
            cells.append(Text(f"FAIL {len(point.failed)}/{result.repeat}", style="bold red"))
        table.add_row(*cells)
    if not out.is_terminal:  # a file or a pipe: every column, however wide
        wide = out.options.update_width(10_000)
        out.width = max(out.width, out.measure(table, options=wide).maximum)
    out.print(table)


def estimate_text(estimate: Estimate, symbol: str) -> str:
    """``0.339 ± 0.021``: the half-width to two significant digits, the mean to match."""
    scale = 100.0 if symbol == "%" else 1.0
    mean = estimate.mean * scale
    half = estimate.half_width
    if half is None or half == 0 or not math.isfinite(half):
        return _plain(mean, symbol)
    half *= scale
    decimals = max(0, min(6, 1 - math.floor(math.log10(half))))
    return f"{mean:,.{decimals}f} ± {half:,.{decimals}f}"


def _plain(value: float, symbol: str) -> str:
    if not math.isfinite(value):
        return str(value)
    if symbol == "s":
        if value == 0:
            return "0"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if symbol in ("%", "/s"):
        return f"{value:,.1f}"
    if symbol == "$":
        return f"{value:,.2f}"
    if value.is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}"
