"""Partition keys from a list or a file (``partitions.names``, ``partitions.file``;
docs/simulate.md, "Scenario files")."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cli_support import assert_one_line_error, invoke
from dopool._errors import ScenarioError
from dopool._sim import ignored, sweep
from dopool._sim import loading as sc
from dopool._sim.driver import run
from dopool._sim.sweep import Axis, run_sweep

ROOMS = ["room-a", "room-b", "room-c", "room-d"]


def scenario(partitions: str, routing: str = "partition") -> str:
    """A per-key pool (round-robin: four instances) whose ``[partitions]`` is ``partitions``."""
    instances = '"per-key"' if routing == "partition" else "4"
    return textwrap.dedent(
        f"""
        instances = {instances}
        routing = "{routing}"

        [arrivals]
        total = 400

        [partitions]
        """
    ) + textwrap.dedent(partitions)


def write(folder: Path, text: str, name: str = "s.toml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def test_names_are_drawn_by_position_as_the_keys_k0_are() -> None:
    """The first name is key 0: with a steep zipf and a hot share it gets the most events,
    and the names draw the same keys, by position, as ``k0 ..`` with the same seed."""
    named = sc.loads(scenario(f"names = {ROOMS}\nzipf = 2.0\nhot_key_share = 0.3\n"))
    plain = sc.loads(scenario("keys = 4\nzipf = 2.0\nhot_key_share = 0.3\n"))
    counts = {i.key: i.succeeded for i in run(named).result.instances}
    assert set(counts) == set(ROOMS)
    assert max(counts, key=lambda key: counts[key]) == "room-a"
    assert sorted(counts.values(), reverse=True) == [counts[key] for key in ROOMS]
    by_position = {f"k{n}": counts[name] for n, name in enumerate(ROOMS)}
    assert {i.key: i.succeeded for i in run(plain).result.instances} == by_position


def test_a_file_is_relative_to_the_scenario_and_a_flags_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    design = tmp_path / "design"
    design.mkdir()
    (design / "rooms.txt").write_text("room-a\n\n  room-b \r\nroom-c\n", encoding="utf-8")
    (tmp_path / "other.txt").write_text("x\ny\n", encoding="utf-8")
    path = write(design, scenario('file = "rooms.txt"\n'))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = sc.resolve(str(path))
    assert loaded.partitions.file == f"{design}/rooms.txt"
    assert loaded.partitions.drawn() == ("room-a", "room-b", "room-c")  # blank lines skipped
    assert {i.key for i in run(loaded).result.instances} == {"room-a", "room-b", "room-c"}
    monkeypatch.chdir(tmp_path)
    moved = sc.resolve("design/s.toml", {"partitions.file": "other.txt"})
    assert moved.partitions.file == "other.txt"
    assert {i.key for i in run(moved).result.instances} == {"x", "y"}


@pytest.mark.parametrize(
    ("partitions", "field", "words"),
    [
        ("names = []", "partitions.names", "gives no keys"),
        (
            'names = ["a", "b", "a"]',
            "partitions.names[2]",
            "repeats the key 'a' (first given at names[0])",
        ),
        ('names = ["a", ""]', "partitions.names[1]", "must be a non-empty string"),
        ('names = ["a", 3]', "partitions.names[1]", "must be a non-empty string, got 3"),
        (f'names = ["{"é" * 1025}"]', "partitions.names[0]", "is 2,050 bytes of UTF-8, over the"),
        ('names = "a,b"', "partitions.names", "must be an array of strings"),
        ('names = ["a"]\nfile = "k.txt"', "partitions.file", "cannot be given together with"),
        (
            'names = ["a", "b"]\nkeys = 3',
            "partitions.keys",
            "must be left out with partitions.names",
        ),
        ('file = "empty.txt"', "partitions.file", "gives no keys"),
        (
            'file = "twice.txt"',
            "partitions.file",
            "line 3: repeats the key 'a' (first given at line 1)",
        ),
        ('file = "long.txt"', "partitions.file", "line 1: is 2,049 bytes of UTF-8"),
        ('file = "missing.txt"', "partitions.file", "cannot be read"),
    ],
)
def test_bad_keys_are_refused_by_name(
    tmp_path: Path, partitions: str, field: str, words: str
) -> None:
    (tmp_path / "empty.txt").write_text("\n  \n", encoding="utf-8")
    (tmp_path / "twice.txt").write_text("a\nb\na\n", encoding="utf-8")
    (tmp_path / "long.txt").write_text("x" * 2049 + "\n", encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        sc.load_file(write(tmp_path, scenario(partitions + "\n")))
    assert caught.value.field == field
    assert words in caught.value.problem


def test_keys_may_give_the_count_of_the_names() -> None:
    loaded = sc.loads(scenario(f"names = {ROOMS}\nkeys = 4\n"))
    assert loaded.partitions.drawn() == tuple(ROOMS)
    assert "keys" not in loaded.partitions.to_dict()


def test_a_sweep_of_keys_is_refused_when_names_give_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    loaded = sc.loads(scenario(f"names = {ROOMS}\n"))
    assert ignored.ignored(loaded)["partitions.keys"] == "partitions.names gives the keys"
    assert "partitions.keys" not in ignored.ignored(sc.loads(scenario("keys = 4\n")))
    unrouted = sc.loads(scenario(f"names = {ROOMS}\n", routing="round-robin"))
    assert {"partitions.names", "partitions.file"} <= set(ignored.ignored(unrouted))
    monkeypatch.setattr(sweep, "_execute", lambda *args: pytest.fail("a point ran"))
    with pytest.raises(ScenarioError) as caught:
        run_sweep(loaded, [Axis("partitions.keys", (4, 64))])
    assert (caught.value.field, caught.value.source) == ("partitions.keys", "--sweep")
    assert caught.value.problem.endswith("partitions.names gives the keys")
    assert_one_line_error(
        invoke(
            "simulate",
            "-s",
            str(write(tmp_path, loaded.to_toml())),
            "--sweep",
            "partitions.keys=4,64",
        ),
        2,
        "--sweep: field 'partitions.keys' changes nothing in this sweep's runs",
    )


@pytest.mark.parametrize("source", [f"names = {ROOMS}", 'file = "rooms.txt"'])
def test_the_new_fields_round_trip_as_toml(tmp_path: Path, source: str) -> None:
    (tmp_path / "rooms.txt").write_text("\n".join(ROOMS), encoding="utf-8")
    loaded = sc.load_file(write(tmp_path, scenario(source + "\nzipf = 1.1\n")))
    printed = invoke("simulate", "-s", str(tmp_path / "s.toml"), "--print-scenario")
    assert printed.exit_code == 0, printed.output
    assert "\nkeys = " not in printed.output
    assert sc.loads(printed.output) == loaded == sc.loads(loaded.to_toml())
    assert loaded.partitions.drawn() == tuple(ROOMS)


def test_a_pools_names_round_trip_and_its_file_is_relative_to_the_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rooms.txt").write_text("\n".join(ROOMS), encoding="utf-8")
    pools = textwrap.dedent(
        f"""
        [[pools]]
        name = "a"

        [pools.partitions]
        names = {ROOMS[:2]}

        [[pools]]
        name = "b"

        [pools.partitions]
        file = "rooms.txt"
        """
    )
    path = write(tmp_path, scenario("zipf = 1.0\n") + pools)
    monkeypatch.chdir(tmp_path.parent)
    loaded = sc.load_file(path)
    assert [pool.partitions.drawn() for pool in loaded.resolved_pools] == [
        tuple(ROOMS[:2]),
        tuple(ROOMS),
    ]
    assert sc.loads(loaded.to_toml()) == loaded
