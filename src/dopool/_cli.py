"""The ``dopool`` command line: ``simulate``, ``status``, ``dead-letters``, ``check``, ``chaos``.

Only the console script imports this module (click and rich are the ``cli``
extra). The work is done elsewhere: :mod:`dopool._sim.driver` runs scenarios,
:mod:`dopool._sim.storeview` reads and maintains real stores. Here are the
flags, the rendering, and one rule: an error is one line on stderr
(``Error: ...``) and a non-zero exit, never a traceback. Exit codes: 0 done,
1 a failure (an invariant broke, a store is locked or missing), 2 a bad flag
or scenario.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
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
except ImportError as exc:  # the console script, installed without the ``cli`` extra
    raise SystemExit(
        f"Error: the dopool command line needs click and rich ({exc.name} is missing): "
        "pip install 'dopool[cli]'"
    ) from None

from dopool._check import CheckReport, report_json
from dopool._errors import DopoolError, StoreLockedError
from dopool._sim import loading as scenarios
from dopool._sim.driver import Run, run, sweep
from dopool._sim.metrics import Result
from dopool._sim.plot import check_available, plot
from dopool._sim.scenario import Scenario, ScenarioError
from dopool._sim.storeview import StoreView, open_view, purge, redrive
from dopool._types import DeadLetter, PoolStatus

_LETTER_FIELDS = dataclasses.fields(DeadLetter)

USAGE_EXIT = 2
FAILURE_EXIT = 1
REPORT_WIDTH = 120  # when stdout is not a terminal (a file, a pipe, a test)
MAX_INSTANCE_ROWS = 64
MAX_DEAD_LETTER_ROWS = 10
JSON_TAGS = (
    '(bytes as {"$base64": ...}, NaN and infinities as {"$float": "NaN"}, a map with '
    'non-str keys as {"$map": [[key, value], ...]}: see docs/simulate.md)'
)
REAL_TIME_FROM = 1e9  # an alarm time above this is a real clock's epoch seconds
MAX_PLAIN_TIME = 1e15  # a time this large or more prints in exponent form

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


# C0 controls, DEL and C1 controls: a terminal acts on them (ESC starts a sequence that can
# clear the screen or retitle the window), so stored text prints them as escapes instead.
# So do the bidirectional overrides and isolates, which reorder the text around them.
_ESCAPES = {
    code: {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code, f"\\x{code:02x}")
    for code in (*range(0x20), *range(0x7F, 0xA0))
} | {code: f"\\u{code:04x}" for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def _clean(text: object) -> str:
    """Text from a store (or any outside source) made safe for a terminal, on one line.

    Control characters become escapes like ``\\x1b``. Rich markup is not touched here:
    hand the result to rich inside a :class:`~rich.text.Text`, which is never parsed.
    """
    return str(text).translate(_ESCAPES)


class CliError(click.ClickException):
    """Printed as one ``Error: ...`` line on stderr; exits 1."""

    exit_code = FAILURE_EXIT


class CliUsageError(CliError):
    """A bad flag or scenario: one ``Error: ...`` line, exit 2."""

    exit_code = USAGE_EXIT


class _OneLineErrors(click.Group):
    """A group whose usage errors are one line too (click prints usage and a hint)."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line():
            return super().invoke(ctx)


@contextmanager
def _one_line() -> Iterator[None]:
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise
    except click.UsageError as exc:
        hint = ""
        if exc.ctx is not None:
            hint = f" (see '{exc.ctx.command_path} --help')"
        raise CliUsageError(exc.format_message() + hint) from None
    except ScenarioError as exc:
        raise CliUsageError(_clean(exc)) from None
    except StoreLockedError as exc:
        raise CliError(
            f"{_clean(exc)}; stop that runtime first (--redrive and --purge need the store lock)"
        ) from None
    except DopoolError as exc:
        raise CliError(_clean(exc)) from None


