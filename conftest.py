"""Options shared by the test and chaos suites: which backend a simulated clock uses.

A ``SimulatedClock`` made without a backend runs its actors as greenlets on the
driving thread (docs/design.md, "Actors as greenlets"). ``pytest
--sim-backend=threads`` runs every test on clocks with one OS thread per actor
instead; it sets ``DOPOOL_SIM_BACKEND``, which such a clock reads. Tests that need
one backend (they call the runtime from other threads, say) make their clock with it.

Under ``HYPOTHESIS_PROFILE=explore`` (the profiles are in tests/conftest.py), every
Hypothesis test draws its examples from one seed, ``$DOPOOL_HYPOTHESIS_SEED`` or a new
one, and the header says how to replay it.
"""

from __future__ import annotations

import os
import random

import pytest

BACKEND_VARIABLE = "DOPOOL_SIM_BACKEND"
SEED_VARIABLE = "DOPOOL_HYPOTHESIS_SEED"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--sim-backend",
        choices=("threads", "greenlet"),
        default=None,
        help="the simulated clock's backend for every test (default: $DOPOOL_SIM_BACKEND, "
        "else greenlet)",
    )


@pytest.hookimpl(tryfirst=True)  # before Hypothesis's plugin reads its seed option
def pytest_configure(config: pytest.Config) -> None:
    backend = config.getoption("--sim-backend")
    if backend is not None:
        os.environ[BACKEND_VARIABLE] = backend
    # Under the "explore" profile (tests/conftest.py), every Hypothesis test draws from
    # one seed: $DOPOOL_HYPOTHESIS_SEED, else a new one, printed in the header to replay.
    if os.environ.get("HYPOTHESIS_PROFILE") == "explore" and not config.option.hypothesis_seed:
        seed = os.environ.get(SEED_VARIABLE) or str(random.SystemRandom().randrange(2**32))
        config.option.hypothesis_seed = seed


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"simulated clock backend: {os.environ.get(BACKEND_VARIABLE) or 'greenlet'}"]
    seed = config.option.hypothesis_seed
    if seed:
        lines.append(
            f"hypothesis seed: {seed} (replay: HYPOTHESIS_PROFILE=explore "
            f"{SEED_VARIABLE}={seed} python -m pytest ...)"
        )
    return lines
