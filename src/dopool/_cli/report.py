"""The report of one ``dopool simulate`` run: the summary and its tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dopool._cli._terminal import _clean
from dopool._sim.cost import Bill
from dopool._sim.driver import Run
from dopool._sim.latency import Latency
from dopool._sim.loading import BUILTINS, Change
from dopool._sim.metrics import Result, Stall
from dopool._sim.scenario import Scenario

HOT_ROWS = 10  # the instances table: the busiest, then the deepest queues, this many each
MAX_DEAD_LETTER_ROWS = 10


def _secs(value: float) -> str:
    if value == 0:
        return "0 s"
    if value < 10:
        return f"{value:.3f} s"
    return f"{value:,.1f} s"


def _bar(fraction: float, width: int = 10) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "█" * filled + "·" * (width - filled)


def _render_report(
    out: Console,
    chosen: Scenario,
    finished: Run,
    *,
    base: Scenario | None = None,
    changed: Sequence[Change] = (),
) -> None:
    result = finished.result
    out.print(Text(f"dopool simulate · {_clean(chosen.name)} · seed {chosen.seed}", style="bold"))
    _describe(out, chosen, base, changed)
    out.print()
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold", no_wrap=True)
    summary.add_column()
    summary.add_row(
        "events",
        f"{result.offered:,} offered · {result.acknowledged:,} enqueued"
        + (f" ({result.delayed:,} delayed)" if result.delayed else "")
        + " · "
        + (f"{result.follow_ups:,} follow-ups · " if result.follow_ups else "")
        + f"{result.succeeded:,} succeeded · {result.dead_lettered:,} dead-lettered · "
        f"{result.pending:,} pending · {result.lost:,} lost",
    )
    summary.add_row(
        "refused",
        f"{result.rejected:,} rejected (queue full) · "
        + (f"{result.duplicates:,} duplicates (dedup key held) · " if result.duplicates else "")
        + f"{result.failed:,} failed enqueues (instance crashed, nothing stored)"
        + (f" · {result.waiting:,} enqueues still waiting" if result.waiting else ""),
    )
    instances = f"{len(result.instances):,} instances" + (
        "" if all(pool.every_instance for pool in result.pools) else " used"
    )
    if len(result.pools) > 1:
        shape = f"{len(result.pools)} pools, {instances}"
    elif chosen.app is not None:
        shape = instances
    else:
        shape = f"{instances}, {chosen.routing} routing"
    summary.add_row(
        "throughput",
        f"{result.throughput:,.1f} events/s over {result.virtual_time:,.1f} virtual s "
        f"({shape}"
        + ("" if result.finished else ", stopped before every event was processed")
        + ")",
    )
    latency = result.latency
    counted = (
        f"{latency.count:,} finished events only"
        if latency.censored
        else (f"{latency.count:,} events")
    )
    start = "arrival, or end of its delay," if result.delayed else "arrival"
    summary.add_row("latency", f"{_percentiles(latency)}  ({start} to success, virtual, {counted})")
    if latency.censored:
        summary.add_row("unfinished", _unfinished(result), style="yellow")
    requests = result.requests
    if requests is not None:
        summary.add_row(
            "end to end",
            f"{_percentiles(requests.latency)}  (arrival to the success of the last event it "
            f"caused; {requests.completed:,} requests completed, {requests.failed:,} failed, "
            f"{requests.unfinished:,} unfinished)",
        )
    wait = result.enqueue_wait
    left = f"; {wait.unfinished:,} still waiting are not in it" if wait.censored else ""
    summary.add_row(
        "enqueue wait",
        f"p50 {_secs(wait.p50)} · p99 {_secs(wait.p99)} · max {_secs(wait.max)}  "
        f"(arrival to stored{left})",
    )
    summary.add_row("alarm policy", result.alarm_policy)
    if result.stalls:
        summary.add_row("stalls", _stalls(result))
    summary.add_row(
        "faults",
        f"{result.retries:,} retries · {result.crashes:,} crashes · "
        f"{result.restarts:,} restarts · {result.pauses:,} pauses",
    )
    active = result.activations
    summary.add_row(
        "activations",
        f"{active.started:,} started · {active.evicted:,} evicted · at most {active.peak:,} "
        f"running, {active.mean:,.1f} on average · {active.per_second:,.3g} started per "
        "virtual s",
    )
    month, run = _cost(result.cost)
    summary.add_row("cost", month)
    summary.add_row("", run)
    out.print(summary)
    out.print()
    if len(result.pools) > 1:
        out.print(_pools_table(result))
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


def _cost(bill: Bill) -> tuple[str, str]:
    """The bill's two lines: a month's dollars at the run's load, by line, largest first;
    then the run's own, and what it used."""
    month = bill.month()
    plan = month.pop("plan")
    named = {"requests": "requests", "duration": "duration", "rows_read": "rows read"}
    named |= {"rows_written": "rows written", "stored": "stored data"}
    billed = sorted(
        ((dollars, line) for line, dollars in month.items() if dollars > 0), reverse=True
    )
    lines = [f"{named[line]} {_dollars(dollars)}" for dollars, line in billed]
    lines.append(f"plan {_dollars(plan)}")
    if len(billed) < len(month):
        lines.append("the rest within the plan")
    total = sum(month.values()) + plan
    usage = bill.usage
    while_ = "while busy" if bill.prices.duration == "busy" else "while resident"
    return (
        f"{_dollars(total)} a month at this load on Cloudflare: " + " · ".join(lines),
        f"this run {_dollars(sum(bill.run().values()))}: {usage.requests:,} requests "
        f"({usage.enqueues:,} enqueues, {usage.alarms:,} alarms) · {bill.gb_s:,.3g} GB-s "
        f"{while_} · {usage.rows_read:,} rows read · {usage.rows_written:,} written · "
        f"{_bytes(usage.stored_bytes)} stored",
    )


