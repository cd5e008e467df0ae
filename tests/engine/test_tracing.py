"""OpenTelemetry traces (docs/deployment.md, "Traces"): a ``send`` span per enqueue, a
``process`` span per attempt whose parent is the context its event carries, and a follow-up
that carries its attempt's context; under both clocks, across a store's reopening, and
never failing the work when tracing fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from dopool import EventContext, RetryPolicy, Runtime, tracing
from dopool._store.environment import open_readonly
from dopool._store.layout import MAX_TRACE_TEXT, Namespace

TIMEOUT = 30.0


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    """The provider dopool is instrumented with, for the test's own spans too."""
    provider = TracerProvider()
    tracing.instrument(tracer_provider=provider)
    yield provider
    tracing.uninstrument()
    provider.shutdown()


@pytest.fixture
def spans(provider: TracerProvider) -> InMemorySpanExporter:
    """The spans the provider finished, which the test reads."""
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def test_an_attempt_is_a_child_of_the_enqueue_and_its_follow_up_of_the_attempt(
    sim: Runtime, spans: InMemorySpanExporter
) -> None:
    billing = sim.define("billing", execute=lambda ctx: None)

    def order(ctx: EventContext) -> None:
        ctx.enqueue({"bill": ctx.event["id"]}, pool="billing")

    orders = sim.define("orders", execute=order)
    result = orders.enqueue({"id": 1})
    assert orders.join(timeout=TIMEOUT)
    assert billing.join(timeout=TIMEOUT)

    (send,) = named(spans, "send orders")
    (process,) = named(spans, "process orders")
    (follow_up,) = named(spans, "process billing")
    assert send.kind is SpanKind.PRODUCER
    assert process.kind is SpanKind.CONSUMER
    assert send.context is not None
    assert process.context is not None
    trace_id = send.context.trace_id
    assert {span.context.trace_id for span in (process, follow_up) if span.context} == {trace_id}
    assert parent_id(process) == send.context.span_id
    assert parent_id(follow_up) == process.context.span_id
    assert [link.context.span_id for link in process.links] == [send.context.span_id]
    assert process.attributes is not None
    assert process.attributes["messaging.message.id"] == result.event_id
    assert process.attributes["messaging.destination.name"] == "orders"
    assert process.attributes["dopool.attempt"] == 1
    assert process.attributes["dopool.outcome"] == "succeeded"
    assert process.status.status_code is StatusCode.UNSET


def test_spans_run_in_the_clocks_time(sim: Runtime, spans: InMemorySpanExporter) -> None:
    """Under a SimulatedClock an attempt starts and ends in virtual time."""

    def slow(ctx: EventContext) -> None:
        ctx.sleep(2.5)

    pool = sim.define("slow", execute=slow)
    pool.enqueue("x", delay=10.0)
    assert pool.join(timeout=TIMEOUT)
    (process,) = named(spans, "process slow")
    assert (process.start_time, process.end_time) == (10 * 10**9, int(12.5 * 10**9))


def test_each_failed_attempt_records_its_exception(
    sim: Runtime, spans: InMemorySpanExporter
) -> None:
    def fail(ctx: EventContext) -> None:
        raise KeyError("b")

    pool = sim.define("jobs", execute=fail, retry=RetryPolicy(max_attempts=2, jitter=0.0))
    pool.enqueue("x")
    assert pool.join(timeout=TIMEOUT)
    (send,) = named(spans, "send jobs")
    attempts = sorted(named(spans, "process jobs"), key=lambda s: s.start_time or 0)
    assert [(s.attributes or {}).get("dopool.outcome") for s in attempts] == [
        "retried",
        "dead_lettered",
    ]
    for span in attempts:  # both children of the one enqueue
        assert send.context is not None
        assert parent_id(span) == send.context.span_id
        assert span.status.status_code is StatusCode.ERROR
        (event,) = span.events
        assert event.name == "exception"
        assert (event.attributes or {})["exception.type"] == "KeyError"


def test_a_batch_is_one_send_and_a_span_per_event(
    sim: Runtime, spans: InMemorySpanExporter
) -> None:
    pool = sim.define("many", execute=lambda ctx: None, concurrency=3)
    pool.enqueue_many(range(5))
    assert pool.join(timeout=TIMEOUT)
    (send,) = named(spans, "send many")
    assert (send.attributes or {})["messaging.batch.message_count"] == 5
    processed = named(spans, "process many")
    assert len(processed) == 5
    assert send.context is not None
    assert {parent_id(span) for span in processed} == {send.context.span_id}


