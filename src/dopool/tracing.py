"""OpenTelemetry traces of a pool's work: a span per attempt, in the trace that enqueued it.

OpenTelemetry is dopool's optional ``otel`` extra (``pip install '.[otel]'`` in dopool's
source tree: opentelemetry-api). A process that exports spans sets up opentelemetry-sdk
and an exporter as it would for any library. Nothing is traced, and nothing is imported,
until :func:`instrument` is called; call it in each process whose work should be traced,
a producer's as well as a worker's. Then:

- each ``enqueue`` and ``enqueue_many`` of a ``WorkerPool`` or ``ProducerPool`` runs in
  a span ``send <pool>`` (kind ``PRODUCER``). Each event it stores carries that span's
  context, as the process's propagator injects it (W3C ``traceparent`` by default), in
  its record (store format 12: the ``trace`` field, at most ``MAX_TRACE_FIELDS`` fields
  and ``MAX_TRACE_TEXT`` characters; a larger context is not stored);
- each attempt runs its handler in a span ``process <pool>`` (kind ``CONSUMER``) whose
  parent is the context its event carries, and which links to it: a request's trace goes
  on in whichever process runs the event, as long after as it runs;
- a follow-up (``ctx.enqueue``) carries the context of the attempt that made it, so its
  own attempts are that attempt's children.

An attempt span starts when its attempt starts and ends when its outcome commits, both
read from the runtime's clock (virtual under a ``SimulatedClock``). A failed attempt's span
records the exception, and has the status ``ERROR``; ``dopool.outcome`` says what came of
it (``succeeded``, ``retried`` or ``dead_lettered``). An attempt cut short by a crash ends
no span: the next attempt, after recovery, has its own. Attributes follow OpenTelemetry's
messaging conventions (``messaging.system`` is ``dopool``; the destination is the pool, the
message id the event's id), with ``dopool.instance`` and ``dopool.attempt``.

A tracer or propagator that raises never fails an enqueue or an attempt: the error is
logged once, on ``dopool.tracing``, and the event goes on without its trace.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from dopool._errors import ConfigurationError
from dopool._machine.types import Item
from dopool._store.layout import MAX_TRACE_FIELDS, MAX_TRACE_TEXT

if TYPE_CHECKING:  # an optional extra: imported at run time by instrument() only
    from opentelemetry.trace import Span, Tracer, TracerProvider

__all__ = [
    "TracingUnavailableError",
    "instrument",
    "instrumented",
    "uninstrument",
]

logger = logging.getLogger("dopool.tracing")


class TracingUnavailableError(ConfigurationError):
    """:func:`instrument` was called without OpenTelemetry installed.

    Attributes:
        missing: the module that failed to import.
    """

    def __init__(self, missing: str) -> None:
        super().__init__(
            "dopool.tracing needs opentelemetry-api, dopool's 'otel' extra (pip install "
            f"'.[otel]' in dopool's source tree): {missing} is not importable"
        )
        self.missing = missing


@dataclass(frozen=True, slots=True)
class _Tracing:
    """What :func:`instrument` set up: the tracer and OpenTelemetry's modules."""

    tracer: Tracer
    trace: ModuleType  # opentelemetry.trace
    context: ModuleType  # opentelemetry.context
    propagate: ModuleType  # opentelemetry.propagate


class _State:
    """The process's tracing: None until :func:`instrument`."""

    active: _Tracing | None = None


_state = _State()
_lock = threading.Lock()
_reported: set[str] = set()  # the kinds of failure logged since instrument() (once each)


def instrument(tracer_provider: TracerProvider | None = None) -> None:
    """Trace this process's enqueues and attempts from now on (see the module docstring).

    ``tracer_provider``: the provider whose tracer dopool uses (OpenTelemetry's global
    one unless given). Calling it again replaces the provider.

    Raises:
        TracingUnavailableError: opentelemetry-api is not installed.
    """
    modules = {}
    for name in ("trace", "context", "propagate"):
        try:
            modules[name] = importlib.import_module(f"opentelemetry.{name}")
        except ImportError:
            raise TracingUnavailableError(f"opentelemetry.{name}") from None
    trace = modules["trace"]
    from importlib.metadata import version  # noqa: PLC0415  # ~10 ms: only when instrumented

    tracer_version = version("dopool")
    tracer = trace.get_tracer("dopool", tracer_version, tracer_provider=tracer_provider)
    with _lock:
        _state.active = _Tracing(tracer, trace, modules["context"], modules["propagate"])
        _reported.clear()


def uninstrument() -> None:
    """Stop tracing: later enqueues carry no context and attempts make no span."""
    with _lock:
        _state.active = None


def instrumented() -> bool:
    """Whether :func:`instrument` is in effect."""
    return _state.active is not None


# -- the engine's side -------------------------------------------------------------------


