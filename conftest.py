"""Options shared by the test and chaos suites: which backend a simulated clock uses.

``pytest --sim-backend=greenlet`` runs every test on simulated clocks whose actors
are greenlets on the driving thread (docs/design.md, "Actors as greenlets"); it sets
``DOPOOL_SIM_BACKEND``, which a ``SimulatedClock`` made without a backend reads.
Tests marked ``sim_threads`` need one OS thread per actor (they call the runtime
from other threads, or block a handler on something real) and are skipped then.
"""

from __future__ import annotations

import os

import pytest

BACKEND_VARIABLE = "DOPOOL_SIM_BACKEND"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--sim-backend",
        choices=("threads", "greenlet"),
        default=None,
        help="the simulated clock's backend for every test (default: $DOPOOL_SIM_BACKEND, "
        "else threads)",
    )


def pytest_configure(config: pytest.Config) -> None:
    backend = config.getoption("--sim-backend")
    if backend is not None:
        os.environ[BACKEND_VARIABLE] = backend


def pytest_report_header(config: pytest.Config) -> str:
    return f"simulated clock backend: {os.environ.get(BACKEND_VARIABLE) or 'threads'}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(BACKEND_VARIABLE) != "greenlet":
        return
    skip = pytest.mark.skip(reason="needs the simulated clock's threads backend")
    for item in items:
        if item.get_closest_marker("sim_threads") is not None:
            item.add_marker(skip)