def _dollars(amount: float) -> str:
    """``$1,234``, ``$12.34``, or ``$0.0012`` for less than a cent."""
    if amount >= 1000:
        return f"${amount:,.0f}"
    if amount >= 0.01 or amount == 0:
        return f"${amount:,.2f}"
    return f"${amount:.2g}"


def _bytes(count: int) -> str:
    """``512 B``, ``12.3 kB``, ``4.56 MB``, ``7.89 GB`` (decimal units, as billed)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:,.3g} {unit}"
    return f"{count} B"


def _describe(
    out: Console, chosen: Scenario, base: Scenario | None, changed: Sequence[Change]
) -> None:
    """The scenario's description, unless flags changed the design it describes: then
    it is shown as the base scenario's, with what the flags changed."""
    if not changed or base is None or chosen.description != base.description:
        if chosen.description:  # unchanged, or the flags gave it: the run's own
            out.print(Text(_clean(chosen.description), style="dim"))
    elif base.description:
        out.print(
            Text(f"base scenario {_clean(repr(base.name))}, before the flags: ", style="dim")
            + Text(_clean(base.description), style="dim italic")
        )
    if changed:
        out.print(Text("changed by flags: ", style="yellow") + Text(_clean(_listed(changed))))


def _listed(changed: Sequence[Change]) -> str:
    return ", ".join(str(change) for change in changed)


def _changed_comment(source: str, changed: Sequence[Change]) -> str:
    """TOML comment lines heading a scenario that flags changed (``--print-scenario``)."""
    if not changed:
        return ""
    what = f"built-in scenario {source!r}" if source in BUILTINS else f"scenario file {source!r}"
    listed = _listed(changed).replace("\n", " ")
    return (
        f"# {what} changed by flags: {listed}\n"
        "# (its description is of the scenario before the flags)\n"
    )


def _json_document(result: Result, changed: Sequence[Change]) -> dict[str, Any]:
    """``--json``: the result, and what flags changed of the scenario file or built-in."""
    document = result.to_json_dict()
    listed = [change.to_json_dict() for change in changed]
    return {"scenario": document.pop("scenario"), "changed_by_flags": listed, **document}


def _unfinished(result: Result) -> str:
    """What a run cut short left unfinished, and what that does to its latency figures."""
    parts = [f"{result.pending:,} pending ({result.in_progress:,} in a handler)"]
    if result.waiting:
        parts.append(f"{result.waiting:,} enqueues waiting")
    if result.outbox:
        parts.append(f"{result.outbox:,} follow-ups in flight")
    later = f"; {result.not_arrived:,} arrivals were due later" if result.not_arrived else ""
    return (
        f"{result.unfinished:,} events when the run stopped at {result.virtual_time:,.1f} "
        f"virtual s: {', '.join(parts)}{later}. Latency covers finished events only, a "
        "censored sample: the percentiles are optimistic."
    )