def _failed(what: str, exc: Exception) -> None:
    """Log a tracing failure once per kind: tracing never fails the work it traces."""
    if what not in _reported:
        _reported.add(what)
        logger.warning(
            "tracing: %s failed (%s: %s); the work goes on untraced", what, type(exc).__name__, exc
        )


def _nanos(seconds: float) -> int:
    return int(seconds * 1e9)


def _fits(carrier: dict[str, str]) -> dict[str, str] | None:
    """The carrier, if the store may keep it (``records._carrier``'s limits); else None."""
    if not carrier or len(carrier) > MAX_TRACE_FIELDS:
        return None
    fields = carrier.items()
    if not all(type(k) is str and type(v) is str for k, v in fields):
        return None
    return carrier if sum(len(k) + len(v) for k, v in fields) <= MAX_TRACE_TEXT else None


def carrier() -> dict[str, str] | None:
    """The current context as the propagator injects it, to store with an event; None
    when not instrumented, when there is no context to carry, or when it is too large."""
    active = _state.active
    if active is None:
        return None
    found: dict[str, str] = {}
    try:
        active.propagate.inject(found)
    except Exception as exc:
        _failed("injecting the trace context", exc)
        return None
    return _fits(found)


def sending(
    pool: str, items: tuple[Item, ...], now: Callable[[], float]
) -> AbstractContextManager[tuple[Item, ...]]:
    """Run an enqueue in a ``send`` span when instrumented, timed by the clock's ``now``:
    gives the items to store, each carrying the span's context (as given otherwise)."""
    active = _state.active
    if active is None:
        return nullcontext(items)
    return _send(active, pool, items, now)


@contextmanager
def _send(
    active: _Tracing, pool: str, items: tuple[Item, ...], now: Callable[[], float]
) -> Iterator[tuple[Item, ...]]:
    attributes: dict[str, Any] = {
        "messaging.system": "dopool",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": pool,
    }
    if len(items) > 1:
        attributes["messaging.batch.message_count"] = len(items)
    try:
        span = active.tracer.start_span(
            f"send {pool}",
            kind=active.trace.SpanKind.PRODUCER,
            attributes=attributes,
            start_time=_nanos(now()),
        )
        token = active.context.attach(active.trace.set_span_in_context(span))
    except Exception as exc:
        _failed("starting a send span", exc)
        yield items
        return
    try:
        found = carrier()
        yield items if found is None else tuple(item._replace(trace=found) for item in items)
    except BaseException as exc:
        _end(active, span, exc, now)
        raise
    finally:
        active.context.detach(token)
    _end(active, span, None, now)


def _end(
    active: _Tracing, span: Span, failure: BaseException | None, now: Callable[[], float]
) -> None:
    try:
        if failure is not None:
            span.record_exception(failure)
            span.set_status(active.trace.Status(active.trace.StatusCode.ERROR, repr(failure)))
        span.end(end_time=_nanos(now()))
    except Exception as exc:
        _failed("ending a span", exc)


class Attempt:
    """An attempt's span: current while its handler runs (:meth:`running`), ended with its
    outcome (:meth:`end`)."""

    __slots__ = ("_active", "_span")

    def __init__(self, active: _Tracing, span: Span) -> None:
        self._active = active
        self._span = span

    @contextmanager
    def running(self) -> Iterator[None]:
        """The span as the current one, for the handler (and its follow-ups) to see."""
        context = self._active.context
        try:
            token = context.attach(self._active.trace.set_span_in_context(self._span))
        except Exception as exc:
            _failed("entering an attempt span", exc)
            yield
            return
        try:
            yield
        finally:
            context.detach(token)

    def end(self, failure: BaseException | None, outcome: str, at: float) -> None:
        """End the span at clock time ``at``, with the attempt's outcome."""
        try:
            self._span.set_attribute("dopool.outcome", outcome)
        except Exception as exc:
            _failed("ending a span", exc)
        _end(self._active, self._span, failure, lambda: at)


def attempt(
    pool: str,
    instance: str,
    event_id: str,
    number: int,
    trace: dict[str, str] | None,
    started_at: float,
) -> Attempt | None:
    """A ``process`` span for attempt ``number`` of an event that carries ``trace``,
    started at clock time ``started_at``; None when not instrumented."""
    active = _state.active
    if active is None:
        return None
    try:
        parent = None if trace is None else active.propagate.extract(trace)
        links: Sequence[Any] = ()
        if parent is not None:
            found = active.trace.get_current_span(parent).get_span_context()
            links = (active.trace.Link(found),) if found.is_valid else ()
        span = active.tracer.start_span(
            f"process {pool}",
            context=parent,
            kind=active.trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "dopool",
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": pool,
                "messaging.message.id": event_id,
                "dopool.instance": instance,
                "dopool.attempt": number,
            },
            links=links,
            start_time=_nanos(started_at),
        )
    except Exception as exc:
        _failed("starting an attempt span", exc)
        return None
    return Attempt(active, span)
