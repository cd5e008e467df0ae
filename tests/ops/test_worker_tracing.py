"""One trace from a producer process through ``dopool worker`` to a follow-up
(docs/deployment.md, "Traces"): the context travels in the event's record, so the worker's
attempt is a child of the producer's ``send`` span and the follow-up's attempt a child of
that attempt."""

from __future__ import annotations

import importlib
import json
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import dopool
from cli_support import assert_one_line_error, invoke
from dopool import tracing
from worker_support import Evidence, Worker, until

# The worker's app: it sets OpenTelemetry's global tracer provider, as an app (or
# opentelemetry-instrument) would, whose spans go, as JSON lines, to a file the test reads;
# `dopool worker --otel` traces through it.
APP = textwrap.dedent(
    """
    import json

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Lines(SpanExporter):
        def export(self, spans):
            with open(SPANS, "a", encoding="utf-8") as out:
                for span in spans:
                    out.write(json.dumps({
                        "name": span.name,
                        "trace": span.context.trace_id,
                        "span": span.context.span_id,
                        "parent": span.parent.span_id if span.parent else None,
                    }) + "\\n")
            return SpanExportResult.SUCCESS

    def build(runtime):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(Lines()))
        trace.set_tracer_provider(provider)

        def order(ctx):
            ctx.enqueue({"bill": ctx.event["id"]}, pool="billing")

        runtime.define("orders", execute=order)
        runtime.define("billing", execute=lambda ctx: None)
    """
)


@pytest.fixture
def producer() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """This process, as a web app that enqueues: traced, its spans kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(tracer_provider=provider)
    yield provider, exporter
    tracing.uninstrument()
    provider.shutdown()


def spans_by_name(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return {line["name"]: line for line in lines}


def only(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    (found,) = [span for span in spans if span.name == name]
    return found


def test_a_trace_crosses_the_producer_the_worker_and_a_follow_up(
    tmp_path: Path,
    store_path: Path,
    evidence: Evidence,
    worker: Callable[..., Worker],
    producer: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exported = producer
    spans_file = tmp_path / "worker-spans.jsonl"
    app = tmp_path / "traced_app.py"
    app.write_text(f"SPANS = {str(spans_file)!r}\n{APP}", encoding="utf-8")
    running = worker(store_path, evidence, "--otel", spec=f"{app}:build").ready()
    web = provider.get_tracer("web")
    with web.start_as_current_span("POST /orders"), dopool.connect(store_path) as connection:
        connection.pool("orders").enqueue({"id": 1})
    until(lambda: "process billing" in spans_by_name(spans_file), "the follow-up's span")
    assert running.stop() == 0

    produced = exported.get_finished_spans()
    request, send = only(produced, "POST /orders"), only(produced, "send orders")
    assert request.context is not None
    assert send.context is not None
    assert send.parent is not None
    assert send.parent.span_id == request.context.span_id
    worked = spans_by_name(spans_file)
    process, follow_up = worked["process orders"], worked["process billing"]
    assert process["trace"] == follow_up["trace"] == request.context.trace_id
    assert process["parent"] == send.context.span_id
    assert follow_up["parent"] == process["span"]


def test_otel_without_the_extra_is_one_line_and_runs_nothing(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.import_module

    def without_opentelemetry(name: str, package: str | None = None) -> ModuleType:
        if name.startswith("opentelemetry"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", without_opentelemetry)
    result = invoke("worker", "app:build", "--store", str(store_path), "--otel")
    assert_one_line_error(result, 2, "--otel: dopool.tracing needs opentelemetry-api", "'otel'")
    assert not store_path.exists()
    assert not tracing.instrumented()
