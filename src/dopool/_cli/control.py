"""``dopool pause``, ``resume`` and ``drain``: live control of a store's pools
(:func:`dopool._handles.connection.control`), with or without a runtime owning it."""

from __future__ import annotations

from pathlib import Path

import click

from dopool._cli._terminal import _clean
from dopool._cluster.remote import Changed, Verb
from dopool._handles.connection import connect, control

DONE = {"pause": "paused", "resume": "resumed", "drain": "drained"}
ALREADY = {"pause": "already paused", "resume": "not paused"}


def _command(verb: Verb, summary: str) -> click.Command:
    @click.command(name=verb, help=summary)
    @click.argument("path", type=click.Path(path_type=Path))
    @click.option("--pool", "pool", required=True, metavar="NAME", help="the pool")
    @click.option(
        "--instance",
        "index",
        type=click.IntRange(min=0),
        metavar="I",
        help="only this instance (default: all)",
    )
    def command(path: Path, pool: str, index: int | None) -> None:
        with connect(path) as connection:
            changed = control(connection, pool, verb, index)
        for line in _lines(verb, pool, changed):
            click.echo(line)

    return command


def _lines(verb: Verb, pool: str, answers: list[Changed]) -> list[str]:
    name = _clean(pool)
    if verb == "drain":
        lines = []
        for a in answers:
            kept = ", kept the event whose attempt is running" if a.kept_running else ""
            lines.append(f"drained {a.drained:,} events from {name}:{a.index}{kept}")
        if len(answers) > 1:
            lines.append(f"drained {sum(a.drained for a in answers):,} events from {name}")
        return lines
    changed = [a.index for a in answers if a.changed]
    same = [a.index for a in answers if not a.changed]
    lines = [f"{DONE[verb]} {_span(name, changed)}"] if changed else []
    if same:
        lines.append(f"{_span(name, same)}: {ALREADY[verb]}, unchanged")
    return lines


def _span(name: str, indices: list[int]) -> str:
    """``jobs:0..3`` for a run of indices, else ``jobs:0, jobs:2``."""
    if len(indices) > 1 and indices == list(range(indices[0], indices[-1] + 1)):
        return f"{name}:{indices[0]}..{indices[-1]}"
    return ", ".join(f"{name}:{i}" for i in indices)


pause = _command(
    "pause",
    "Pause the pool's instances in the store at PATH: they start nothing more (a running "
    "handler finishes). Works while a worker runs, or none; it is stored, and lasts until "
    "'dopool resume'.",
)
resume = _command(
    "resume",
    "Resume the pool's paused instances in the store at PATH; the owning worker starts "
    "their due events at once.",
)
drain = _command(
    "drain",
    "Remove every pending event of the pool's instances in the store at PATH (counted as "
    "drained); an event whose attempt is running is kept, to finish.",
)