def _console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else REPORT_WIDTH
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dopool", prog_name="dopool")
def cli() -> None:
    """Durable Object worker pools: simulate a design, inspect a store."""


def main() -> None:
    """The ``dopool`` console script."""
    cli(prog_name="dopool")


# -- chaos ------------------------------------------------------------------------------
@cli.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def chaos(args: tuple[str, ...]) -> None:
    """Run the chaos harness: seeded scenarios under fault plans, invariants checked.

    --seeds N [--start S] [--jobs J] runs N scenarios; --seed S replays one exactly.
    See 'dopool chaos --help'.
    """
    from dopool._chaos.harness import main as harness  # noqa: PLC0415 - loaded on demand

    sys.exit(harness(list(args)))


# -- simulate ---------------------------------------------------------------------------
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


@cli.command(context_settings={"max_content_width": 100})
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
    if print_scenario:
        click.echo(chosen.to_toml(), nl=False)
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
    _render_report(out, chosen, finished)
    if json_path is not None:
        _write_json(json_path, result.to_json_dict())
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
    if path is not None and not path.parent.exists():
        raise CliError(f"{flag} {str(path)!r}: directory {str(path.parent)!r} does not exist")


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


# -- the report -------------------------------------------------------------------------
def _secs(value: float) -> str:
    if value == 0:
        return "0 s"
    if value < 10:
        return f"{value:.3f} s"
    return f"{value:,.1f} s"


def _bar(fraction: float, width: int = 10) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "█" * filled + "·" * (width - filled)


def _render_report(out: Console, chosen: Scenario, finished: Run) -> None:
    result = finished.result
    out.print(Text(f"dopool simulate · {chosen.name} · seed {chosen.seed}", style="bold"))
    if chosen.description:
        out.print(Text(chosen.description, style="dim"))
    out.print()
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold", no_wrap=True)
    summary.add_column()
    summary.add_row(
        "events",
        f"{result.offered:,} offered · {result.acknowledged:,} enqueued · "
        f"{result.succeeded:,} succeeded · {result.dead_lettered:,} dead-lettered · "
        f"{result.pending:,} pending · {result.lost:,} lost",
    )
    summary.add_row(
        "refused",
        f"{result.rejected:,} rejected (queue full) · "
        f"{result.failed:,} failed enqueues (instance crashed, nothing stored)"
        + (f" · {result.waiting:,} enqueues still waiting" if result.waiting else ""),
    )
    routing = chosen.routing
    summary.add_row(
        "throughput",
        f"{result.throughput:,.1f} events/s over {result.virtual_time:,.1f} virtual s "
        f"({chosen.instances} instances, {routing} routing"
        + ("" if result.finished else ", stopped before every event was processed")
        + ")",
    )
    latency = result.latency
    summary.add_row(
        "latency",
        f"p50 {_secs(latency.p50)} · p95 {_secs(latency.p95)} · p99 {_secs(latency.p99)} · "
        f"max {_secs(latency.max)}  (arrival to success, virtual, {latency.count:,} events)",
    )
    wait = result.enqueue_wait
    summary.add_row(
        "enqueue wait",
        f"p50 {_secs(wait.p50)} · p99 {_secs(wait.p99)} · max {_secs(wait.max)}  "
        "(arrival to stored)",
    )
    summary.add_row(
        "faults",
        f"{result.retries:,} retries · {result.crashes:,} crashes · "
        f"{result.restarts:,} restarts · {result.pauses:,} pauses",
    )
    out.print(summary)
    out.print()
    out.print(_instances_table(result))
    out.print(_invariants_table(result))
    if result.dead_letters:
        out.print(_dead_letter_sample(result))
    out.print(
        Text(
            f"wall time {finished.wall_seconds:.2f} s · "
            f"{finished.events_per_wall_second:,.0f} events per wall second · "
            f"{result.pool_events:,} pool events",
            style="dim",
        )
    )


