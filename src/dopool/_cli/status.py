"""``dopool status``: every pool's status in a store, as tables or JSON."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.table import Table
from rich.text import Text

from dopool._cli._store import _chosen_pools, _when
from dopool._cli._terminal import _clean, _console
from dopool._cli._values import JSON_TAGS, _json_text
from dopool._cluster.units import named, unit_of
from dopool._machine.status import Listing
from dopool._ops.storeview import open_view
from dopool._store.layout import LeaseRecord
from dopool._store.leaseclock import estimate_lease_time
from dopool._types import PoolStatus


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
    out = _console()
    if not statuses:
        out.print(Text(f"store {_clean(path)}: no pools"))
        return
    for item, waiting in zip(statuses, incoming, strict=True):
        served = {unit: record for (pool, unit), record in leases.items() if pool == item.name}
        out.print(_status_table(item, waiting, served, now))
        if served:
            out.print(_holders(served, now))


def _lease_json(record: LeaseRecord, now: float) -> dict[str, Any]:
    """A lease for ``--json``: its owner, and seconds until it expires."""
    return {**record._asdict(), "expires_in": round(record.expires_at - now, 3)}


def _holders(leases: dict[int, LeaseRecord], now: float) -> Text:
    """Who serves a pool's instances: each worker, its leases, and the least time left."""
    held: dict[tuple[int, str], list[float]] = {}
    for record in leases.values():
        held.setdefault((record.pid, record.host), []).append(record.expires_at - now)
    parts = []
    for (pid, host), left in sorted(held.items()):
        least = min(left)
        state = f"{least:,.0f}s left" if least > 0 else f"expired {-least:,.0f}s ago"
        parts.append(f"{pid}@{_clean(host)} holds {len(left):,} ({state})")
    return Text("leases: " + ", ".join(parts))


def _lease_text(record: LeaseRecord | None, now: float) -> Text:
    """Who serves an instance, ``PID@HOST``, and how long its lease has left."""
    if record is None:
        return Text("-", style="dim")
    left = record.expires_at - now
    who = f"{record.pid}@{_clean(record.host)}"
    if left <= 0:
        return Text(f"{who} expired {-left:,.0f}s ago", style="red")
    return Text(f"{who} {left:,.0f}s")


def _status_table(
    item: PoolStatus, waiting: dict[str, int], leases: dict[int, LeaseRecord], now: float
) -> Table:
    """``leases``: the pool's, by lease unit."""
    scheduled = f" ({item.scheduled:,} scheduled)" if item.scheduled else ""
    table = Table(
        title=Text(
            f"pool {_clean(item.name)} · {item.concurrency:,} instances · "
            f"{item.enqueued:,} enqueued · {item.pending:,} pending{scheduled} · "
            f"{item.succeeded:,} succeeded · {item.dead_lettered:,} dead-lettered"
            + (f" ({item.expired:,} expired)" if item.expired else "")
            + f" · {item.drained:,} drained"
            + (f" · {item.cancelled:,} cancelled" if item.cancelled else "")
            + (f" · {item.duplicates:,} duplicates" if item.duplicates else "")
            + (f" · {item.schedules:,} schedules" if item.schedules else "")
        ),
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    table.add_column("instance", no_wrap=True)
    keyed = any(s.key is not None for s in item.instances)  # a per-key pool's
    if keyed:
        table.add_column("key", no_wrap=True)
    table.add_column("state")
    for name in ("pending", "scheduled", "enqueued", "succeeded", "dead", "drained", "restarts"):
        table.add_column(name, justify="right")
    table.add_column("current", justify="right")
    table.add_column("next alarm", no_wrap=True)
    if leases:  # a store no worker leased keeps its columns
        table.add_column("lease", no_wrap=True)  # pid@host, seconds left
    styles = {
        "paused": "yellow",
        "processing": "green",
        "backoff": "magenta",
        "stalled": "red",
        "idle": "dim",
    }
    for s in item.instances:
        current = "-" if s.current_sequence is None else f"#{s.current_sequence} (try {s.attempt})"
        table.add_row(
            Text(_clean(s.instance_id)),
            *([Text(_clean(s.key or "-"))] if keyed else []),
            Text(s.state, style=styles.get(s.state, "")),
            f"{s.pending:,}",
            f"{s.scheduled:,}",
            f"{s.enqueued:,}",
            f"{s.succeeded:,}",
            f"{s.dead_lettered:,}",
            f"{s.drained:,}",
            f"{s.restarts:,}",
            current,
            _when(s.next_alarm_at),
            *([_lease_text(leases.get(unit_of(s.index, item.concurrency)), now)] if leases else []),
        )
    captions = []
    listed = len(item.instances)
    if item.used < item.concurrency or listed < item.used:  # not every instance listed
        captions.append(
            f"{item.used:,} of the {item.concurrency:,} instances used"
            + (f", {listed:,} listed (--from, --limit)" if listed < item.used else "")
        )
    if item.paused:
        captions.append("paused as a whole: an instance never used starts paused")
    if waiting:  # follow-ups for this pool, committed, not in its queues yet
        places = ", ".join(f"{_clean(ident)} ({count:,})" for ident, count in waiting.items())
        total = sum(waiting.values())
        captions.append(f"{total:,} follow-ups on their way, in outboxes: {places}")
    if captions:
        table.caption = Text("\n".join(captions))
    return table
