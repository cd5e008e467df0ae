"""``dopool dead-letters``: list a store's dead letters, or redrive or purge them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
from rich.console import Console
from rich.text import Text

from dopool._cli._errors import CliUsageError
from dopool._cli._store import _chosen_pools, _when
from dopool._cli._terminal import _clean, _console
from dopool._cli._values import JSON_TAGS, _json_text, _short
from dopool._sim.storeview import open_view, purge, redrive
from dopool._types import DeadLetter

_LETTER_FIELDS = dataclasses.fields(DeadLetter)


@click.command("dead-letters")
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
