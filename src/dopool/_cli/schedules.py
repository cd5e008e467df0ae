"""``dopool schedules``: a store's recurring schedules, listed (read-only) or one removed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
from rich import box
from rich.table import Table
from rich.text import Text

from dopool._cli._errors import CliUsageError
from dopool._cli._store import _chosen_pools, _when
from dopool._cli._terminal import _clean, _console
from dopool._cli._values import JSON_TAGS, _json_text, _short
from dopool._handles.connection import connect
from dopool._ops.storeview import open_view
from dopool._types import ScheduleInfo


@click.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--pool", "pool_name", metavar="NAME", help="only this pool")
@click.option("--json", "as_json", is_flag=True, help=f"print JSON instead of tables {JSON_TAGS}")
@click.option(
    "--remove", "remove", metavar="SCHEDULE", help="remove this schedule of --pool instead"
)
def schedules(path: Path, pool_name: str | None, as_json: bool, remove: str | None) -> None:
    """List the recurring schedules of every pool in the store at PATH (read-only,
    beside a live runtime), or remove one with --remove NAME --pool POOL (a write, which
    wakes the owning worker)."""
    if remove is not None:
        if pool_name is None:
            raise CliUsageError("--remove needs --pool: the pool whose schedule it is")
        with connect(path) as connection:
            removed = connection.pool(pool_name).unschedule(remove)
        what = "removed" if removed else "no such schedule, nothing changed:"
        click.echo(f"{what} {_clean(repr(remove))} of pool {_clean(pool_name)}")
        return
    with open_view(path) as view:
        pools = _chosen_pools(view, pool_name)
        listed = {name: view.schedules(name) for name in sorted(pools)}
    if as_json:
        documents = [
            {"pool": name, "schedules": [dataclasses.asdict(info) for info in infos]}
            for name, infos in listed.items()
        ]
        click.echo(_json_text({"store": str(path), "pools": documents}))
        return
    out = _console()
    for name, infos in listed.items():
        if infos:
            out.print(_table(name, infos))
        else:
            out.print(Text(f"pool {_clean(name)}: no schedules"))


def _table(pool: str, infos: list[ScheduleInfo]) -> Table:
    table = Table(
        title=Text(f"pool {_clean(pool)} · {len(infos)} schedules"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for column in ("schedule", "every / cron", "partition key", "priority"):
        table.add_column(column, justify="right" if column == "priority" else "left")
    for column in ("next fire", "fired", "coalesced", "last fired", "event"):
        table.add_column(column, justify="right" if column in ("fired", "coalesced") else "left")
    for info in infos:
        when = f"every {info.every:g} s" if info.every is not None else f"cron {info.cron}"
        key = "-" if info.partition_key is None else info.partition_key
        table.add_row(
            Text(_clean(info.name)),
            Text(_clean(when)),
            Text(_clean(key)),
            f"{info.priority}",
            _when(info.next_at),
            f"{info.fired:,}",
            f"{info.coalesced:,}",
            _when(info.last_fired_at),
            Text(_clean(_short(info.event))),
        )
    return table
