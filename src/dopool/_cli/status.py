"""``dopool status``: every pool's status in a store, as tables or JSON.

The tables fit the screen (:func:`~dopool._cli._terminal._screen`): as wide as
``COLUMNS``, else the terminal; in a pipe or a file, plain aligned text (no colour, no box
drawing), every column shown unless ``COLUMNS`` sets a width. A header is never cut:
where not every column fits, the first of :data:`PRIORITY` are kept, as many as fit, and
the others named under the table; ``--json`` has them all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from dopool._cli._store import _chosen_pools, _when
from dopool._cli._terminal import Screen, _clean, _screen
from dopool._cli._values import JSON_TAGS, _json_text
from dopool._cluster.units import named, unit_of
from dopool._machine.status import Listing
from dopool._ops.storeview import open_view
from dopool._store.layout import LeaseRecord
from dopool._store.leaseclock import estimate_lease_time
from dopool._types import PoolStatus

# An instance's columns, in the order they print ("key" only in a pool with an instance per
# key, "lease" only where a worker leased the pool).
COLUMNS = (
    "instance",
    "key",
    "state",
    "pending",
    "scheduled",
    "enqueued",
    "succeeded",
    "dead",
    "drained",
    "restarts",
    "current",
    "next alarm",
    "lease",
)
# Which of them a narrow screen keeps: the first of these, as many as fit. Which instance;
# what it is doing and what waits for it; who serves it; then the counters the pool's title
# line sums.
PRIORITY = (
    "instance",
    "key",
    "state",
    "pending",
    "dead",
    "current",
    "lease",
    "next alarm",
    "restarts",
    "scheduled",
    "succeeded",
    "enqueued",
    "drained",
)
RIGHT = {"pending", "scheduled", "enqueued", "succeeded", "dead", "drained", "restarts", "current"}
# In a terminal these wrap inside their column (a long partition key, a long host name)
# rather than crowd the others out: they need this many cells at least.
FOLDED = {"key", "lease"}
FOLDED_WIDTH = 24
STATE_STYLES = {
    "paused": "yellow",
    "processing": "green",
    "backoff": "magenta",
    "throttled": "blue",
    "stalled": "red",
    "idle": "dim",
}


@click.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--pool", "pool_name", metavar="NAME", help="only this pool")
@click.option(
    "--from",
    "first",
    type=click.IntRange(min=0),
    default=0,
    metavar="INDEX",
    help="list the instances used from this index on",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="list at most N instances of each pool (default: every one used)",
)
@click.option("--json", "as_json", is_flag=True, help=f"print JSON instead of tables {JSON_TAGS}")
def status(path: Path, pool_name: str | None, first: int, limit: int | None, as_json: bool) -> None:
    """Print every pool's status from the store at PATH (read-only).

    The counters are the whole pool's; the instances listed are those ever used (from
    --from, at most --limit of them). It takes no lock, so it works while a runtime
    holds the store.

    The tables fit COLUMNS, else the terminal; in a pipe they are plain aligned text,
    every column shown unless COLUMNS is set. Where not every column fits, the first
    of these are kept, as many as fit, and the others named under the table:
    instance, key, state, pending, dead, current, lease, next alarm, restarts,
    scheduled, succeeded, enqueued, drained.
    """
    with open_view(path) as view:
        pools = _chosen_pools(view, pool_name)
        statuses = [
            view.status(name, count, Listing(range(min(first, count), count), limit))
            for name, count in sorted(pools.items())
        ]
        incoming = [view.follow_ups_to(status.name) for status in statuses]
        leases = view.leases()
    now = estimate_lease_time(path)  # leases expire by the host's lease clock
    if as_json:
        documents = [
            {
                **dataclasses.asdict(status),
                "follow_ups_in_outboxes": waiting,
                "leases": {
                    named(unit, status.concurrency): _lease_json(record, now)
                    for (pool, unit), record in sorted(leases.items())
                    if pool == status.name
                },
            }
            for status, waiting in zip(statuses, incoming, strict=True)
        ]
        click.echo(_json_text({"store": str(path), "pools": documents}))
        return
    screen = _screen()
    if not statuses:
        _say(screen, f"store {_clean(path)}: no pools")
        return
    for number, (item, waiting) in enumerate(zip(statuses, incoming, strict=True)):
        served = {unit: record for (pool, unit), record in leases.items() if pool == item.name}
        if number:
            _say(screen, "")
        _print_sheet(screen, _sheet(item, waiting, served, now))


def _lease_json(record: LeaseRecord, now: float) -> dict[str, Any]:
    """A lease for ``--json``: its owner, and seconds until it expires."""
    return {**record._asdict(), "expires_in": round(record.expires_at - now, 3)}


@dataclass
class _Sheet:
    """One pool's status as text, before it is fitted to a screen."""

    title: list[str]  # the parts of its title line, joined by " · "
    columns: list[str]  # those of COLUMNS it has
    rows: list[dict[str, Text]]  # an instance's cells, by column
    notes: list[str] = field(default_factory=list)  # what the table does not say
    holders: list[str] = field(default_factory=list)  # each worker that serves it

    @cached_property
    def widths(self) -> dict[str, int]:
        """The cells each column needs to print its header and its cells whole."""
        return {
            name: max([cell_len(name), *(row[name].cell_len for row in self.rows)])
            for name in self.columns
        }


