"""``dopool dashboard``: a store's pools in a web page, read live, controlled if allowed.

Two halves. :class:`Dashboard` is what the page reads and does, as JSON-ready documents,
with no HTTP in it: the pools with their totals and rates, a pool's instances (paged,
hottest first), its dead letters (paged, with their tracebacks), the schedules and the
leases; and the controls, pause, resume, drain, redrive and purge. :func:`make_app` puts
it behind HTTP, and :func:`serve` runs that until SIGINT or SIGTERM.

Reads open the store read-only for each request (:func:`~dopool._ops.storeview.open_view`:
an LMDB read snapshot, no lock, beside any runtime). Control goes through
:func:`dopool.connect`, as ``dopool pause|resume|drain`` (:func:`control`) and
``dopool dead-letters --redrive|--purge`` (:func:`~dopool._ops.storeview.redrive`,
:func:`~dopool._ops.storeview.purge`) do: one write transaction per change, its owner
woken. LMDB allows one handle on a store per process, so the store is used by one
request at a time (``Dashboard``'s lock), each opening and closing its own.

Rates over time come from samples this process keeps: each overview request adds one
per pool (at most one every :data:`SAMPLE_EVERY` seconds) of its enqueued, succeeded,
dead-lettered and pending totals, in a ring of :data:`SAMPLES`. No thread samples in the
background: the history is that of the time a page was open.

The page (``dashboard.html`` beside this module) is plain HTML and JavaScript, no
framework and nothing fetched from elsewhere. It treats every string from the store as
text, never as markup. The server treats the browser as hostile:

- it answers only requests whose ``Host`` is the address it listens on, ``localhost``
  or ``127.0.0.1`` (``TrustedHostMiddleware``), so that a web page whose name an
  attacker points at 127.0.0.1 (DNS rebinding) reads nothing;
- it refuses every control (403) unless started with ``--allow-control``, and then
  each must carry the random token embedded in the page, in the ``X-Dopool-Token``
  header: another site's page can neither read the token nor send that header (a
  preflight, which this server never grants);
- its page may not be framed, and runs only its own script (``Content-Security-Policy``).

Starlette and uvicorn are dopool's ``dashboard`` extra, imported only when the app is
made (the ``dopool`` command loads this module for every command): small, typed,
maintained together by Encode, and the usual ASGI pair.
"""

from __future__ import annotations

import importlib
import ipaddress
import itertools
import json
import math
import reprlib
import secrets
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Literal, NamedTuple

from dopool._clock.clocks import wall_time
from dopool._cluster.remote import Changed, Verb
from dopool._cluster.units import named
from dopool._errors import (
    ConfigurationError,
    DopoolError,
    PoolNotFoundError,
    StoreBusyError,
    StoreNotFoundError,
)
from dopool._handles.connection import connect, control
from dopool._handles.filters import Filters
from dopool._ops.storeview import StoreView, open_view, purge, redrive
from dopool._store.layout.limits import PER_KEY
from dopool._store.leaseclock import estimate_lease_time
from dopool._types import DeadLetter, InstanceStatus, PoolStatus, ScheduleInfo

if TYPE_CHECKING:  # the 'dashboard' extra: imported at run time by make_app and serve
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

DEFAULT_HOST = "127.0.0.1"  # loopback: who may look is the operator's choice to widen
DEFAULT_PORT = 8780
#: The instances and dead letters a page lists unless asked (``?per_page=``), and the most.
DEFAULT_PER_PAGE = 50
MAX_PER_PAGE = 200
#: The samples kept per pool for its rates over time, and the least time between two.
SAMPLES = 300
SAMPLE_EVERY = 1.0
#: The headline rates are over the samples of this many seconds back.
RATE_WINDOW = 30.0
#: The header a control request carries the page's token in.
TOKEN_HEADER = "X-Dopool-Token"

Action = Literal["pause", "resume", "drain", "redrive", "purge"]
ACTIONS: tuple[Action, ...] = ("pause", "resume", "drain", "redrive", "purge")
#: A JSON object, as the endpoints answer it.
Document = dict[str, object]

