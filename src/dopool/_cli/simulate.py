"""``dopool simulate``: its flags, the scenario they build, the progress bar.

Its gates (``--assert``, ``--list-figures``) are :mod:`dopool._cli._gates`;
sweeps (``--sweep``, ``--repeat``) are :mod:`dopool._cli.sweep`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from dopool._cli._errors import FAILURE_EXIT, CliError, CliInterrupted, CliUsageError
from dopool._cli._gates import (
    _check_gates,
    _gates_table,
    _list_figures,
    _report_failures,
    _with_flag_gates,
)
from dopool._cli._terminal import _clean, _console
from dopool._cli._values import _write_json
from dopool._cli.report import _changed_comment, _json_document, _render_report
from dopool._cli.sweep import SweepFlags, run_sweep_command, sweep_options
from dopool._errors import ScenarioError
from dopool._sim import loading as scenarios
from dopool._sim.driver import run
from dopool._sim.executors import Executor
from dopool._sim.plot import check_available, plot
from dopool._sim.scenario import Scenario

# Flags that set one scenario field each: (option name, dotted field, help).
FIELD_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--instances", "instances", "number of instances (pool concurrency), or per-key"),
    ("--routing", "routing", "round-robin, or partition (by partition key)"),
    (
        "--arrival",
        "arrivals.process",
        "arrival process: steady, poisson, bursts, phases, daily or replay",
    ),
    ("--rate", "arrivals.rate", "arrivals per virtual second (steady, poisson)"),
    ("--events", "arrivals.total", "total events to arrive"),
    (
        "--arrival-duration",
        "arrivals.duration",
        "virtual seconds of arrivals (instead of --events)",
    ),
    ("--burst-size", "arrivals.burst_size", "events per burst"),
    ("--burst-interval", "arrivals.burst_interval", "virtual seconds between bursts"),
    ("--keys", "partitions.keys", "number of partition keys"),
    ("--zipf", "partitions.zipf", "Zipf exponent of the key popularity (0 = uniform)"),
    ("--hot-key-share", "partitions.hot_key_share", "share of events sent to key k0 on top"),
    ("--payload-bytes", "payload_bytes", "padding bytes per event"),
    ("--service", "service.distribution", "service time: fixed, exponential or lognormal"),
    ("--service-mean", "service.mean", "mean service time, virtual seconds"),
    ("--service-sigma", "service.sigma", "lognormal shape (std. dev. of the log)"),
    ("--failure-probability", "failure_probability", "chance that an attempt fails"),
    ("--poison-share", "poison_share", "share of events that fail on every attempt"),
    ("--duplicate-share", "duplicate_share", "share of arrivals repeating a recent dedup key"),
    ("--dedup-window", "dedup_window", "virtual seconds a finished dedup key stays held"),
    ("--idle-timeout", "idle_timeout", "virtual seconds an idle instance runs before eviction"),
    (
        "--rate-limit",
        "rate_limit",
        "attempts the pool may start per virtual second, or text such as 30/m ('none')",
    ),
    ("--delayed-share", "delayed_share", "share of arrivals enqueued with --delay"),
    ("--delay", "delay", "virtual seconds a delayed arrival waits before it is due"),
    ("--max-attempts", "retry.max_attempts", "attempts per event, the first included"),
    ("--max-queue-depth", "max_queue_depth", "pending events one instance accepts ('none')"),
    ("--duration", "duration", "stop at this virtual time ('none' = run until done)"),
    ("--app", "app", "your code: module:function (or file.py:function) defining the pools"),
)
_FIELD_OF = {flag: path for flag, path, _ in FIELD_FLAGS}


def _field_options(function: Callable[..., Any]) -> Callable[..., Any]:
    for flag, path, text in reversed(FIELD_FLAGS):
        function = click.option(
            flag,
            _param_name(flag),
            metavar="VALUE",
            default=None,
            help=f"{text} [{path}]",
        )(function)
    return function


def _param_name(flag: str) -> str:
    return "field_" + flag.lstrip("-").replace("-", "_")


@click.command(context_settings={"max_content_width": 100})
@click.option(
    "--scenario",
    "-s",
    "scenario_name",
    default="steady",
    show_default=True,
    metavar="NAME|FILE",
    help=f"a built-in scenario ({', '.join(scenarios.BUILTINS)}) or a TOML file",
)
@click.option("--seed", type=int, default=None, help="seed of every random draw of the run")
@_field_options
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="FIELD=VALUE",
    help="set any scenario field by its dotted name, e.g. --set faults.crash_before_execute=0.01",
)
@sweep_options
@click.option(
    "--assert",
    "assertions",
    multiple=True,
    metavar="CHECK",
    help="a gate, FIGURE OP NUMBER, e.g. --assert 'p99 <= 0.5': exit 1 if it fails "
    "(repeatable; operators <= < >= > == !=; figures: --list-figures)",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="write the figures as JSON (no wall-clock figures: same seed, same bytes)",
)
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="write every pool event as JSON lines",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="draw queue depth and latency to a PNG, or a sweep's --plot-figure (needs dopool[plot])",
)
@click.option(
    "--store",
    "store_path",
    type=click.Path(file_okay=False, path_type=Path),
    help="keep the store in this (new or empty) directory instead of a temporary one",
)
@click.option("--list", "list_only", is_flag=True, help="list the built-in scenarios and exit")
@click.option(
    "--list-figures", is_flag=True, help="list the figures a gate (--assert) can name and exit"
)
@click.option(
    "--print-scenario",
    is_flag=True,
    help="print the scenario as TOML (after flags) and exit: a start for your own file",
)
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
def simulate(
    scenario_name: str,
    seed: int | None,
    settings: tuple[str, ...],
    sweep_specs: tuple[str, ...],
    repeat: int | None,
    jobs: int | None,
    executor: Executor | None,
    sweep_figures: str | None,
    plot_figure: str | None,
    assertions: tuple[str, ...],
    json_path: Path | None,
    trace_path: Path | None,
    plot_path: Path | None,
    store_path: Path | None,
    list_only: bool,
    list_figures: bool,
    print_scenario: bool,
    quiet: bool,
    **fields: str | None,
) -> None:
    """Run a scenario on the real engine in virtual time and print a report.

    Same scenario, same seed: the same run, and byte-identical --json and --trace.
    Gates (--assert, [[assert]] in a file) exit 1 if one fails.

    \b
    Examples:
      dopool simulate --scenario hot-partition --seed 7
      dopool simulate --scenario my-design.toml --instances 16 --rate 300
      dopool simulate --scenario steady --sweep instances=1,2,4,8,16
      dopool simulate --scenario my-design.toml --rate 100 --assert 'p99 <= 0.5'
      dopool simulate --sweep instances=2..8x2 --sweep arrivals.rate=50,100 --repeat 5 -j 2
      dopool simulate --sweep instances=2..32x2 --repeat 20 --executor ray=head:6379
    """
    out = _console()
    if list_only:
        _list_scenarios(out)
        return
    if list_figures:
        _list_figures(out)
        return
    chosen = _with_flag_gates(_build_scenario(scenario_name, seed, fields, settings), assertions)
    try:
        base: Scenario | None = scenarios.resolve(scenario_name)
    except ScenarioError:  # the file needs the flags (say --app, for its pools' names)
        base = None
    changed = [] if base is None else scenarios.changes(base, chosen)
    if print_scenario:
        click.echo(_changed_comment(scenario_name, changed) + chosen.to_toml(), nl=False)
        return
    for flag, target in (("--json", json_path), ("--trace", trace_path), ("--plot", plot_path)):
        _check_output(flag, target)
    if plot_path is not None:
        check_available()
    sweeping = SweepFlags(sweep_specs, repeat, jobs, sweep_figures, plot_figure, executor)
    if sweeping.active:
        if trace_path is not None:
            raise CliUsageError("--trace cannot be used with --sweep or --repeat")
        if assertions:
            raise CliUsageError("--assert applies to a single run; it cannot be used with --sweep")
        if chosen.asserts:
            click.echo(
                f"note: a sweep does not check the scenario's {len(chosen.asserts)} "
                "[[assert]] gates; run one value without --sweep to check them",
                err=True,
            )
        try:
            run_sweep_command(
                out,
                chosen,
                sweeping,
                json_path=json_path,
                plot_path=plot_path,
                store_path=store_path,
                quiet=quiet,
            )
        except KeyboardInterrupt:
            raise _interrupted("sweep", None, store_path) from None
        return
    sweeping.check_unused()
    try:
        with _progress(quiet) as report:
            finished = run(chosen, store=store_path, trace=trace_path, progress=report(chosen.name))
    except KeyboardInterrupt:
        raise _interrupted("run", trace_path, store_path) from None
    result = finished.result
    _render_report(out, chosen, finished, base=base, changed=changed)
    outcomes = _check_gates(chosen, result)
    if outcomes:
        out.print()
        out.print(_gates_table(outcomes))
    if json_path is not None:
        document = _json_document(result, changed)
        document["assertions"] = [outcome.to_json_dict() for outcome in outcomes]
        _write_json(json_path, document)
    if plot_path is not None:
        plot(result, plot_path, title=f"{chosen.name} (seed {chosen.seed})")
    written = [
        f"{label} {path}"
        for label, path in (("json", json_path), ("trace", trace_path), ("plot", plot_path))
        if path is not None
    ]
    if store_path is not None:
        written.append(f"store {store_path}")
    if written:
        click.echo("wrote " + ", ".join(written))
    gate_failed = _report_failures(outcomes)
    if not result.passed:
        failed = ", ".join(check.name for check in result.invariants if not check.passed)
        raise CliError(f"invariants failed: {failed} (seed {chosen.seed}); see the report above")
    if gate_failed:
        raise click.exceptions.Exit(FAILURE_EXIT)


def _build_scenario(
    name: str, seed: int | None, fields: dict[str, str | None], settings: tuple[str, ...]
) -> Scenario:
    overrides: dict[str, str] = {}
    sources: dict[str, str] = {}
    for param, value in fields.items():
        if value is None:
            continue
        flag = "--" + param.removeprefix("field_").replace("_", "-")
        overrides[_FIELD_OF[flag]] = value
        sources[_FIELD_OF[flag]] = flag
    for setting in settings:
        path, sep, value = setting.partition("=")
        path = path.strip()
        if not sep or not path:
            raise CliUsageError(f"--set expects FIELD=VALUE, got {setting!r}")
        overrides[path] = value.strip()
        sources[path] = f"--set {path}"
    if seed is not None:
        overrides["seed"] = str(seed)
        sources["seed"] = "--seed"
    try:
        return scenarios.resolve(name, overrides)
    except ScenarioError as exc:
        if exc.field in sources:
            raise exc.from_source(sources[exc.field]) from None
        raise


def _interrupted(what: str, trace: Path | None, store: Path | None) -> CliInterrupted:
    """Ctrl-C: the run (or sweep) stopped, its runtime closed, its temporary stores removed."""
    text = f"interrupted: the {what} stopped before its end, so nothing was reported"
    if trace is not None:
        text += f"; the trace {str(trace)!r} ends where it stopped"
    if store is not None:
        text += f"; {str(store)!r} holds the store{'s' if what == 'sweep' else ''} as far as it got"
    return CliInterrupted(text)


def _check_output(flag: str, path: Path | None) -> None:
    """A path an output cannot be written to is a usage error (exit 2), found before the run."""
    if path is None:
        return
    folder = path.parent
    problem = None
    if not folder.exists():
        problem = f"directory {str(folder)!r} does not exist"
    elif not folder.is_dir():
        problem = f"{str(folder)!r} is not a directory"
    elif path.exists() and not os.access(path, os.W_OK):
        problem = "the file is not writable"
    elif not path.exists() and not os.access(folder, os.W_OK | os.X_OK):
        problem = f"directory {str(folder)!r} is not writable"
    if problem is not None:
        raise CliUsageError(f"{flag} {str(path)!r}: {problem}")


ProgressFactory = Callable[[str], Callable[[float, int, int], None]]


@contextmanager
def _progress(quiet: bool) -> Iterator[ProgressFactory]:
    """A progress bar on stderr (only on a terminal); yields a per-run callback factory."""
    err = _console(stderr=True)
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("events · t={task.fields[now]:.1f} virtual s"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=quiet or not err.is_terminal,
    )

    def factory(label: str) -> Callable[[float, int, int], None]:
        # A description is rich markup: the scenario's name is text ("[/x]" raised).
        task: TaskID = bar.add_task(escape(_clean(label)), total=None, now=0.0)

        def update(now: float, done: int, expected: int) -> None:
            bar.update(task, completed=done, total=max(expected, 1), now=now)

        return update

    with bar:
        yield factory


def _list_scenarios(out: Console) -> None:
    table = Table(
        title="built-in scenarios", show_lines=True, title_justify="left", box=box.SIMPLE_HEAD
    )
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("what it teaches")
    for name in scenarios.BUILTINS:
        table.add_row(name, scenarios.builtin(name).description)
    out.print(table)
    out.print("run one: dopool simulate --scenario NAME [--seed N]")