def _sheet(
    item: PoolStatus, waiting: dict[str, int], leases: dict[int, LeaseRecord], now: float
) -> _Sheet:
    """``leases``: the pool's, by lease unit."""
    title = [
        f"pool {_clean(item.name)}",
        f"{item.concurrency:,} instance{'' if item.concurrency == 1 else 's'}",
        f"{item.enqueued:,} enqueued",
        f"{item.pending:,} pending"
        + (f" ({item.scheduled:,} scheduled)" if item.scheduled else ""),
        f"{item.succeeded:,} succeeded",
        f"{item.dead_lettered:,} dead-lettered"
        + (f" ({item.expired:,} expired)" if item.expired else ""),
        f"{item.drained:,} drained",
    ]
    title += [f"{item.cancelled:,} cancelled"] if item.cancelled else []
    title += [f"{item.duplicates:,} duplicates"] if item.duplicates else []
    title += [f"{item.schedules:,} schedules"] if item.schedules else []
    keyed = any(s.key is not None for s in item.instances)  # a per-key pool's
    columns = [
        name
        for name in COLUMNS
        if (name != "key" or keyed) and (name != "lease" or leases)  # unleased: no column
    ]
    rows = []
    for s in item.instances:
        current = "-" if s.current_sequence is None else f"#{s.current_sequence} (try {s.attempt})"
        counts = (s.pending, s.scheduled, s.enqueued, s.succeeded, s.dead_lettered, s.drained)
        cells = {
            "instance": Text(_clean(s.instance_id)),
            "key": Text(_clean(s.key or "-")),
            "state": Text(s.state, style=STATE_STYLES.get(s.state, "")),
            **{name: Text(f"{count:,}") for name, count in zip(COLUMNS[3:9], counts, strict=True)},
            "restarts": Text(f"{s.restarts:,}"),
            "current": Text(current),
            "next alarm": Text(_when(s.next_alarm_at)),
            "lease": _lease_text(leases.get(unit_of(s.index, item.concurrency)), now),
        }
        rows.append({name: cells[name] for name in columns})
    sheet = _Sheet(title, columns, rows, holders=_holders(leases, now))
    listed = len(item.instances)
    if item.used < item.concurrency or listed < item.used:  # not every instance listed
        sheet.notes.append(
            f"{item.used:,} of the {item.concurrency:,} instances used"
            + (f", {listed:,} listed (--from, --limit)" if listed < item.used else "")
        )
    if item.paused:
        sheet.notes.append("paused as a whole: an instance never used starts paused")
    if waiting:  # follow-ups for this pool, committed, not in its queues yet
        places = ", ".join(f"{_clean(ident)} ({count:,})" for ident, count in waiting.items())
        total = sum(waiting.values())
        sheet.notes.append(f"{total:,} follow-ups on their way, in outboxes: {places}")
    return sheet


def _holders(leases: dict[int, LeaseRecord], now: float) -> list[str]:
    """Who serves a pool's instances: each worker, its leases, and the least time left."""
    held: dict[tuple[int, str], list[float]] = {}
    for record in leases.values():
        held.setdefault((record.pid, record.host), []).append(record.expires_at - now)
    parts = []
    for (pid, host), left in sorted(held.items()):
        least = min(left)
        state = f"{least:,.0f}s left" if least > 0 else f"expired {-least:,.0f}s ago"
        parts.append(f"{pid}@{_clean(host)} holds {len(left):,} ({state})")
    return parts


def _lease_text(record: LeaseRecord | None, now: float) -> Text:
    """Who serves an instance, ``PID@HOST``, and how long its lease has left."""
    if record is None:
        return Text("-", style="dim")
    left = record.expires_at - now
    who = f"{record.pid}@{_clean(record.host)}"
    if left <= 0:
        return Text(f"{who} expired {-left:,.0f}s ago", style="red")
    return Text(f"{who} {left:,.0f}s")


