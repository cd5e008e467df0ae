"""``dopool chaos``: the chaos harness, loaded on demand."""

from __future__ import annotations

import sys

import click


@click.command(
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
