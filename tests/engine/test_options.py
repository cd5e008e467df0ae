"""A pool's options: typed keywords, one record validated once, an unknown one named."""

from __future__ import annotations

from typing import Any

import pytest

from dopool import ConfigurationError, RetryPolicy, Runtime, WorkerPool
from dopool._engine.options import PoolOptions


def noop(_ctx: Any) -> None:
    pass


def test_an_unknown_option_is_named_with_a_guess(sim: Runtime) -> None:
    options: dict[str, Any] = {"execute": noop, "concurency": 2}
    with pytest.raises(ConfigurationError, match="unknown option 'concurency'; did you mean"):
        sim.define("p", **options)
    colour: dict[str, Any] = {"colour": "red"}
    with pytest.raises(ConfigurationError, match=r"unknown option 'colour'$"):
        WorkerPool.define("p", runtime=sim, execute=noop, **colour)
    assert sim.define("p", execute=noop).concurrency == 1  # nothing was defined before


def test_execute_is_required() -> None:
    with pytest.raises(ConfigurationError, match="needs execute="):
        PoolOptions.of({"concurrency": 2})


def test_options_are_one_frozen_record_with_defaults() -> None:
    options = PoolOptions.of({"execute": noop, "retry": RetryPolicy(max_attempts=4)})
    assert (options.concurrency, options.max_queue_depth, options.max_attempts) == (1, None, 4)
    assert PoolOptions(execute=noop).max_attempts == 1
    with pytest.raises(AttributeError):
        options.concurrency = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("execute", 5, "execute must be callable"),
        ("concurrency", 0, "concurrency must be an int"),
        ("concurrency", True, "concurrency must be an int"),
        ("retry", 3, "retry must be a RetryPolicy"),
        ("schema", "x", "schema must be callable"),
        ("on_empty", 1, "on_empty must be callable"),
        ("max_queue_depth", 0, "max_queue_depth must be an int"),
    ],
)
def test_each_option_is_checked(option: str, value: object, words: str) -> None:
    fields: dict[str, Any] = {"execute": noop, option: value}
    with pytest.raises(ConfigurationError, match=words):
        PoolOptions.of(fields)


@pytest.mark.parametrize("value", [True, False, -1, 1001, 1.0, "6"])
def test_alarm_retries_is_checked(value: object) -> None:
    with pytest.raises(ConfigurationError, match=r"alarm_retries must be an int from 0 to 1000"):
        PoolOptions.of({"execute": noop, "alarm_retries": value})


@pytest.mark.parametrize("value", [None, 0, 6, 1000])
def test_alarm_retries_takes_none_or_0_to_1000(value: int | None) -> None:
    assert PoolOptions.of({"execute": noop, "alarm_retries": value}).alarm_retries == value