# -- fitting a sheet to the screen ----------------------------------------------------------


def _print_sheet(screen: Screen, sheet: _Sheet) -> None:
    """The title, the table of the columns that fit, the notes (one names the columns left
    out), and who holds the pool's leases."""
    kept = _fit(sheet, screen)
    left_out = [name for name in sheet.columns if name not in kept]
    notes = list(sheet.notes)
    if left_out:
        notes.append(
            f"not shown in {screen.width} columns: {', '.join(left_out)} "
            "(a wider COLUMNS or --json shows them)"
        )
    holders = ["leases: " + sheet.holders[0], *sheet.holders[1:]] if sheet.holders else []
    title = _wrapped(sheet.title, " · ", screen.width)
    notes = [line for note in notes for line in _wrapped(note.split(" "), " ", screen.width)]
    holders = _wrapped(holders, ", ", screen.width)
    if screen.plain:
        for line in [*title, *_plain_table(sheet, kept), *notes, *holders]:
            screen.console.out(line, highlight=False)
        return
    out = screen.console
    for line in title:
        out.print(Text(line, style="table.title"))
    least = _table_width(sheet, kept, plain=False)  # more than the screen: wider, not cut
    out.print(_rich_table(sheet, kept), width=max(out.width, least), crop=False)
    for line in notes:
        out.print(Text(line, style="table.caption"))
    for line in holders:
        out.print(Text(line))


def _fit(sheet: _Sheet, screen: Screen) -> list[str]:
    """The columns shown: every one when the screen has no width; else the first of
    PRIORITY, as many as fit (the instance always), in the order they print."""
    if screen.width is None:
        return sheet.columns
    ranked = [name for name in PRIORITY if name in sheet.columns]
    kept = ranked[:1]
    for name in ranked[1:]:
        if _table_width(sheet, [*kept, name], plain=screen.plain) > screen.width:
            break
        kept.append(name)
    return [name for name in sheet.columns if name in kept]


def _table_width(sheet: _Sheet, columns: list[str], *, plain: bool) -> int:
    """The width of the table of ``columns``: as plain text, two spaces between columns;
    as rich's table, a cell of padding, a rule and a cell of padding between columns (a
    folded column counted at its least)."""
    if plain:
        return sum(sheet.widths[name] for name in columns) + 2 * (len(columns) - 1)
    widths = [
        min(sheet.widths[name], max(cell_len(name), FOLDED_WIDTH))
        if name in FOLDED
        else sheet.widths[name]
        for name in columns
    ]
    return sum(widths) + 3 * (len(columns) - 1)


def _plain_table(sheet: _Sheet, columns: list[str]) -> list[str]:
    """The table as plain lines: a header line, then a line per instance, aligned."""
    widths = sheet.widths

    def line(cells: dict[str, str]) -> str:
        return "  ".join(
            _pad(cells[name], widths[name], right=name in RIGHT) for name in columns
        ).rstrip()

    return [
        line({name: name for name in columns}),
        *(line({name: row[name].plain for name in columns}) for row in sheet.rows),
    ]


def _pad(text: str, width: int, *, right: bool) -> str:
    space = " " * (width - cell_len(text))
    return space + text if right else text + space


def _rich_table(sheet: _Sheet, columns: list[str]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in columns:
        folded = name in FOLDED
        table.add_column(
            name,
            justify="right" if name in RIGHT else "left",
            no_wrap=not folded,
            overflow="fold",
            min_width=cell_len(name),  # a header is never cut
        )
    for row in sheet.rows:
        table.add_row(*(row[name] for name in columns))
    return table


def _wrapped(parts: list[str], separator: str, width: int | None) -> list[str]:
    """``parts`` joined by ``separator`` on lines of ``width`` at most (one line if ``None``),
    broken after a separator, each line after the first indented by two; a part too wide
    for that alone on its line, whole."""
    end = separator.rstrip()  # what a line broken after a separator ends with
    lines: list[str] = []
    for number, part in enumerate(parts):
        more = end if number < len(parts) - 1 else ""
        if lines and (width is None or cell_len(lines[-1] + separator + part + more) <= width):
            lines[-1] += separator + part
        elif lines:
            lines[-1] += end
            lines.append("  " + part)
        else:
            lines.append(part)
    return lines


def _say(screen: Screen, line: str) -> None:
    if screen.plain:
        screen.console.out(line, highlight=False)
    else:
        screen.console.print(Text(line))
