"""Fixtures for the chaos suite (``tests/conftest.py`` is not visible from here)."""

from __future__ import annotations

from collections.abc import Iterator

import pykka
import pytest

from dopool._engine.actor import forget_instance, running_instances


@pytest.fixture(autouse=True)
def _stop_stray_actors() -> Iterator[None]:
    """No actor outlives a test, even one whose runtime was left open by a failure."""
    yield
    try:
        for ref in running_instances():  # (not in pykka's registry: see InstanceActor.launch)
            ref.stop(block=False)
        pykka.ActorRegistry.stop_all()
    finally:  # one that cannot stop (a failed test's) must not fail every later test
        for ref in pykka.ActorRegistry.get_all():
            pykka.ActorRegistry.unregister(ref)
        for ref in running_instances():
            forget_instance(ref)