def test_the_context_survives_the_store_being_reopened(
    store_path: Path, spans: InMemorySpanExporter
) -> None:
    """The context is stored with the event: a runtime that opens the store later runs the
    event in the enqueuer's trace."""
    with Runtime.simulated(store_path, seed=0) as first:
        pool = first.define("later", execute=lambda ctx: None)
        pool.pause()
        pool.enqueue("x")
    (send,) = named(spans, "send later")
    with Runtime.simulated(store_path, seed=0) as second:
        pool = second.define("later", execute=lambda ctx: None)
        pool.resume()
        assert pool.join(timeout=TIMEOUT)
    (process,) = named(spans, "process later")
    assert send.context is not None
    assert process.context is not None
    assert process.context.trace_id == send.context.trace_id
    assert parent_id(process) == send.context.span_id


def stored_trace(path: Path, pool: str) -> dict[str, str] | None:
    """The trace context of the event at the head of ``pool``'s instance 0, as stored."""
    env = open_readonly(path)
    try:
        with env.begin() as txn:
            first = Namespace(pool, 0).first_event(txn)
    finally:
        env.close()
    assert first is not None
    return first[1].trace


def test_nothing_is_carried_or_traced_unless_instrumented(sim: Runtime, store_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with trace.use_span(provider.get_tracer("test").start_span("request"), end_on_exit=True):
        pool = sim.define("plain", execute=lambda ctx: None)
        pool.pause()
        pool.enqueue("x")
    sim.close()
    assert stored_trace(store_path, "plain") is None
    assert [span.name for span in exporter.get_finished_spans()] == ["request"]


def test_an_event_carries_the_enqueuers_context(
    sim: Runtime, store_path: Path, spans: InMemorySpanExporter
) -> None:
    pool = sim.define("held", execute=lambda ctx: None)
    pool.pause()
    pool.enqueue("x")
    (send,) = named(spans, "send held")
    assert send.context is not None
    sim.close()
    carried = stored_trace(store_path, "held")
    sent = send.context
    parent = f"00-{sent.trace_id:032x}-{sent.span_id:016x}-{sent.trace_flags:02x}"
    assert carried == {"traceparent": parent}


class Exploding:
    """A propagator that raises: tracing must not fail the enqueue or the attempt."""

    fields: ClassVar[set[str]] = set()

    def inject(self, *_args: object, **_kwargs: object) -> None:
        raise RuntimeError("inject exploded")

    def extract(self, *_args: object, **_kwargs: object) -> None:
        raise RuntimeError("extract exploded")


def test_a_propagator_that_raises_leaves_the_work_untraced_and_done(
    sim: Runtime, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    from opentelemetry import propagate

    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", Exploding())
    ran: list[str] = []
    pool = sim.define("sturdy", execute=lambda ctx: ran.append(ctx.event))
    pool.enqueue("x")
    assert pool.join(timeout=TIMEOUT)
    assert ran == ["x"]
    assert "inject exploded" in caplog.text


class Wide:
    """The W3C propagator, and a field that makes the context too large to store."""

    def __init__(self, size: int) -> None:
        self._inner = TraceContextTextMapPropagator()
        self._size = size

    @property
    def fields(self) -> set[str]:
        return {*self._inner.fields, "wide"}

    def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
        self._inner.inject(carrier, context)
        carrier["wide"] = "x" * self._size

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        return self._inner.extract(carrier, context)


@pytest.mark.parametrize("size", [MAX_TRACE_TEXT - 100, MAX_TRACE_TEXT])
def test_a_context_too_large_to_store_is_left_out(
    sim: Runtime, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    from opentelemetry import propagate

    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", Wide(size))
    pool = sim.define("big", execute=lambda ctx: None)
    pool.enqueue("x")
    assert pool.join(timeout=TIMEOUT)
    (send,) = named(spans, "send big")
    (process,) = named(spans, "process big")
    assert send.context is not None
    assert process.context is not None
    if size < MAX_TRACE_TEXT - 60:  # traceparent and the field's names fit
        assert parent_id(process) == send.context.span_id
    else:  # a trace of its own
        assert process.parent is None
        assert process.context.trace_id != send.context.trace_id


def test_an_awaited_enqueue_is_traced_in_the_coroutines_span(
    store_path: Path, provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    """``enqueue_async`` waits in another thread, which runs in a copy of the coroutine's
    context: the span current in the coroutine is the enqueue's parent."""
    import asyncio

    async def request(pool: Any) -> None:
        with provider.get_tracer("web").start_as_current_span("GET /"):
            await pool.enqueue_async("x")

    with Runtime(store_path) as runtime:
        pool = runtime.define("web", execute=lambda ctx: None)
        asyncio.run(request(pool))
        assert pool.join(timeout=TIMEOUT)
    (outer,) = named(spans, "GET /")
    (send,) = named(spans, "send web")
    (process,) = named(spans, "process web")
    assert outer.context is not None
    assert send.context is not None
    assert parent_id(send) == outer.context.span_id
    assert parent_id(process) == send.context.span_id