def _instances_table(result: Result) -> Table:
    table = Table(title="instances", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("instance", "enqueued", "succeeded", "dead", "pending", "attempts"):
        table.add_column(name, justify="right")
    table.add_column("crashes", justify="right")
    table.add_column("max depth", justify="right")
    table.add_column("utilisation", no_wrap=True)
    peak = result.max_depth
    for item in result.instances[:MAX_INSTANCE_ROWS]:
        style = "bold red" if peak > 1 and item.max_depth == peak else ""
        table.add_row(
            str(item.index),
            f"{item.enqueued:,}",
            f"{item.succeeded:,}",
            f"{item.dead_lettered:,}",
            f"{item.pending:,}",
            f"{item.started:,}",
            f"{item.crashes:,}",
            Text(f"{item.max_depth:,}", style=style),
            f"{_bar(item.utilisation)} {item.utilisation:4.0%}",
        )
    hidden = len(result.instances) - MAX_INSTANCE_ROWS
    if hidden > 0:
        table.caption = f"{hidden} more instances: see --json"
    return table


def _invariants_table(result: Result) -> Table:
    table = Table(
        title="invariants (docs/guarantees.md), checked at the end",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    table.add_column("check", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("detail")
    for check in result.invariants:
        verdict = Text("pass", style="green") if check.passed else Text("FAIL", style="bold red")
        table.add_row(check.name, verdict, check.detail)
    return table


def _dead_letter_sample(result: Result) -> Table:
    table = Table(title="dead letters", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("instance", "sequence", "event", "attempts", "failed at", "error"):
        table.add_column(name, justify="right" if name != "error" else "left")
    for letter in result.dead_letters[:MAX_DEAD_LETTER_ROWS]:
        table.add_row(
            str(letter["instance"]),
            str(letter["sequence"]),
            str(letter["event_id"]),
            str(letter["attempts"]),
            f"t={letter['failed_at']:.2f}",
            Text(_clean(letter["error"])),
        )
    more = result.dead_lettered - min(len(result.dead_letters), MAX_DEAD_LETTER_ROWS)
    if more > 0:
        table.caption = f"and {more:,} more"
    return table


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


# -- status and dead-letters --------------------------------------------------------------
def _chosen_pools(view: StoreView, pool: str | None) -> dict[str, int]:
    known = view.pools()
    if pool is None:
        return known
    if pool not in known:
        listed = ", ".join(_clean(name) for name in sorted(known)) or "none"
        raise CliError(
            f"no pool named {_clean(repr(pool))} in store {_clean(repr(str(view.path)))} "
            f"(pools: {listed})"
        )
    return {pool: known[pool]}


def _when(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= REAL_TIME_FROM:
        try:
            moment = _dt.datetime.fromtimestamp(value, _dt.UTC)
        except (OverflowError, OSError, ValueError):
            pass  # past the calendar (a crafted store): print the number
        else:
            return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
    if abs(value) < MAX_PLAIN_TIME:
        return f"t={value:,.3f}"
    return f"t={value:.6g}"  # inf, nan, and numbers too long to print in full


class _Raw(str):
    """Text a walk below emits as it is, rather than a value to convert."""


def _json_text(document: Any) -> str:
    """``document`` as indented JSON that any strict parser accepts.

    What JSON cannot hold is tagged (docs/simulate.md, "JSON output"): bytes as
    ``{"$base64": ...}``, a non-finite float as ``{"$float": "NaN"}`` (or
    ``"Infinity"``, ``"-Infinity"``), a map with any key that is not a str as
    ``{"$map": [[key, value], ...]}``, anything else as ``{"$repr": repr(value)}``.
    It walks without recursion: an event may nest a thousand levels deep.
    """
    out: list[str] = []
    stack: list[Any] = [(document, 0)]
    while stack:
        top = stack.pop()
        if isinstance(top, _Raw):
            out.append(top)
            continue
        value, depth = top
        value = _json_tagged(value)
        pairs: list[tuple[str, Any]]
        if isinstance(value, dict) and value:
            opening, closing = "{", "}"
            pairs = [(json.dumps(key) + ": ", item) for key, item in value.items()]
        elif isinstance(value, list) and value:
            opening, closing = "[", "]"
            pairs = [("", item) for item in value]
        else:
            out.append(json.dumps(value, allow_nan=False))  # a scalar, [] or {}
            continue
        out.append(opening)
        inner = "\n" + "  " * (depth + 1)
        stack.append(_Raw("\n" + "  " * depth + closing))
        for position in reversed(range(len(pairs))):
            prefix, item = pairs[position]
            stack.append((item, depth + 1))
            stack.append(_Raw(("," if position else "") + inner + prefix))
    return "".join(out)


def _json_tagged(value: Any) -> Any:
    """``value`` itself if JSON holds it, else its tagged stand-in (one level deep)."""
    if value is None or isinstance(value, bool | int | str | list):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"$float": "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value):
            return value
        return {"$map": [[key, item] for key, item in value.items()]}
    return {"$repr": repr(value)}


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--pool", "pool_name", metavar="NAME", help="only this pool")
@click.option("--json", "as_json", is_flag=True, help=f"print JSON instead of tables {JSON_TAGS}")
def status(path: Path, pool_name: str | None, as_json: bool) -> None:
    """Print every pool's status from the store at PATH (read-only).

    It takes no lock, so it works while a runtime holds the store.
    """
    with open_view(path) as view:
        pools = _chosen_pools(view, pool_name)
        statuses = [view.status(name, count) for name, count in sorted(pools.items())]
    if as_json:
        document = {"store": str(path), "pools": [dataclasses.asdict(s) for s in statuses]}
        click.echo(_json_text(document))
        return
    out = _console()
    if not statuses:
        out.print(Text(f"store {_clean(path)}: no pools"))
        return
    for item in statuses:
        out.print(_status_table(item))


def _status_table(item: PoolStatus) -> Table:
    table = Table(
        title=Text(
            f"pool {_clean(item.name)} · {item.concurrency} instances · "
            f"{item.enqueued:,} enqueued · {item.pending:,} pending · "
            f"{item.succeeded:,} succeeded · {item.dead_lettered:,} dead-lettered · "
            f"{item.drained:,} drained"
        ),
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    table.add_column("instance", no_wrap=True)
    table.add_column("state")
    for name in ("pending", "enqueued", "succeeded", "dead", "drained", "restarts"):
        table.add_column(name, justify="right")
    table.add_column("current", justify="right")
    table.add_column("next alarm", no_wrap=True)
    styles = {"paused": "yellow", "processing": "green", "backoff": "magenta", "idle": "dim"}
    for s in item.instances:
        current = "-" if s.current_sequence is None else f"#{s.current_sequence} (try {s.attempt})"
        table.add_row(
            Text(_clean(s.instance_id)),
            Text(s.state, style=styles.get(s.state, "")),
            f"{s.pending:,}",
            f"{s.enqueued:,}",
            f"{s.succeeded:,}",
            f"{s.dead_lettered:,}",
            f"{s.drained:,}",
            f"{s.restarts:,}",
            current,
            _when(s.next_alarm_at),
        )
    return table


@cli.command("dead-letters")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--pool", "pool_name", metavar="NAME", help="only this pool")
@click.option("--redrive", "do_redrive", is_flag=True, help="re-enqueue them (needs the lock)")
@click.option("--purge", "do_purge", is_flag=True, help="delete them (needs the lock)")
@click.option("--limit", default=100, show_default=True, help="list at most this many")
@click.option("--json", "as_json", is_flag=True, help=f"print JSON instead of a table {JSON_TAGS}")
def dead_letters(
    path: Path,
    pool_name: str | None,
    do_redrive: bool,
    do_purge: bool,
    limit: int,
    as_json: bool,
) -> None:
    """List the dead letters in the store at PATH, or --redrive or --purge them.

    Listing is read-only. Acting takes the store lock: stop the runtime that
    holds the store first. Redriven events run when the pool's own runtime
    next opens the store.
    """
    if do_redrive and do_purge:
        raise CliUsageError("--redrive and --purge exclude each other")
    with open_view(path) as view:
        pools = _chosen_pools(view, pool_name)
        letters = {name: view.dead_letters(name, count) for name, count in sorted(pools.items())}
    if do_redrive or do_purge:
        _act(path, pools, redrive_them=do_redrive)
        return
    if as_json:
        # Not dataclasses.asdict: it copies the event recursively, and events nest deep.
        document = [
            {"pool": name} | {field.name: getattr(letter, field.name) for field in _LETTER_FIELDS}
            for name, found in letters.items()
            for letter in found
        ][: max(limit, 0)]
        click.echo(_json_text(document))
        return
    out = _console()
    _print_dead_letters(out, path, letters, limit)


def _print_dead_letters(
    out: Console, path: Path, letters: dict[str, list[DeadLetter]], limit: int
) -> None:
    total = sum(len(found) for found in letters.values())
    if total == 0:
        out.print(Text(f"store {_clean(path)}: no dead letters"))
        return
    out.print(Text(f"{total:,} dead letters in {_clean(path)}", style="bold"))
    shown = 0
    for name, found in letters.items():
        for letter in found:
            if shown >= limit:
                break
            shown += 1
            attempts = f"{letter.attempts} attempt" + ("" if letter.attempts == 1 else "s")
            key = "" if letter.partition_key is None else f" · key {_clean(letter.partition_key)}"
            out.print()
            out.print(
                Text(f"{_clean(name)}:{letter.instance_index} #{letter.sequence}", style="bold"),
                Text(f"· {attempts} · failed {_when(letter.failed_at)}{key}"),
            )
            out.print(Text(f"  error: {_clean(letter.error)}"), soft_wrap=True)
            if letter.damaged:
                out.print(Text("  damaged record: never redriven", style="red"))
            out.print(Text(f"  event: {_clean(_short(letter.event, 200))}"), soft_wrap=True)
    if total > shown:
        out.print()
        out.print(f"{total - shown:,} more: raise --limit")


def _short(event: Any, width: int = 60) -> str:
    """``repr(event)``, cut to ``width`` characters.

    It writes lists and maps itself, without recursion (an event may nest deeper
    than ``repr`` can go), and stops once it has enough.
    """
    parts: list[str] = []
    size = 0
    stack: list[Any] = [event]
    while stack and size <= width:
        value = stack.pop()
        if isinstance(value, _Raw):
            text: str = value
        elif isinstance(value, list | tuple | dict) and value:
            items = list(value.items()) if isinstance(value, dict) else list(value)
            closing = "}" if isinstance(value, dict) else "]" if isinstance(value, list) else ")"
            if isinstance(value, tuple) and len(value) == 1:
                closing = ",)"
            stack.append(_Raw(closing))
            for position in reversed(range(len(items))):
                if isinstance(value, dict):
                    key, item = items[position]
                    stack.extend((item, _Raw(": "), key))
                else:
                    stack.append(items[position])
                if position:
                    stack.append(_Raw(", "))
            text = "{" if isinstance(value, dict) else "[" if isinstance(value, list) else "("
        else:
            text = repr(value)
        parts.append(text)
        size += len(text)
    text = "".join(parts)
    return text if len(text) <= width and not stack else text[: width - 1] + "…"


def _act(path: Path, pools: dict[str, int], *, redrive_them: bool) -> None:
    if not pools:
        click.echo(f"store {_clean(path)}: no pools")
        return
    done = redrive(path, pools) if redrive_them else purge(path, pools)
    verb = "redrove" if redrive_them else "purged"
    for name, count in done.items():
        line = f"{verb} {count:,} dead letters of pool '{_clean(name)}'"
        if redrive_them and count:
            line += " (they run when the pool's runtime next opens the store)"
        click.echo(line)


# -- check ---------------------------------------------------------------------------------
@cli.command()
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
