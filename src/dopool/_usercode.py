"""What dopool asks of the code users hand it: plain, synchronous callables.

A pool's handler alone may also be an ``async def`` (:func:`check_handler`): the engine
awaits it on an event loop (docs/api.md, "Async handlers").

A handler, hook, subscriber, schema or ``where`` predicate written with ``async def``
(or as a generator) returns a coroutine (or a generator) without running its body.
Taken at its word, the engine would count an event succeeded that never ran, call a
hook that did nothing, or take the coroutine for a true value and redrive or purge
every dead letter. So such a callable is refused where it is handed over
(:func:`check_synchronous`), and such a result, from a callable the check cannot see
through (an object whose ``__call__`` is ``async``, say), is refused when it comes
back (:func:`ran`).
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any

from dopool._errors import ConfigurationError, shown


def check_synchronous(function: object, label: str) -> None:
    """Refuse what is not callable, and an ``async def`` or generator function (or an
    object whose ``__call__`` is one).

    Raises:
        ConfigurationError: ``function`` is not callable, or would return without
            running its body.
    """
    if not callable(function):
        raise ConfigurationError(f"{label} must be callable, got {shown(function)}")
    kind = deferring(function)
    if kind is not None:
        raise ConfigurationError(
            f"{label} must be a plain function: {shown(function)} is {kind}, whose body would "
            "not run when dopool calls it (dopool calls it synchronously, in the instance's "
            "thread)"
        )


def check_handler(function: object, label: str) -> bool:
    """Refuse what :func:`check_synchronous` refuses, but an ``async def`` (or an object
    whose ``__call__`` is one); whether ``function`` is one.

    Raises:
        ConfigurationError: ``function`` is not callable, or is a generator function.
    """
    if callable(function) and deferring(function) == ASYNC_FUNCTION:
        return True
    check_synchronous(function, label)
    return False


#: What :func:`deferring` calls a coroutine function.
ASYNC_FUNCTION = "an async function"


def deferring(function: object) -> str | None:
    """What ``function`` is if calling it would not run its body (``"an async function"``,
    say), an object whose ``__call__`` is such a function included; else None."""
    # An object's own ``__call__`` says; a partial or a class is looked at as it is.
    plain = inspect.isroutine(function) or isinstance(function, partial | type)
    if callable(function) and not plain:
        function = type(function).__call__
    if inspect.iscoroutinefunction(function):
        return ASYNC_FUNCTION
    if inspect.isasyncgenfunction(function):
        return "an async generator function"
    if inspect.isgeneratorfunction(function):
        return "a generator function"
    return None


def ran(result: Any, label: str, error: type[Exception] = TypeError) -> Any:
    """``result``, unless it is a coroutine, a generator or another awaitable: then the
    code that returned it never ran its body, and ``error`` (TypeError) says so (it is
    closed first, so it warns of nothing)."""
    if result is None or not (
        inspect.isawaitable(result) or inspect.isgenerator(result) or inspect.isasyncgen(result)
    ):
        return result
    close = getattr(result, "close", None)
    if callable(close):
        close()
    raise error(
        f"{label} returned a {type(result).__name__} instead of running its body: dopool "
        "calls it synchronously (write it with def, not async def or yield)"
    )
