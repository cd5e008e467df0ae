"""``dopool simulate``: its flags, the scenario they build, the progress bar, sweeps."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from dopool._cli._errors import CliError, CliUsageError
from dopool._cli._terminal import _console
from dopool._cli._values import _json_text
from dopool._cli.report import _changed_comment, _json_document, _render_report, _secs
from dopool._sim import loading as scenarios
from dopool._sim.checks import ScenarioError
from dopool._sim.driver import run, sweep
from dopool._sim.plot import check_available, plot
from dopool._sim.scenario import Scenario

# Flags that set one scenario field each: (option name, dotted field, help).
FIELD_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--instances", "instances", "number of instances (pool concurrency)"),
    ("--routing", "routing", "round-robin, or partition (by partition key)"),
    ("--arrival", "arrivals.process", "arrival process: steady, poisson or bursts"),
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
    ("--max-attempts", "retry.max_attempts", "attempts per event, the first included"),
    ("--max-queue-depth", "max_queue_depth", "pending events one instance accepts ('none')"),
    ("--duration", "duration", "stop at this virtual time ('none' = run until done)"),
)
_FIELD_OF = {flag: path for flag, path, _ in FIELD_FLAGS}
_FLAG_OF = {path: flag for flag, path, _ in FIELD_FLAGS}


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
@click.option(
    "--sweep",
    "sweep_spec",
    metavar="FIELD=V1,V2,...",
    help="run once per value of a numeric field and print one row each",
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
    help="draw queue depth and latency to a PNG (needs dopool[plot])",
)
@click.option(
    "--store",
    "store_path",
    type=click.Path(file_okay=False, path_type=Path),
    help="keep the store in this (new or empty) directory instead of a temporary one",
)
@click.option("--list", "list_only", is_flag=True, help="list the built-in scenarios and exit")
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
    sweep_spec: str | None,
    json_path: Path | None,
    trace_path: Path | None,
    plot_path: Path | None,
    store_path: Path | None,
    list_only: bool,
    print_scenario: bool,
    quiet: bool,
    **fields: str | None,
) -> None:
    """Run a scenario on the real engine in virtual time and print a report.

    Same scenario, same seed: the same run, and byte-identical --json and --trace.

    \b
    Examples:
      dopool simulate --scenario hot-partition --seed 7
      dopool simulate --scenario my-design.toml --instances 16 --rate 300
      dopool simulate --scenario steady --sweep instances=1,2,4,8,16
    """
    out = _console()
    if list_only:
        _list_scenarios(out)
        return
    chosen = _build_scenario(scenario_name, seed, fields, settings)
    base = scenarios.resolve(scenario_name)
    changed = scenarios.changes(base, chosen)
    if print_scenario:
        click.echo(_changed_comment(scenario_name, changed) + chosen.to_toml(), nl=False)
        return
    for flag, target in (("--json", json_path), ("--trace", trace_path), ("--plot", plot_path)):
        _check_output(flag, target)
    if plot_path is not None:
        check_available()
    if sweep_spec is not None:
        for flag, target in (("--trace", trace_path), ("--plot", plot_path)):
            if target is not None:
                raise CliUsageError(f"{flag} cannot be used with --sweep")
        field, values = _parse_sweep(sweep_spec)
        _run_sweep(out, chosen, field, values, json_path, store_path, quiet)
        return
    with _progress(quiet) as report:
        finished = run(chosen, store=store_path, trace=trace_path, progress=report(chosen.name))
    result = finished.result
    _render_report(out, chosen, finished, base=base, changed=changed)
    if json_path is not None:
        _write_json(json_path, _json_document(result, changed))
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
    if not result.passed:
        failed = ", ".join(check.name for check in result.invariants if not check.passed)
        raise CliError(f"invariants failed: {failed} (seed {chosen.seed}); see the report above")


def _build_scenario(
    name: str, seed: int | None, fields: dict[str, str | None], settings: tuple[str, ...]
) -> Scenario:
    base = scenarios.resolve(name)
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
    if not overrides:
        return base
    try:
        return scenarios.with_overrides(base, overrides)
    except ScenarioError as exc:
        source = sources.get(exc.field, "flags")
        raise exc.from_source(source) from None


def _parse_sweep(spec: str) -> tuple[str, list[Any]]:
    field, sep, text = spec.partition("=")
    field = field.strip()
    if not sep or not text.strip():
        raise CliUsageError(f"--sweep expects FIELD=V1,V2,..., got {spec!r}")
    numeric = scenarios.numeric_fields()
    if field not in numeric:
        import difflib  # noqa: PLC0415 - only on this error path

        close = difflib.get_close_matches(field, numeric, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ScenarioError(field, f"is not a numeric scenario field{hint}", source="--sweep")
    values = [
        scenarios.parse_value(field, part.strip()) for part in text.split(",") if part.strip()
    ]
    if not values:
        raise CliUsageError("--sweep needs at least one value")
    return field, values


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


def _write_json(path: Path, document: Any) -> None:
    try:
        path.write_text(_json_text(document) + "\n", encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None


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
        task: TaskID = bar.add_task(label, total=None, now=0.0)

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


def _run_sweep(
    out: Console,
    chosen: Scenario,
    field: str,
    values: list[Any],
    json_path: Path | None,
    store_path: Path | None,
    quiet: bool,
) -> None:
    with _progress(quiet) as report:
        callbacks = [report(f"{field}={value}") for value in values]

        def progress(position: int, now: float, done: int, expected: int) -> None:
            callbacks[position](now, done, expected)

        runs = sweep(chosen, field, values, store=store_path, progress=progress)
    out.print(
        Text(f"dopool simulate · {chosen.name} · seed {chosen.seed} · sweep {field}", style="bold")
    )
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column(field, justify="right", style="bold")
    for name in ("throughput /s", "p50", "p99", "max depth", "dead letters", "rejected", "lost"):
        table.add_column(name, justify="right")
    table.add_column("invariants")
    table.add_column("wall", justify="right")
    for value, finished in runs:
        result = finished.result
        table.add_row(
            str(value),
            f"{result.throughput:,.1f}",
            _secs(result.latency.p50),
            _secs(result.latency.p99),
            f"{result.max_depth:,}",
            f"{result.dead_lettered:,}",
            f"{result.rejected:,}",
            f"{result.lost:,}",
            Text("pass", style="green") if result.passed else Text("FAIL", style="bold red"),
            f"{finished.wall_seconds:.1f} s",
        )
    out.print(table)
    if json_path is not None:
        document = {
            "sweep": {"field": field, "values": values},
            "runs": [
                {"value": value, **finished.result.to_json_dict()} for value, finished in runs
            ],
        }
        _write_json(json_path, document)
        click.echo(f"wrote json {json_path}")
    broken = [str(value) for value, finished in runs if not finished.result.passed]
    if broken:
        raise CliError(f"invariants failed at {field} = {', '.join(broken)}")
