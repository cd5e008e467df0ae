"""A run's figures by name (docs/simulate.md, "Figures")."""

from __future__ import annotations

import pytest

from dopool._sim.driver import run
from dopool._sim.figures import DESCRIPTIONS, figures
from dopool._sim.scenario import Arrivals, Scenario


@pytest.fixture(scope="module")
def named() -> dict[str, float]:
    scenario = Scenario(instances=2, arrivals=(Arrivals(process="steady", rate=10.0, total=40),))
    return figures(run(scenario).result)


def test_every_described_figure_is_there_and_nothing_else(named: dict[str, float]) -> None:
    assert list(named) == list(DESCRIPTIONS)


def test_the_figures_are_the_results(named: dict[str, float]) -> None:
    assert (named["offered"], named["enqueued"], named["succeeded"]) == (40.0, 40.0, 40.0)
    assert named["lost"] == named["pending"] == 0.0
    assert named["invariants_passed"] == 1.0
    assert 0.0 < named["p50"] <= named["p95"] <= named["p99"] <= named["max"]
    assert 0.0 < named["utilisation"] <= named["utilisation.max"] <= 1.0
    assert named["throughput"] == pytest.approx(40.0 / named["virtual_time"])
