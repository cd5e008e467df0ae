"""The ``dopool`` command line: the group ``cli``, ``main``, and where each command lives.

Only the console script imports this package (click and rich are the ``cli``
extra). The work is done elsewhere: :mod:`dopool._sim.driver` runs scenarios,
:mod:`dopool._ops.storeview` reads and maintains real stores. Here are the
flags, the rendering, and one rule: an error is one line on stderr
(``Error: ...``) and a non-zero exit, never a traceback. Exit codes: 0 done,
1 a failure (an invariant broke, a store is locked or missing), 2 a bad flag
or scenario; ``dopool worker`` also exits 3 when it stopped at once, attempts
interrupted.

One module per command (``simulate``, ``status``, ``dead-letters``, ``schedules``,
``storage``, ``check``, ``chaos``, ``worker``, ``dashboard``; ``control`` has ``pause``,
``resume`` and ``drain``); ``report`` renders a simulate run; the private modules hold
what the commands share: ``_errors``, ``_terminal``, ``_values``, ``_store``.
"""

from __future__ import annotations

try:
    import click
    import rich  # noqa: F401 - checked here; the modules below use it
except ImportError as exc:  # the console script, installed without the ``cli`` extra
    raise SystemExit(
        f"Error: the dopool command line needs click and rich ({exc.name} is missing), "
        "dopool's 'cli' extra (pip install '.[cli]' in dopool's source tree)"
    ) from None

from dopool._cli import (
    chaos,
    check,
    control,
    dashboard,
    dead_letters,
    schedules,
    simulate,
    status,
    storage,
    worker,
)
from dopool._cli._errors import _OneLineErrors


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dopool", prog_name="dopool")
def cli() -> None:
    """Durable Object worker pools: run a worker, simulate a design, inspect a store."""


def main() -> None:
    """The ``dopool`` console script."""
    cli(prog_name="dopool")


cli.add_command(chaos.chaos)
cli.add_command(simulate.simulate)
cli.add_command(status.status)
cli.add_command(dead_letters.dead_letters)
cli.add_command(schedules.schedules)
cli.add_command(storage.storage)
cli.add_command(check.check)
cli.add_command(worker.worker)
cli.add_command(control.pause)
cli.add_command(control.resume)
cli.add_command(control.drain)
cli.add_command(dashboard.dashboard)
