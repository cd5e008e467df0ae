"""``dopool worker``: own a store and run its handlers until signalled (see dopool._ops.worker)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import click

from dopool import metrics, tracing
from dopool._cli._errors import CliError, CliUsageError
from dopool._cli._terminal import _clean
from dopool._cluster.leases import DEFAULT_LEASE_TTL, check_lease_ttl
from dopool._engine.slots import DEFAULT_MAX_ACTIVE, check_max_active
from dopool._engine.wakeups import DEFAULT_POLL_INTERVAL, check_poll_interval
from dopool._errors import ConfigurationError, StoreLockedError
from dopool._ops.logs import LOG_FORMATS, configure
from dopool._ops.worker import (
    DEFAULT_GRACE,
    EXIT_STOPPED,
    Interrupted,
    Stopped,
    check_grace,
    leave,
    open_worker,
    serve,
    signals,
)
from dopool._store.layout.limits import PER_KEY

LOG_LEVELS = ("debug", "info", "warning", "error")
METRICS_HOST = "127.0.0.1"  # loopback: who may scrape is the operator's choice to widen


@click.command()
@click.argument("app", metavar="APP")
@click.option(
    "--store", "store", required=True, metavar="PATH", type=click.Path(path_type=Path),
    help="the store directory (created if missing)",
)  # fmt: skip
@click.option(
    "--durability", type=click.Choice(["sync", "async"]), default="sync", show_default=True,
    help="sync: fsync each commit; async: survive a crash of the process, not of the OS",
)  # fmt: skip
@click.option(
    "--poll-interval", type=float, default=DEFAULT_POLL_INTERVAL, show_default=True,
    metavar="SECONDS", help="how often to look for producers' events whose wake-up was lost",
)  # fmt: skip
@click.option(
    "--lease-ttl", type=float, default=DEFAULT_LEASE_TTL, show_default=True, metavar="SECONDS",
    help="how long an instance's lease outlives this worker's last renewal (renewed every third)",
)  # fmt: skip
@click.option(
    "--exclusive", is_flag=True,
    help="own the store alone (the store lock exclusive), serving every instance",
)  # fmt: skip
@click.option(
    "--max-active", type=int, default=None, metavar="N",
    help=f"the most instances running at once (threads), the others waiting their turn "
    f"[default: {DEFAULT_MAX_ACTIVE}]",
)  # fmt: skip
@click.option(
    "--grace", type=float, default=DEFAULT_GRACE, show_default=True, metavar="SECONDS",
    help="after SIGTERM, SIGINT or SIGHUP, how long running handlers get to finish",
)  # fmt: skip
@click.option(
    "--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True,
    help="the level of the log lines written to stderr",
)  # fmt: skip
@click.option(
    "--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
    help="text lines, or one JSON object a line (time, level, logger, message, the event's "
    "fields, traceback)",
)  # fmt: skip
@click.option(
    "--metrics-port", type=click.IntRange(0, 65535), default=None, metavar="PORT",
    help="serve Prometheus metrics at http://HOST:PORT/metrics (the 'metrics' extra; 0: a "
    "free port, printed)",
)  # fmt: skip
@click.option(
    "--metrics-host", default=None, metavar="HOST",
    help=f"the address --metrics-port listens on [default: {METRICS_HOST}]",
)  # fmt: skip
@click.option(
    "--otel", is_flag=True,
    help="trace each attempt with OpenTelemetry, in the trace that enqueued its event, "
    "through the global tracer provider the app or opentelemetry-instrument sets up "
    "(the 'otel' extra)",
)  # fmt: skip
def worker(
    app: str,
    store: Path,
    durability: str,
    poll_interval: float,
    lease_ttl: float,
    exclusive: bool,
    max_active: int | None,
    grace: float,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str | None,
    otel: bool,
) -> None:
    """Run the pools APP defines on the store, in this process, until SIGTERM, SIGINT or SIGHUP.

    APP is 'module:function' (the current directory is importable) or
    'file.py:function': a function that receives a Runtime opened on the store and
    defines its pools (runtime.define(...)). Several workers may serve one store:
    each leases a fair share of the instances, renews its leases every third of
    --lease-ttl, and takes over those of a worker that died once they expire.

    SIGTERM, SIGINT or SIGHUP starts nothing more and gives running handlers --grace seconds;
    then the store closes, pending events stay stored, and the exit status is 0. A
    second signal, or the grace running out, stops at once with status 3: the
    interrupted attempts are settled by the next worker's recovery.
    """
    checks = (
        ("--poll-interval", check_poll_interval, poll_interval),
        ("--lease-ttl", check_lease_ttl, lease_ttl),
        ("--grace", check_grace, grace),
        ("--max-active", check_max_active, max_active),
    )
    for flag, check, value in checks:  # refused by their flags' names, before anything opens
        try:
            check(value)
        except ConfigurationError as exc:
            raise CliUsageError(f"{flag}: {exc}") from None
    if metrics_host is not None and metrics_port is None:
        raise CliUsageError("--metrics-host: needs --metrics-port")
    if otel:
        try:  # the global provider, whenever it is set: the app may set it as it loads
            tracing.instrument()
        except tracing.TracingUnavailableError as exc:
            raise CliUsageError(f"--otel: {exc}") from None
    configure(log_level, log_format)
    # Listening before the app loads: a port taken, or no extra, and nothing has run.
    scraped = None if metrics_port is None else _serve_metrics(metrics_host, metrics_port)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the app's project importable
    with signals() as wait:
        try:
            runtime = open_worker(
                app,
                store,
                durability=durability,
                poll_interval=poll_interval,
                shared=not exclusive,
                lease_ttl=lease_ttl,
                max_active=max_active,
                loading=wait.loading,
                # Registered before the app defines its pools: their first events count.
                opened=None if scraped is None else metrics.register,
            )
        except Interrupted as exc:
            _say(f"dopool worker: stopped ({exc.signal}) while loading the app; nothing served")
            return
        except StoreLockedError as exc:
            why = "runs" if exclusive else "owns it exclusively"
            raise CliError(f"{_clean(exc)}; another worker or runtime {why}") from None
        pools = ", ".join(
            f"{_clean(name)} ({'per-key' if p.concurrency == PER_KEY else p.concurrency})"
            for name, p in runtime.pools.items()
        )
        _say(
            f"dopool worker: store {_clean(runtime.path)}, pools {pools}, at most "
            f"{runtime.max_active} active, pid {os.getpid()}, durability {durability}, "
            + ("exclusive" if exclusive else f"shared, lease ttl {lease_ttl:g} s"),
        )
        if scraped is not None:
            _say(f"dopool worker: metrics at {scraped}")
        stopped = serve(runtime, grace, wait, _stopping(grace))
    _say(_summary(stopped))
    if stopped.exit_code != EXIT_STOPPED:
        leave(stopped.exit_code)  # abandoned handlers' threads must not hold the exit


def _serve_metrics(host: str | None, port: int) -> str:
    """Serve the process default registry's metrics (where ``metrics.register`` puts the
    runtime's) on ``host:port`` from a daemon thread; the URL scraped."""
    try:
        metrics.check_available()
    except metrics.MetricsUnavailableError as exc:
        raise CliUsageError(f"--metrics-port: {exc}") from None
    host = METRICS_HOST if host is None else host
    client = importlib.import_module("prometheus_client")
    try:
        server, _ = client.start_http_server(port, addr=host)
    except OSError as exc:  # taken, not an address of this host, a name that resolves not
        reason = exc.strerror or str(exc)
        raise CliError(
            f"--metrics-port {port}: cannot listen on {_clean(host)} port {port}: {reason}"
        ) from None
    bound: int = server.server_port
    shown = _clean(host)
    return f"http://{f'[{shown}]' if ':' in host else shown}:{bound}/metrics"


