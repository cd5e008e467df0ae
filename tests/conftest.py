"""Shared fixtures: simulated runtimes on temporary stores, ``dopool worker`` processes and
their evidence (``worker_support``), and no actor outlives a test."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pykka
import pytest
from hypothesis import HealthCheck, settings

from dopool import Runtime
from dopool._engine.actor import forget_instance, running_instances
from worker_support import Evidence, Worker, workers

# "fixed" (the default): the same examples every run, so a local run repeats. "explore":
# new examples every run, from a seed that pytest's header prints (the repository's
# conftest.py); .ci/run uses it, and a failure prints the blob that replays its example.
for _name, _derandomize in (("fixed", True), ("explore", False)):
    settings.register_profile(
        _name,
        derandomize=_derandomize,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


@pytest.fixture(autouse=True)
def _stop_stray_actors() -> Iterator[None]:
    """Fail the test that leaves actors running (it forgot to close a runtime), after
    stopping them, so that they cannot leak into later tests."""
    yield
    instances = running_instances()  # (not in pykka's registry: see InstanceActor.launch)
    stray = [ref.actor_class.__name__ for ref in pykka.ActorRegistry.get_all() + instances]
    try:
        for ref in instances:
            ref.stop(block=False)
        pykka.ActorRegistry.stop_all()
    finally:  # one that cannot stop (a failed test's) must not fail every later test
        for ref in pykka.ActorRegistry.get_all():
            pykka.ActorRegistry.unregister(ref)
        for ref in running_instances():
            forget_instance(ref)
    if stray:
        pytest.fail(f"the test left {len(stray)} actor(s) running: {', '.join(stray)}")


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture(params=["greenlet", "threads"])
def sim(store_path: Path, request: pytest.FixtureRequest) -> Iterator[Runtime]:
    """A runtime on a SimulatedClock at t=0 with seed 0, closed after the test: once
    with each backend (its actors greenlets on this thread, or a thread each)."""
    runtime = Runtime.simulated(store_path, seed=0, backend=request.param)
    yield runtime
    runtime.close()


@pytest.fixture
def opened() -> Iterator[list[Runtime]]:
    """Runtimes a test opens (shared workers, say), closed at its end, the last first."""
    runtimes: list[Runtime] = []
    yield runtimes
    for runtime in reversed(runtimes):
        runtime.close()


@pytest.fixture
def evidence() -> Iterator[Evidence]:
    """What ``dopool worker`` processes' handlers write, in order (``worker_support``)."""
    found = Evidence()
    yield found
    found.close()


@pytest.fixture
def worker() -> Iterator[Callable[..., Worker]]:
    """Starts ``dopool worker`` processes; each is killed at the end if still running."""
    yield from workers()