_VERBS: dict[str, Verb] = {"pause": "pause", "resume": "resume", "drain": "drain"}
_EXTRA = ("starlette", "uvicorn")
_DONE = {"pause": "paused", "resume": "resumed", "redrive": "redrove", "purge": "purged"}
_EVENT_TEXT = 400  # the most of an event's text the page shows


class _EventRepr(reprlib.Repr):
    """``repr`` cut at every level, however deep an event nests; a dict's items in their
    own order (reprlib sorts them)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother = 4, 200, 200
        self.maxdict = self.maxlist = self.maxtuple = 10

    def repr_dict(self, x: dict[object, object], level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        shown = itertools.islice(x.items(), self.maxdict)
        pieces = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}" for k, v in shown]
        more = ", ..." if len(x) > self.maxdict else ""
        return "{" + ", ".join(pieces) + more + "}"


_EVENTS = _EventRepr()


class DashboardUnavailableError(ConfigurationError):
    """Starlette or uvicorn, dopool's ``dashboard`` extra, is not installed.

    Attributes:
        missing: the module that would not import.
    """

    def __init__(self, missing: str) -> None:
        self.missing = missing
        super().__init__(
            f"dopool dashboard needs starlette and uvicorn ({missing} is missing), dopool's "
            "'dashboard' extra (pip install '.[dashboard]' in dopool's source tree)"
        )


def check_available() -> None:
    """Raise :class:`DashboardUnavailableError` now if the extra is missing."""
    for module in _EXTRA:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise DashboardUnavailableError(exc.name or module) from None


class Sample(NamedTuple):
    """A pool's totals at one moment (``at``: the dashboard's clock), for its rates."""

    at: float
    enqueued: int
    succeeded: int
    dead_lettered: int
    pending: int


class Dashboard:
    """What the page reads and does on the store at ``path``; see the module docstring.

    Each method returns a JSON-ready document, or raises a :class:`~dopool.DopoolError`
    (:class:`~dopool.PoolNotFoundError` for a pool the store does not have,
    :class:`~dopool.ConfigurationError` for a bad page or instance). Thread-safe: the
    store is used by one call at a time.

    Attributes:
        path: the store.
        allow_control: whether :meth:`act` may be called (the HTTP layer refuses it
            otherwise).
        token: what a control request must carry (random, this process's own).
    """

    def __init__(
        self,
        path: Path,
        *,
        allow_control: bool = False,
        token: str | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.allow_control = allow_control
        self.token = secrets.token_urlsafe(32) if token is None else token
        self._now = now  # the samples' clock: only its differences are read
        self._lock = threading.Lock()  # one LMDB handle per store and process
        self._samples: dict[str, deque[Sample]] = {}

    def __repr__(self) -> str:
        mode = "control allowed" if self.allow_control else "read-only"
        return f"<Dashboard {str(self.path)!r} {mode}>"

    @contextmanager
    def _view(self) -> Iterator[StoreView]:
        with self._lock, open_view(self.path) as view:
            yield view

    # -- reading -------------------------------------------------------------------------
    def overview(self) -> Document:
        """Every pool's totals (as its ``status()`` sums them), how many of its instances
        run or are paused, its rates, and its samples (seconds ago, then the totals)."""
        with self._view() as view:
            statuses = [view.status(name, count) for name, count in sorted(view.pools().items())]
            now = self._now()
            pools = [self._pool_document(status, now) for status in statuses]
        return {
            "store": str(self.path),
            "control": self.allow_control,
            "now": wall_time(),
            "pools": pools,
        }

    def _pool_document(self, status: PoolStatus, now: float) -> Document:
        """Called with the lock held (the samples are shared)."""
        samples = self._samples.setdefault(status.name, deque(maxlen=SAMPLES))
        if not samples or now - samples[-1].at >= SAMPLE_EVERY:
            samples.append(
                Sample(now, status.enqueued, status.succeeded, status.dead_lettered, status.pending)
            )
        listed = status.instances
        return {
            "name": status.name,
            "concurrency": status.concurrency,
            "per_key": status.concurrency == PER_KEY,
            "used": status.used,
            "paused": status.paused,
            "paused_instances": sum(1 for s in listed if s.state == "paused"),
            "running": sum(1 for s in listed if s.current_sequence is not None),
            "enqueued": status.enqueued,
            "pending": status.pending,
            "scheduled": status.scheduled,
            "succeeded": status.succeeded,
            "dead_lettered": status.dead_lettered,
            "dead_letters_held": status.dead_letters_held,
            "drained": status.drained,
            "cancelled": status.cancelled,
            "expired": status.expired,
            "duplicates": status.duplicates,
            "schedules": status.schedules,
            "head_due_at": _number(status.head_due_at),
            "rates": rates(samples),
            "samples": [[round(now - s.at, 3), *s[1:]] for s in samples],
        }

    def instances(self, pool: str, page: int = 1, per_page: int = DEFAULT_PER_PAGE) -> Document:
        """A page of the pool's instances ever used, hottest first: the most pending
        events (one running counted again), then by index."""
        check_page(page, per_page)
        with self._view() as view:
            status = view.status(pool, _concurrency(view, pool))
        hottest = sorted(status.instances, key=_heat)
        return _paged(pool, page, per_page, [_instance_document(s) for s in hottest])

    def dead_letters(self, pool: str, page: int = 1, per_page: int = DEFAULT_PER_PAGE) -> Document:
        """A page of the pool's dead letters, by instance then sequence, with tracebacks."""
        check_page(page, per_page)
        with self._view() as view:
            _concurrency(view, pool)
            letters = view.dead_letters(pool)
        return _paged(pool, page, per_page, [_letter_document(pool, d) for d in letters])

    def schedules(self) -> Document:
        """Every pool's recurring schedules, by pool then name."""
        with self._view() as view:
            found = [(name, view.schedules(name)) for name in sorted(view.pools())]
        return {
            "schedules": [_schedule_document(name, s) for name, listed in found for s in listed]
        }

    def leases(self) -> Document:
        """Every lease: the pool, the instances of its unit, the worker, the seconds left."""
        with self._view() as view:
            pools, leases = view.pools(), view.leases()
        now = estimate_lease_time(self.path)  # leases expire by the host's lease clock
        return {
            "leases": [
                {
                    "pool": pool,
                    "instances": named(unit, pools.get(pool, PER_KEY)),
                    "owner": record.owner,
                    "pid": record.pid,
                    "host": record.host,
                    "epoch": record.epoch,
                    "expires_in": _number(round(record.expires_at - now, 3)),
                }
                for (pool, unit), record in sorted(leases.items())
            ]
        }

    # -- acting --------------------------------------------------------------------------
    def act(self, action: Action, pool: str, index: int | None = None) -> Document:
        """Pause, resume, drain, redrive or purge the pool's instance ``index`` (all of
        them when None), as the command line does it; what changed, with a summary line.

        Raises:
            PoolNotFoundError: the store has no such pool.
            ConfigurationError: an unknown action; an index of no instance.
            StoreBusyError: another process held the writer lock too long.
        """
        if action not in ACTIONS:
            raise ConfigurationError(f"action must be one of {', '.join(ACTIONS)}, got {action!r}")
        where = pool if index is None else f"{pool}:{index}"
        answer: Document = {"action": action, "pool": pool, "instance": index}
        verb = _VERBS.get(action)
        if verb is not None:  # as dopool pause, resume and drain
            with self._lock, connect(self.path) as connection:
                answers = control(connection, pool, verb, index)
            return answer | _changes(verb, where, answers)
        with self._view() as view:  # as dopool dead-letters --redrive or --purge
            concurrency = _concurrency(view, pool)
        _check_index(pool, concurrency, index)
        with self._lock:  # (the view closed first: one handle per store and process)
            chosen = (redrive if action == "redrive" else purge)(
                self.path, {pool: concurrency}, (index, Filters())
            )
        matched, done = chosen[pool]
        summary = f"{_DONE[action]} {done:,} of {matched:,} dead letters of {where}"
        return answer | {"matched": matched, "done": done, "summary": summary}


def _changes(action: Verb, where: str, answers: list[Changed]) -> Document:
    if action == "drain":
        drained = sum(a.drained for a in answers)
        kept = [a.index for a in answers if a.kept_running]
        note = f" (kept the running event of {len(kept):,} instances)" if kept else ""
        return {"drained": drained, "kept_running": kept} | {
            "summary": f"drained {drained:,} events from {where}{note}"
        }
    changed = [a.index for a in answers if a.changed]
    same = len(answers) - len(changed)
    already = "already paused" if action == "pause" else "not paused"
    if not answers:  # (a pool's pause or resume is stored for it even so)
        summary = f"{_DONE[action]} {where} (no instance used yet)"
    elif not changed and ":" in where:  # one instance
        summary = f"{where}: {already}, unchanged"
    elif not changed:  # the whole pool: its own pause or resume is stored
        none = "every instance was already" if action == "pause" else "no instance was"
        summary = f"{_DONE[action]} {where} ({none} paused)"
    elif same:
        summary = f"{_DONE[action]} {where} ({len(changed):,} instances; {same:,} {already})"
    elif len(changed) > 1:
        summary = f"{_DONE[action]} {where} ({len(changed):,} instances)"
    else:
        summary = f"{_DONE[action]} {where}"
    return {"changed": changed, "unchanged": same, "summary": summary}


def _concurrency(view: StoreView, pool: str) -> int:
    known = view.pools()
    if pool not in known:
        raise PoolNotFoundError(path=str(view.path), pool=pool, known=sorted(known))
    return known[pool]


def _check_index(pool: str, concurrency: int, index: int | None) -> None:
    if index is not None and not 0 <= index < concurrency:
        raise ConfigurationError(
            f"pool {pool!r} has no instance {index} (concurrency {concurrency})"
        )


def check_page(page: int, per_page: int) -> None:
    """Refuse a page below 1, or a page size outside 1 to :data:`MAX_PER_PAGE`."""
    if page < 1:
        raise ConfigurationError(f"page must be 1 or more, got {page}")
    if not 1 <= per_page <= MAX_PER_PAGE:
        raise ConfigurationError(f"per_page must be from 1 to {MAX_PER_PAGE}, got {per_page}")


def _paged(pool: str, page: int, per_page: int, rows: list[Document]) -> Document:
    """Page ``page`` of ``rows`` (the last one if past the end)."""
    pages = max(1, math.ceil(len(rows) / per_page))
    page = min(page, pages)
    start = (page - 1) * per_page
    return {
        "pool": pool,
        "page": page,
        "per_page": per_page,
        "pages": pages,
        "total": len(rows),
        "rows": rows[start : start + per_page],
    }


def _heat(status: InstanceStatus) -> tuple[int, int]:
    running = status.current_sequence is not None
    return -(status.pending + running), status.index


def rates(samples: deque[Sample]) -> Document:
    """Events a second enqueued, succeeded and dead-lettered, over the samples of the last
    :data:`RATE_WINDOW` seconds (None with fewer than two)."""
    last = samples[-1] if samples else None
    first = next((s for s in samples if last is not None and last.at - s.at <= RATE_WINDOW), None)
    if last is None or first is None or last.at <= first.at:
        return {"enqueued": None, "succeeded": None, "dead_lettered": None}
    span = last.at - first.at
    return {
        "enqueued": round((last.enqueued - first.enqueued) / span, 3),
        "succeeded": round((last.succeeded - first.succeeded) / span, 3),
        "dead_lettered": round((last.dead_lettered - first.dead_lettered) / span, 3),
    }


def _instance_document(s: InstanceStatus) -> Document:
    return {
        "index": s.index,
        "instance_id": s.instance_id,  # (what the page acts on: exact beyond 2**53)
        "key": s.key,
        "state": s.state,
        "pending": s.pending,
        "scheduled": s.scheduled,
        "running": s.current_sequence is not None,
        "current_sequence": s.current_sequence,
        "attempt": s.attempt,
        "enqueued": s.enqueued,
        "succeeded": s.succeeded,
        "dead_lettered": s.dead_lettered,
        "dead_letters_held": s.dead_letters_held,
        "drained": s.drained,
        "cancelled": s.cancelled,
        "restarts": s.restarts,
        "next_alarm_at": _number(s.next_alarm_at),
        "head_due_at": _number(s.head_due_at),
    }


def _letter_document(pool: str, d: DeadLetter) -> Document:
    return {
        "event_id": f"{pool}:{d.instance_index}:{d.sequence}",
        "instance_index": d.instance_index,
        "sequence": d.sequence,
        "event": event_text(d.event),
        "error": d.error,
        "traceback": d.traceback,
        "attempts": d.attempts,
        "enqueued_at": _number(d.enqueued_at),
        "failed_at": _number(d.failed_at),
        "partition_key": d.partition_key,
        "dedup_key": d.dedup_key,
        "priority": d.priority,
        "damaged": d.damaged,
    }


def _schedule_document(pool: str, s: ScheduleInfo) -> Document:
    return {
        "pool": pool,
        "name": s.name,
        "every": _number(s.every),
        "cron": s.cron,
        "next_at": _number(s.next_at),
        "fired": s.fired,
        "coalesced": s.coalesced,
        "last_fired_at": _number(s.last_fired_at),
        "partition_key": s.partition_key,
        "priority": s.priority,
        "event": event_text(s.event),
    }


def event_text(event: object) -> str:
    """An event as the page shows it: its ``repr``, cut at every level and in length."""
    try:
        text = _EVENTS.repr(event)
    except Exception:  # the event's own __repr__ (a crafted store's bytes decode to plain data)
        text = f"<{type(event).__name__}>"
    return text if len(text) <= _EVENT_TEXT else text[: _EVENT_TEXT - 3] + "..."


def _number(value: float | None) -> float | None:
    """A float JSON can carry: None for infinities and NaN (a crafted store's times)."""
    return value if value is None or math.isfinite(value) else None


# -- HTTP --------------------------------------------------------------------------------


def allowed_hosts(host: str) -> list[str]:
    """The ``Host`` names a request may give: the address listened on, and loopback's."""
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        given = host
    else:
        given = f"[{literal}]" if literal.version == 6 else str(literal)
    return sorted({given.lower(), "localhost", "127.0.0.1", "[::1]"})


def make_app(dashboard: Dashboard, host: str = DEFAULT_HOST) -> Starlette:
    """The dashboard as an ASGI app, answering requests whose ``Host`` is ``host`` (the
    address it listens on) or loopback's.

    Raises:
        DashboardUnavailableError: the ``dashboard`` extra is not installed.
    """
    check_available()
    # The extra, imported here: every `dopool` command loads this module.
    from starlette.applications import Starlette  # noqa: PLC0415
    from starlette.middleware import Middleware  # noqa: PLC0415
    from starlette.middleware.trustedhost import TrustedHostMiddleware  # noqa: PLC0415
    from starlette.responses import HTMLResponse, Response  # noqa: PLC0415
    from starlette.routing import Route  # noqa: PLC0415

    page = resources.files(__package__).joinpath("dashboard.html").read_text("utf-8")
    guarded = {
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
    }

    def answer(document: Document, status: int = 200) -> Response:
        return Response(_json_bytes(document), status, guarded, media_type="application/json")

    def refused(exc: DopoolError) -> Response:
        document: Document = {"error": str(exc)}
        if isinstance(exc, PoolNotFoundError):
            document["pool"] = exc.pool
        return answer(document, _status_of(exc))

    def reading(read: Callable[[Request], Document]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:  # (run in a worker thread)
            try:
                return answer(read(request))
            except DopoolError as exc:
                return refused(exc)

        return endpoint

    def home(request: Request) -> Response:
        nonce = secrets.token_urlsafe(16)
        token = dashboard.token if dashboard.allow_control else ""
        html = page.replace("{{nonce}}", nonce).replace("{{token}}", token)
        headers = guarded | {
            "Content-Security-Policy": (
                f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
                "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                "form-action 'none'; frame-ancestors 'none'"
            )
        }
        return HTMLResponse(html, headers=headers)

    def paging(request: Request) -> tuple[str, int, int]:
        pool = request.path_params["pool"]
        page = _integer(request.query_params.get("page", "1"), "page")
        per_page = _integer(request.query_params.get("per_page", str(DEFAULT_PER_PAGE)), "per_page")
        return pool, page, per_page

    def act(request: Request) -> Response:
        if not dashboard.allow_control:
            return answer({"error": "read-only: start the dashboard with --allow-control"}, 403)
        given = request.headers.get(TOKEN_HEADER, "")
        if not secrets.compare_digest(given.encode(), dashboard.token.encode()):
            return answer({"error": f"missing or wrong {TOKEN_HEADER}: reload the page"}, 403)
        action = request.path_params["action"]
        if action not in ACTIONS:
            return answer({"error": f"no action {action!r}: one of {', '.join(ACTIONS)}"}, 404)
        try:
            raw = request.query_params.get("instance")
            index = None if raw in (None, "") else _integer(raw, "instance")
            return answer(dashboard.act(action, request.path_params["pool"], index))
        except DopoolError as exc:
            return refused(exc)

    routes = [
        Route("/", home, methods=["GET"]),
        Route("/api/overview", reading(lambda _: dashboard.overview())),
        Route("/api/schedules", reading(lambda _: dashboard.schedules())),
        Route("/api/leases", reading(lambda _: dashboard.leases())),
        Route(
            "/api/pools/{pool}/instances",
            reading(lambda request: dashboard.instances(*paging(request))),
        ),
        Route(
            "/api/pools/{pool}/dead-letters",
            reading(lambda request: dashboard.dead_letters(*paging(request))),
        ),
        Route("/api/pools/{pool}/{action}", act, methods=["POST"]),
    ]
    trusted = Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts(host))
    return Starlette(routes=routes, middleware=[trusted])


def _json_bytes(document: Document) -> bytes:
    """``document`` as JSON, a stored string's lone surrogate escaped (``ensure_ascii``)
    rather than an encoding error, as Starlette's own JSONResponse would raise."""
    return json.dumps(document, ensure_ascii=True, allow_nan=False).encode("ascii")


def _integer(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigurationError(f"{name} must be a whole number, got {text!r}") from None


def _status_of(exc: DopoolError) -> int:
    if isinstance(exc, PoolNotFoundError | StoreNotFoundError):
        return 404
    if isinstance(exc, StoreBusyError):
        return 503
    if isinstance(exc, ConfigurationError):
        return 400
    return 500


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host`` (an address or a name) and ``port`` (0: a free
    one, which ``getsockname()`` names).

    Raises:
        OSError: the port is taken, or the host is no address of this machine.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def is_loopback(sock: socket.socket) -> bool:
    """Whether ``sock`` listens on a loopback address only."""
    return ipaddress.ip_address(sock.getsockname()[0]).is_loopback


def serve(app: Starlette, sock: socket.socket) -> str:
    """Serve ``app`` on ``sock`` until SIGINT or SIGTERM; the signal's name.

    uvicorn stops gracefully on either, then raises it again for the handler it found:
    ours, which notes it, so the caller can say why it stopped and exit as it would.
    """
    import uvicorn  # noqa: PLC0415 - the extra, as in make_app

    stopped: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        stopped.append(signum)

    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.signal(signum, note) for signum in handled}
    try:
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return signal.Signals(stopped[0]).name if stopped else "stopped"