def _stalls(result: Result) -> str:
    """Who stalled (their alarm given up), how long, and who still holds events."""
    several = len(result.pools) > 1

    def name(stall: Stall) -> str:
        return f"{stall.pool}:{stall.instance}" if several else str(stall.instance)

    where = sorted({name(stall) for stall in result.stalls})
    end = result.virtual_time
    longest = max((end if s.until is None else s.until) - s.since for s in result.stalls)
    text = (
        f"{len(result.stalls):,} alarms given up (instance {', '.join(where[:8])}"
        f"{', ...' if len(where) > 8 else ''}); the longest stall {_secs(longest)}"
    )
    still = [stall for stall in result.stalls if stall.until is None]
    if still:
        held = sum(
            found.pending
            for stall in still
            for pool in result.pools
            if pool.name == stall.pool and (found := pool.instance(stall.instance)) is not None
        )
        text += (
            f"; {len(still):,} still stalled at the end (instance "
            f"{', '.join(name(s) for s in still[:8])}), holding {held:,} events until a write "
            "sets their alarm"
        )
    return _clean(text)


def _percentiles(latency: Latency) -> str:
    return (
        f"p50 {_secs(latency.p50)} · p95 {_secs(latency.p95)} · p99 {_secs(latency.p99)} · "
        f"max {_secs(latency.max)}"
    )


def _pools_table(result: Result) -> Table:
    table = Table(title="pools", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("pool")
    for name in ("offered", "enqueued", "succeeded", "dead", "pending", "retries"):
        table.add_column(name, justify="right")
    for name in ("p50", "p99"):
        table.add_column(name, justify="right")
    table.add_column("utilisation", no_wrap=True)
    for pool in result.pools:
        table.add_row(
            _clean(pool.name),
            f"{pool.offered:,}",
            f"{pool.enqueued:,}",
            f"{pool.succeeded:,}",
            f"{pool.dead_lettered:,}",
            f"{pool.pending:,}",
            f"{pool.retries:,}",
            _secs(pool.latency.p50),
            _secs(pool.latency.p99),
            f"{_bar(pool.utilisation)} {pool.utilisation:4.0%}",
        )
    return table


def _instances_table(result: Result) -> Table:
    table = Table(title="instances", title_justify="left", box=box.SIMPLE_HEAD)
    several = len(result.pools) > 1
    for name in ("instance", "enqueued", "succeeded", "dead", "pending", "attempts"):
        table.add_column(name, justify="right")
    table.add_column("crashes", justify="right")
    table.add_column("max depth", justify="right")
    table.add_column("utilisation", no_wrap=True)
    peak = result.max_depth
    shown = [result.instances[position] for position in result.hottest(HOT_ROWS)]
    if len(result.instances) > 2 * HOT_ROWS:
        table.title = (
            f"instances: the {HOT_ROWS} busiest, then the {HOT_ROWS} deepest queues of the others"
        )
    for item in shown:
        style = "bold red" if peak > 1 and item.max_depth == peak else ""
        named = str(item.index) if item.key is None else f"key {item.key}"
        table.add_row(
            _clean(f"{item.pool}:{named}") if several else _clean(named),
            f"{item.enqueued:,}",
            f"{item.succeeded:,}",
            f"{item.dead_lettered:,}",
            f"{item.pending:,}",
            f"{item.started:,}",
            f"{item.crashes:,}",
            Text(f"{item.max_depth:,}", style=style),
            f"{_bar(item.utilisation)} {item.utilisation:4.0%}",
        )
    hidden = len(result.instances) - len(shown)
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
    several = len(result.pools) > 1
    for letter in result.dead_letters[:MAX_DEAD_LETTER_ROWS]:
        instance = f"{letter['pool']}:{letter['instance']}" if several else str(letter["instance"])
        event = letter["event_id"]
        table.add_row(
            _clean(instance),
            str(letter["sequence"]),
            "-" if event is None else _clean(event),
            str(letter["attempts"]),
            f"t={letter['failed_at']:.2f}",
            Text(_clean(letter["error"])),
        )
    more = result.dead_lettered - min(len(result.dead_letters), MAX_DEAD_LETTER_ROWS)
    if more > 0:
        table.caption = f"and {more:,} more"
    return table
