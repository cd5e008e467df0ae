"""``dopool dead-letters``: list a store's dead letters, or redrive or purge them, all or
those the filters choose (by error text, age, partition key, instance)."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import click
from rich.console import Console
from rich.text import Text

from dopool._cli._errors import CliError, CliUsageError
from dopool._cli._store import _chosen_pools, _when
from dopool._cli._terminal import _clean, _console
from dopool._cli._values import JSON_TAGS, _json_text, _short
from dopool._handles.filters import Filters
from dopool._ops.storeview import Selection, StoreView, open_view, purge, redrive
from dopool._types import DeadLetter

_LETTER_FIELDS = dataclasses.fields(DeadLetter)
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_AGE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*")


def _age(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """``--older-than``: seconds, or a number and a unit (``90s``, ``5m``, ``2h``, ``1d``)."""
    if value is None:
        return None
    match = _AGE.fullmatch(value)
    seconds = math.inf if match is None else float(match[1]) * _UNITS[match[2]]
    if not math.isfinite(seconds):
        raise click.BadParameter(
            f"{_clean(repr(value))} is no age: give seconds, or a number and a unit "
            "(s, m, h or d), such as 90s, 5m, 2h or 1d",
            ctx,
            param,
        )
    return seconds


@click.command("dead-letters")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--pool", "pool_name", metavar="NAME", help="only this pool")
@click.option("--error", "error_text", metavar="TEXT", help="only those whose error contains TEXT")
@click.option(
    "--older-than",
    callback=_age,
    metavar="AGE",
    help="only those that failed more than AGE ago (seconds, or 90s, 5m, 2h, 1d)",
)
@click.option("--partition-key", metavar="KEY", help="only those of this partition key")
@click.option(
    "--instance", type=click.IntRange(min=0), metavar="I", help="only instance I (needs --pool)"
)
@click.option("--redrive", "do_redrive", is_flag=True, help="re-enqueue them, as new events")
@click.option("--purge", "do_purge", is_flag=True, help="delete them (the counters stay)")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=100,
    show_default=True,
    help="list at most this many (0: only the counts)",
)
@click.option("--json", "as_json", is_flag=True, help=f"print JSON instead of a table {JSON_TAGS}")
def dead_letters(
    path: Path,
    pool_name: str | None,
    error_text: str | None,
    older_than: float | None,
    partition_key: str | None,
    instance: int | None,
    do_redrive: bool,
    do_purge: bool,
    limit: int,
    as_json: bool,
) -> None:
    """List the dead letters in the store at PATH, or --redrive or --purge them.

    Without a filter, every dead letter; with filters, those that match all of them.
    Ages are measured from the wall clock. Listing is read-only. Acting works live,
    beside the workers that hold the store, as dopool pause does: one write per
    instance, its owner woken. Redriven events run at once where a worker serves their
    instance, else when a runtime next opens the store.
    """
    if do_redrive and do_purge:
        raise CliUsageError("--redrive and --purge exclude each other")
    if instance is not None and pool_name is None:
        raise CliUsageError("--instance needs --pool: instances are numbered within a pool")
    filters = Filters(error=error_text, older_than=older_than, partition_key=partition_key)
    selection: Selection = (instance, filters)
    filtered = filters.given or instance is not None
    acting = do_redrive or do_purge
    with open_view(path) as view:
        pools = _chosen_pools(view, pool_name)
        for name, concurrency in pools.items():
            if instance is not None and instance >= concurrency:
                raise CliError(
                    f"pool {_clean(repr(name))} has no instance {instance} "
                    f"(concurrency {concurrency})"
                )
        listing = None if acting else _read(view, pools, selection)
    if listing is None:
        _act(path, pools, selection, redrive_them=do_redrive, as_json=as_json, filtered=filtered)
    else:
        _list(path, *listing, filtered=filtered, limit=limit, as_json=as_json)


def _read(
    view: StoreView, pools: dict[str, int], selection: Selection
) -> tuple[dict[str, list[DeadLetter]], int]:
    """The matching dead letters by pool, and how many the pools (or the instance) hold."""
    index, filters = selection
    letters = {name: view.dead_letters(name, index, filters) for name in sorted(pools)}
    total = sum(view.count_dead_letters(name, index) for name in pools)
    return letters, total


def _list(
    path: Path,
    letters: dict[str, list[DeadLetter]],
    total: int,
    *,
    filtered: bool,
    limit: int,
    as_json: bool,
) -> None:
    matched = sum(len(found) for found in letters.values())
    if as_json:
        # Not dataclasses.asdict: it copies the event recursively, and events nest deep.
        listing = [
            {"pool": name} | {field.name: getattr(letter, field.name) for field in _LETTER_FIELDS}
            for name, found in letters.items()
            for letter in found
        ][:limit]
        click.echo(_json_text({"matched": matched, "total": total, "dead_letters": listing}))
        return
    if filtered and total:
        heading = f"{matched:,} of {total:,} dead letters in {_clean(path)} match"
        if not matched:
            heading = f"store {_clean(path)}: none of its {total:,} dead letters match"
    elif matched:
        heading = f"{matched:,} dead letters in {_clean(path)}"
    else:
        heading = f"store {_clean(path)}: no dead letters"
    _print_dead_letters(_console(), heading, letters, limit)


def _print_dead_letters(
    out: Console, heading: str, letters: dict[str, list[DeadLetter]], limit: int
) -> None:
    total = sum(len(found) for found in letters.values())
    out.print(Text(heading, style="bold" if total else ""))
    shown = 0
    for name, found in letters.items():
        for letter in found:
            if shown >= limit:
                break
            shown += 1
            attempts = f"{letter.attempts} attempt" + ("" if letter.attempts == 1 else "s")
            key = "" if letter.partition_key is None else f" · key {_clean(letter.partition_key)}"
            if letter.dedup_key is not None:
                key += f" · dedup key {_clean(letter.dedup_key)}"
            out.print()
            out.print(
                Text(f"{_clean(name)}:{letter.instance_index} #{letter.sequence}", style="bold"),
                Text(f"· {attempts} · failed {_when(letter.failed_at)}{key}"),
            )
            out.print(Text(f"  error: {_clean(letter.error)}"), soft_wrap=True)
            if letter.traceback is not None:
                out.print(Text("  traceback:"))
                for line in letter.traceback.splitlines():
                    out.print(Text(f"    {_clean(line)}", style="dim"), soft_wrap=True)
            if letter.damaged:
                out.print(Text("  damaged record: never redriven", style="red"))
            out.print(Text(f"  event: {_clean(_short(letter.event, 200))}"), soft_wrap=True)
    if total > shown:
        out.print()
        out.print(f"{total - shown:,} more: raise --limit")


def _act(
    path: Path,
    pools: dict[str, int],
    selection: Selection,
    *,
    redrive_them: bool,
    as_json: bool,
    filtered: bool,
) -> None:
    action, verb, done_key = ("redrive", "redrove", "redriven")
    if not redrive_them:
        action, verb, done_key = ("purge", "purged", "purged")
    done = (redrive if redrive_them else purge)(path, pools, selection) if pools else {}
    if as_json:
        counts = [
            {"pool": name, "matched": matched, done_key: count}
            for name, (matched, count) in done.items()
        ]
        click.echo(_json_text({"action": action, "pools": counts}))
        return
    if not pools:
        click.echo(f"store {_clean(path)}: no pools")
        return
    for name, (matched, count) in done.items():
        notes = []
        if filtered or matched != count:
            notes.append(f"{matched:,} matched")
        if matched > count:
            notes.append(f"{matched - count:,} damaged: never redriven")
        if redrive_them and count:
            notes.append("a worker serving their instances runs them")
        line = f"{verb} {count:,} dead letters of pool '{_clean(name)}'"
        click.echo(line + (f" ({'; '.join(notes)})" if notes else ""))
