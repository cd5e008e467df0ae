"""Code users hand dopool must run when called: ``async def`` and generators are refused.

Such a callable returns a coroutine (or a generator) without running its body: a
handler's event counted succeeded that never ran, a ``where`` predicate's coroutine
taken for a true value (every dead letter purged), a hook that did nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from dopool import ConfigurationError, EventContext, EventValidationError, FilterError, Runtime

WAIT = 10.0


async def _async_function(_argument: Any) -> None:
    raise AssertionError("never runs")


async def _async_generator(_argument: Any) -> Any:
    yield None


def _generator(_argument: Any) -> Iterator[None]:
    yield None


class _AsyncCall:
    async def __call__(self, _argument: Any) -> None:
        raise AssertionError("never runs")


def _through(function: Any) -> Any:
    """A plain function returning what ``function`` returns, which ``define`` cannot see."""

    def call(argument: Any) -> Any:
        return function(argument)

    return call


DEFERRING = [
    pytest.param(_async_function, id="async-def"),
    pytest.param(_async_generator, id="async-generator"),
    pytest.param(_generator, id="generator"),
    pytest.param(_AsyncCall(), id="async-call"),
    pytest.param(partial(_async_function), id="partial"),
]


# A handler may be an async def (docs/api.md, "Async handlers"): of those, define refuses
# its generator kinds alone; a hook any of them.
REFUSED = [
    *(
        pytest.param(option, *case.values, id=f"{option}-{case.id}")
        for case in DEFERRING
        for option in ("schema", "on_dead_letter", "on_empty")
    ),
    *(
        pytest.param("execute", *case.values, id=f"execute-{case.id}")
        for case in DEFERRING
        if case.id in ("async-generator", "generator")
    ),
]


@pytest.mark.parametrize(("option", "function"), REFUSED)
def test_define_refuses_a_callable_whose_body_would_not_run(
    sim: Runtime, option: str, function: Any
) -> None:
    options: dict[str, Any] = {"execute": lambda ctx: None, option: function}
    with pytest.raises(ConfigurationError, match=f"^{option} must be a plain function"):
        sim.define("p", **options)
    assert "p" not in sim.pools


@pytest.mark.parametrize("function", [*DEFERRING, pytest.param("print", id="not-callable")])
def test_subscribe_refuses_what_it_could_not_call_through(sim: Runtime, function: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"^subscribe's callback must be"):
        sim.subscribe(function)


def test_a_handler_returning_a_coroutine_is_dead_lettered_not_counted_succeeded(
    sim: Runtime,
) -> None:
    ran: list[Any] = []

    async def body(ctx: EventContext) -> None:
        ran.append(ctx.event)

    pool = sim.define("p", execute=_through(body))
    pool.enqueue("x")
    assert pool.join(timeout=WAIT)
    status = pool.status()
    assert (status.succeeded, status.dead_lettered) == (0, 1)
    [dead] = pool.dead_letters()
    assert dead.error.startswith("PermanentError: the handler returned a coroutine")
    assert ran == []


def test_a_where_predicate_that_would_not_run_chooses_nothing(sim: Runtime) -> None:
    """Its coroutine is true: every dead letter was purged."""

    def fail(ctx: EventContext) -> None:
        raise ValueError(ctx.event)

    pool = sim.define("p", execute=fail, concurrency=2)
    pool.enqueue_many([1, 2, 3])
    assert pool.join(timeout=WAIT)

    async def keep_none(_dead: Any) -> bool:
        return False

    for verb in (pool.dead_letters, pool.redrive, pool.purge_dead_letters):
        with pytest.raises(FilterError, match="an async function") as refused:
            verb(where=keep_none)
        assert refused.value.argument == "where"
        with pytest.raises(FilterError, match="returned a coroutine") as raised:
            verb(where=_through(keep_none))
        assert raised.value.dead_letter is not None
        assert isinstance(raised.value.__cause__, TypeError)
    assert len(pool.dead_letters()) == 3


def test_a_schema_or_hook_returning_a_coroutine_is_a_failure_said_out_loud(
    sim: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    async def later(_argument: Any) -> Any:
        raise AssertionError("never runs")

    def fail(ctx: EventContext) -> None:
        raise ValueError(ctx.event)

    pool = sim.define(
        "p",
        execute=fail,
        schema=lambda event: event if event != "schema" else later(event),
        on_dead_letter=_through(later),
        on_empty=_through(later),
    )
    sim.subscribe(_through(later))
    with pytest.raises(EventValidationError, match="the schema returned a coroutine"):
        pool.enqueue("schema")
    with caplog.at_level(logging.ERROR, logger="dopool"):
        pool.enqueue("x")
        assert pool.join(timeout=WAIT)
    for who in ("on_dead_letter", "on_empty", "a subscriber"):
        assert f"{who} returned a coroutine" in caplog.text
    assert pool.status().dead_lettered == 1