def _stopping(grace: float) -> Callable[[str, list[str]], None]:
    def told(signal_name: str, running: list[str]) -> None:
        which = f": {', '.join(running)}" if running else ""
        _say(
            f"dopool worker: {signal_name}: starting nothing more; {len(running)} running "
            f"handler(s){which}, given {grace:g} s to finish (signal again to stop at once)"
        )

    return told


def _say(line: str) -> None:
    """Print one of the worker's lines. Once nobody reads them (a closed pipe, journald
    restarted) they go nowhere: the worker serves on and stops as asked, never dies of it."""
    try:
        click.echo(line)
    except OSError:  # BrokenPipeError, say: later writes, and the flush at exit, are dropped
        with suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)


def _summary(stopped: Stopped) -> str:
    ran = "; ".join(
        f"{_clean(p.name)}: {p.succeeded:,} succeeded, {p.dead_lettered:,} dead-lettered, "
        f"{p.pending:,} pending left"
        for p in stopped.pools
    )
    line = f"dopool worker: stopped ({stopped.signal})"
    if stopped.forced:
        which = ", ".join(stopped.interrupted) or "none"
        reason = "the grace ran out" if stopped.forced == "grace" else "a second signal"
        line += (
            f" at once, {reason}: attempts interrupted on {which}, settled by the next "
            "worker's recovery"
        )
    return f"{line}; {ran}" if ran else line
