"""``dopool storage``: one instance's own stored values (``ctx.storage``), as a table or
JSON, read-only: those under the keys asked, or a listing of them in key order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich import box
from rich.table import Table
from rich.text import Text

from dopool._cli._errors import FAILURE_EXIT, CliError, CliUsageError
from dopool._cli._store import _chosen_pools
from dopool._cli._terminal import _clean, _console
from dopool._cli._values import JSON_TAGS, _json_text, _short
from dopool._errors import ConfigurationError
from dopool._ops.storeview import open_view

MIN_VALUE_WIDTH = 20  # a value's column is never cut narrower than this


def _text(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A key or a bound: text that UTF-8 holds (argv may carry bytes that are not)."""
    for text in value if isinstance(value, tuple) else (value,):
        try:
            if text is not None:
                text.encode()
        except UnicodeEncodeError:
            raise click.BadParameter(f"{text!a} is not text UTF-8 can hold", ctx, param) from None
    return value


@click.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.argument("pool")
@click.argument("keys", nargs=-1, metavar="[KEY]...", callback=_text)
@click.option(
    "--key",
    "partition_key",
    metavar="PARTITION_KEY",
    callback=_text,
    help="the instance this partition key routes to",
)
@click.option("--instance", type=click.IntRange(min=0), metavar="INDEX", help="instance INDEX")
@click.option(
    "--prefix",
    default="",
    metavar="TEXT",
    callback=_text,
    help="list the keys that start with TEXT",
)
@click.option("--start", metavar="KEY", callback=_text, help="list from this key (included)")
@click.option("--end", metavar="KEY", callback=_text, help="list up to this key (excluded)")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="list at most N values (default: every one)",
)
@click.option("--json", "as_json", is_flag=True, help=f"print JSON instead of a table {JSON_TAGS}")
def storage(
    path: Path,
    pool: str,
    keys: tuple[str, ...],
    partition_key: str | None,
    instance: int | None,
    prefix: str,
    start: str | None,
    end: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """Print the values one instance of POOL stored (ctx.storage) in the store at PATH:
    those under the KEYs given, or without KEYs all of them in key order (--prefix,
    --start, --end, --limit choose which). --key or --instance names the instance.

    Read-only: it takes no lock, so it works while a runtime holds the store. Exits 1
    if a KEY given has no value.
    """
    if partition_key is not None and instance is not None:
        raise CliUsageError("--key and --instance exclude each other: give one")
    if partition_key is None and instance is None:
        raise CliUsageError("which instance? give --key PARTITION_KEY or --instance INDEX")
    bounded = prefix != "" or start is not None or end is not None or limit is not None
    if keys and bounded:
        raise CliUsageError("--prefix, --start, --end and --limit choose a listing: give no KEYs")
    with open_view(path) as view:
        concurrency = _chosen_pools(view, pool)[pool]
        try:
            stored = view.storage(pool, concurrency, partition_key, instance)
        except ConfigurationError as exc:  # no such instance
            raise CliError(_clean(str(exc))) from None
        if keys:
            values = stored.get_many(dict.fromkeys(keys))  # each key once, in one snapshot
        else:
            values = stored.list(prefix=prefix, start=start, end=end, limit=limit)
    ident = stored.instance_id
    instance = int(ident.rpartition(":")[2])
    missing = [key for key in dict.fromkeys(keys) if key not in values]
    shown = list(dict.fromkeys(keys)) if keys else list(values)
    if as_json:
        document = {
            "store": str(path),
            "pool": pool,
            "instance": instance,
            "partition_key": partition_key,
            "values": values,
            "missing": missing,
        }
        click.echo(_json_text(document))
    else:
        _print_values(ident, partition_key, shown, values, asked=bool(keys), bounded=bounded)
    if missing:
        raise SystemExit(FAILURE_EXIT)


def _print_values(
    ident: str,
    partition_key: str | None,
    keys: list[str],
    values: dict[str, Any],
    *,
    asked: bool,
    bounded: bool,
) -> None:
    out = _console()
    where = _clean(ident) + ("" if partition_key is None else f" · key {_clean(partition_key)}")
    if not keys:
        out.print(Text(f"{where}: no values" + (" in that range" if bounded else "")))
        return
    title = Text(
        f"{where} · {len(values):,} of {len(keys):,} keys have a value"
        if asked
        else f"{where} · {len(values):,} value{'' if len(values) == 1 else 's'}"
    )
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, min_width=title.cell_len + 2
    )
    shown = {key: Text(_clean(key)) for key in keys}
    key_width = min(max(text.cell_len for text in shown.values()), out.width // 3)
    table.add_column("key", overflow="fold", max_width=out.width // 3)
    table.add_column("value", no_wrap=True, overflow="ellipsis")
    width = max(out.width - key_width - 7, MIN_VALUE_WIDTH)  # 7: the table's edges and padding
    for key, text in shown.items():
        if key in values:
            value = Text(_clean(_short(values[key], width)))
            value.truncate(width, overflow="ellipsis")  # in cells: a wide character takes two
        else:
            value = Text("no value", style="red")
        table.add_row(text, value)
    out.print(table)
