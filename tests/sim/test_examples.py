"""Every scenario under examples/ runs, small, as docs/simulate.md shows it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dopool._cli import cli

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples").rglob("*.toml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: str(path.relative_to(ROOT)))
def test_an_example_runs_small_and_keeps_the_guarantees(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the scenarios named as docs/simulate.md names them
    out = tmp_path / "run.json"
    scenario = str(path.relative_to(ROOT))
    args = ["simulate", "--scenario", scenario, "-q", "--events", "150", "--json", str(out)]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0, done.output
    document = json.loads(out.read_text(encoding="utf-8"))
    assert document["invariants_passed"]
    assert document["events"]["offered"] > 0


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: str(path.relative_to(ROOT)))
def test_an_example_gives_the_same_bytes_for_the_same_seed(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    outputs = []
    for run in ("first", "second"):
        json_path, trace_path = tmp_path / f"{run}.json", tmp_path / f"{run}.jsonl"
        args = ["simulate", "--scenario", str(path.relative_to(ROOT)), "-q", "--events", "100"]
        args += ["--json", str(json_path), "--trace", str(trace_path)]
        done = CliRunner().invoke(cli, args)
        assert done.exit_code == 0, done.output
        outputs.append((json_path.read_bytes(), trace_path.read_bytes()))
    assert outputs[0] == outputs[1]
