"""``dopool dashboard``: a store's pools in a web page (:mod:`dopool._ops.dashboard`), on
loopback unless told otherwise, read-only unless ``--allow-control``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from dopool._cli._errors import CliError
from dopool._cli._terminal import _clean
from dopool._ops.dashboard import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    Dashboard,
    check_available,
    is_loopback,
    listen,
    make_app,
    serve,
)
from dopool._ops.storeview import open_view


@click.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
    help="the port to listen on (0: a free one, printed)",
)  # fmt: skip
@click.option(
    "--host", default=DEFAULT_HOST, show_default=True, metavar="HOST",
    help="the address to listen on (loopback: this machine only)",
)  # fmt: skip
@click.option(
    "--allow-control", is_flag=True,
    help="let the page pause, resume, drain, redrive and purge (each asks to confirm)",
)  # fmt: skip
def dashboard(path: Path, port: int, host: str, allow_control: bool) -> None:
    """Serve a web page of the store at PATH until SIGINT or SIGTERM (the 'dashboard' extra).

    It shows the pools (totals, rates over time), each pool's instances (hottest first)
    and dead letters (with their tracebacks), the schedules and the leases, read live
    beside the workers. It is read-only unless --allow-control: then the page pauses,
    resumes, drains, redrives and purges, as dopool pause and dopool dead-letters do.
    It prints the address it serves on one line.
    """
    check_available()
    with open_view(path):  # a store that is not there: one line, nothing created
        pass
    app = make_app(Dashboard(path, allow_control=allow_control), host)
    try:
        sock = listen(host, port)
    except OSError as exc:  # taken, not an address of this host, a name that resolves not
        reason = exc.strerror or str(exc)
        raise CliError(
            f"--port {port}: cannot listen on {_clean(host)} port {port}: {reason}"
        ) from None
    with sock:
        address = _clean(host)
        url = f"http://{f'[{address}]' if ':' in host else address}:{sock.getsockname()[1]}/"
        mode = "control allowed" if allow_control else "read-only (--allow-control to act)"
        _say(f"dopool dashboard: {url} for store {_clean(path)}, {mode}")
        if not is_loopback(sock):
            does = "reads the store and controls its pools" if allow_control else "reads the store"
            click.echo(
                f"dopool dashboard: warning: listening on {address}, not loopback: whoever "
                f"reaches it {does}",
                err=True,
            )
        why = serve(app, sock)
    _say(f"dopool dashboard: stopped ({why})")


def _say(line: str) -> None:
    """A line on stdout at once: whoever started the command may be waiting for it."""
    click.echo(line)
    sys.stdout.flush()
