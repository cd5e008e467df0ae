"""Options shared by the test and chaos suites: which backend a simulated clock uses.

A ``SimulatedClock`` made without a backend runs its actors as greenlets on the
driving thread (docs/design.md, "Actors as greenlets"). ``pytest
--sim-backend=threads`` runs every test on clocks with one OS thread per actor
instead; it sets ``DOPOOL_SIM_BACKEND``, which such a clock reads. Tests that need
one backend (they call the runtime from other threads, say) make their clock with it.
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
        "else greenlet)",
    )


def pytest_configure(config: pytest.Config) -> None:
    backend = config.getoption("--sim-backend")
    if backend is not None:
        os.environ[BACKEND_VARIABLE] = backend


def pytest_report_header(config: pytest.Config) -> str:
    return f"simulated clock backend: {os.environ.get(BACKEND_VARIABLE) or 'greenlet'}"
