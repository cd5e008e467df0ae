"""The one-line errors: ``CliError``, ``CliUsageError``, exit codes, the group raising them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from dopool._cli._terminal import _clean
from dopool._errors import DopoolError, ScenarioError

USAGE_EXIT = 2
FAILURE_EXIT = 1
INTERRUPTED_EXIT = 128 + 2  # as a shell reports a process that SIGINT ended


class CliError(click.ClickException):
    """Printed as one ``Error: ...`` line on stderr; exits 1."""

    exit_code = FAILURE_EXIT


class CliInterrupted(CliError):
    """Ctrl-C (SIGINT) stopped the command: one ``Error: ...`` line, exit 130."""

    exit_code = INTERRUPTED_EXIT


class CliUsageError(CliError):
    """A bad flag or scenario: one ``Error: ...`` line, exit 2."""

    exit_code = USAGE_EXIT


class _OneLineErrors(click.Group):
    """A group whose usage errors are one line too (click prints usage and a hint)."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line():
            return super().invoke(ctx)


@contextmanager
def _one_line() -> Iterator[None]:
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise
    except click.UsageError as exc:
        hint = ""
        if exc.ctx is not None:
            hint = f" (see '{exc.ctx.command_path} --help')"
        raise CliUsageError(exc.format_message() + hint) from None
    except ScenarioError as exc:
        raise CliUsageError(_clean(exc)) from None
    except DopoolError as exc:
        raise CliError(_clean(exc)) from None
