"""Per-attempt middleware: code that wraps every attempt of a pool, or of a runtime.

A :class:`Middleware` overrides any of three hooks, each called on the instance's thread:

- :meth:`~Middleware.before`, before the handler, inside the attempt: it may use
  ``ctx.enqueue`` and ``ctx.storage``, committed with the attempt's outcome; raising
  fails the attempt as the handler raising would (the handler is not called);
- :meth:`~Middleware.on_error`, when the attempt failed (the handler or a ``before``
  raised), inside the attempt: it returns the exception the attempt fails with, the one
  given or another: ``RetryAfter(seconds)`` to retry it then, ``PermanentError`` to
  dead-letter it at once, any other exception to leave it to the retry policy;
- :meth:`~Middleware.after`, once the outcome has committed, with the :class:`Outcome`:
  for metrics, logs and notifications; what it raises is logged and changes nothing.

The runtime's middleware (``Runtime(middleware=[...])``) wraps the pool's
(``define(middleware=[...])``), and a list's first wraps the rest: ``before`` runs in
that order, ``on_error`` and ``after`` in the reverse one, as the layers of an onion
unwind. Only the middleware whose ``before`` ran (the outer ones, when one raises) see
``on_error`` and ``after``. A hook that raises a ``BaseException`` (``SystemExit``) is
treated as one that raises an ``Exception``: it never takes the instance down.

The built-in policies read as middleware would be written: the retry policy is an
``on_error`` that leaves the error to the policy's delay, ``RetryAfter`` one that sets the
delay, ``PermanentError`` one that dead-letters; they stay in the engine, where the
attempt count and the retry time are persisted with the outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from dopool._engine.context import EventContext
from dopool._errors import ConfigurationError, shown
from dopool._types import Outcome
from dopool._usercode import check_synchronous

logger = logging.getLogger("dopool.attempts")

_HOOKS = ("before", "on_error", "after")


class Middleware:
    """A base to override: each hook does nothing unless overridden (see the module
    docstring)."""

    def before(self, ctx: EventContext) -> None:
        """Called before the handler, inside the attempt."""

    def on_error(self, ctx: EventContext, error: BaseException) -> BaseException:
        """Called when the attempt failed: the exception it fails with (``error`` as given,
        by default)."""
        return error

    def after(self, ctx: EventContext, outcome: Outcome) -> None:
        """Called once the attempt's outcome has committed."""


def check_middleware(given: object, where: str) -> tuple[Middleware, ...]:
    """``given`` as a tuple of middleware, each checked: an instance of
    :class:`Middleware`, its overridden hooks synchronous.

    Raises:
        ConfigurationError: not a list or tuple of Middleware instances; a hook that is
            a coroutine function or a generator function.
    """
    if isinstance(given, Middleware) or not isinstance(given, list | tuple):
        raise ConfigurationError(
            f"{where} must be a list of dopool.Middleware instances, got {shown(given)}"
        )
    for position, item in enumerate(given):
        if not isinstance(item, Middleware):
            hint = " (a class: instantiate it)" if isinstance(item, type) else ""
            raise ConfigurationError(
                f"{where}[{position}] must be a dopool.Middleware instance, got {shown(item)}{hint}"
            )
        for hook in _HOOKS:
            check_synchronous(getattr(item, hook), f"{where}[{position}].{hook}")
    return tuple(given)


def enter(chain: Sequence[Middleware], ctx: EventContext) -> tuple[int, BaseException | None]:
    """Call each ``before`` in order, until one raises: how many returned, and what the
    one that stopped them raised (its traceback from its own frame on), or None."""
    for entered, middleware in enumerate(chain):
        try:
            middleware.before(ctx)
        except BaseException as exc:  # SystemExit too: it fails the attempt, nothing more
            if exc.__traceback__ is not None:
                exc.__traceback__ = exc.__traceback__.tb_next
            return entered, exc
    return len(chain), None


def failed(
    chain: Sequence[Middleware], entered: int, ctx: EventContext, error: BaseException
) -> BaseException:
    """The exception the attempt fails with, after each entered ``on_error``, the innermost
    first. One that raises replaces the error with what it raised; one that returns no
    exception replaces it with a ``TypeError`` that names it."""
    for middleware in reversed(chain[:entered]):
        try:
            returned: object = middleware.on_error(ctx, error)
        except BaseException as exc:
            error = exc
            continue
        if isinstance(returned, BaseException):
            error = returned
        else:
            error = TypeError(
                f"{type(middleware).__name__}.on_error returned {shown(returned)}, not an "
                f"exception (return the error given to leave the attempt's failure as it is)"
            )
    return error


def finished(
    chain: Sequence[Middleware], entered: int, ctx: EventContext, outcome: Outcome
) -> None:
    """Call each entered ``after``, the innermost first; what one raises is logged."""
    for middleware in reversed(chain[:entered]):
        try:
            middleware.after(ctx, outcome)
        except BaseException as exc:  # after the commit: it changes nothing
            logger.error(
                "%s.after raised for event %s:%d (attempt %d); ignored: %s: %s",
                type(middleware).__name__,
                ctx.instance_id,
                ctx.sequence,
                ctx.attempt,
                type(exc).__name__,
                exc,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
