"""An app's parameters (``[app] params``, ``app.NAME``), what an app's sweep refuses, and
the app's path relative to its scenario (docs/simulate.md, "Your own code: --app")."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cli_support import assert_one_line_error, invoke
from dopool._errors import ScenarioError
from dopool._sim import ignored, sweep
from dopool._sim import loading as sc
from dopool._sim.driver import run
from dopool._sim.sweep import Axis, SweepError, parse_axis, run_sweep

APP = """
from dopool import Runtime


def build(runtime: Runtime, *, work: float = 0.01, workers: int = 2, tags=()) -> None:
    def handle(ctx):
        ctx.sleep(work)

    runtime.define("rooms", execute=handle, concurrency=workers)


def needs(runtime: Runtime, rooms: int) -> None:
    build(runtime, workers=rooms)


def anything(runtime: Runtime, **options) -> None:
    build(runtime, workers=len(options))


def message(number, rng):
    return {"text": f"hello {number}"}
"""


@pytest.fixture
def design(tmp_path: Path) -> Path:
    """A folder holding the app, ``rooms.py``: its scenarios are written beside it."""
    folder = tmp_path / "design"
    folder.mkdir()
    (folder / "rooms.py").write_text(APP, encoding="utf-8")
    return folder


def scenario(app: str, params: str = "", payload: str = "") -> str:
    """A scenario naming ``app``; with ``params``, as an ``[app]`` table."""
    head = f'app = "{app}"\n' if not params else f'[app]\nfunction = "{app}"\nparams = {params}\n'
    arrivals = f'pool = "rooms"\nprocess = "steady"\nrate = 10.0\ntotal = 60\n{payload}'
    return f'name = "rooms"\nseed = 3\n{head}\n[arrivals]\n{arrivals}'


def write(folder: Path, text: str, name: str = "s.toml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


# -- parameters -----------------------------------------------------------------------------
def test_params_are_the_functions_keyword_arguments(design: Path) -> None:
    path = write(design, scenario(f"{design}/rooms.py:build", "{ work = 0.25, workers = 3 }"))
    loaded = sc.load_file(path)
    assert loaded.app_params == {"work": 0.25, "workers": 3}
    result = run(loaded).result
    (pool,) = result.pools
    assert len(pool.instances) == 3
    assert result.latency.max == pytest.approx(0.25)  # each event sleeps the work given
    plain = run(sc.load_file(write(design, scenario(f"{design}/rooms.py:build")))).result
    assert len(plain.pools[0].instances) == 2  # the defaults
    assert plain.latency.max == pytest.approx(0.01)


def test_an_app_without_params_is_written_as_before(design: Path) -> None:
    spec = f"{design}/rooms.py:build"
    plain, table = sc.loads(scenario(spec)), sc.loads(f'[app]\nfunction = "{spec}"\n')
    assert plain.to_dict()["app"] == table.to_dict()["app"] == spec
    assert f'\napp = "{spec}"\n' in plain.to_toml()


def test_params_round_trip_as_toml_and_json(design: Path) -> None:
    params = '{ work = 0.5, workers = 1, tags = ["a", "b c"], "x" = { "on it" = true } }'
    loaded = sc.loads(scenario(f"{design}/rooms.py:anything", params))
    app = {
        "function": f"{design}/rooms.py:anything",
        "params": {"work": 0.5, "workers": 1, "tags": ["a", "b c"], "x": {"on it": True}},
    }
    assert loaded.to_dict()["app"] == app
    assert sc.loads(loaded.to_toml()) == loaded
    assert run(loaded).result.to_json_dict()["scenario"]["app"] == app


def test_flags_set_params_and_the_report_lists_them(design: Path, tmp_path: Path) -> None:
    path = write(design, scenario(f"{design}/rooms.py:build", "{ work = 0.5 }"))
    out = tmp_path / "run.json"
    done = invoke("simulate", "-s", str(path), "-q", "--set", "app.workers=4", "--json", str(out))
    assert done.exit_code == 0, done.output
    assert "changed by flags: app.workers none → 4" in done.output
    document = json.loads(out.read_text(encoding="utf-8"))
    assert document["scenario"]["app"]["params"] == {"work": 0.5, "workers": 4}
    assert len(document["instances"]) == 4
    # `none` removes a parameter, so the app's default applies.
    moved = sc.resolve(str(path), {"app.work": "none", "app.tags": "[1, 2]", "app.workers": "3"})
    assert moved.app_params == {"tags": [1, 2], "workers": 3}
    assert [str(change) for change in sc.changes(sc.load_file(path), moved)] == [
        "app.tags none → [1, 2]",
        "app.workers none → 3",
        "app.work 0.5 → none",
    ]
    printed = invoke("simulate", "-s", str(path), "--set", "app.workers=4", "--print-scenario")
    assert "{ work = 0.5, workers = 4 } }" in printed.output


def test_a_flags_text_is_read_as_a_toml_value() -> None:
    read = {text: sc.parse_value("app.x", text) for text in ("30", "0.5", "1e3", "true")}
    assert read == {"30": 30, "0.5": 0.5, "1e3": 1000.0, "true": True}
    assert sc.parse_value("app.x", '"30"') == "30"
    assert sc.parse_value("app.x", "fast") == "fast"  # not TOML: the text itself
    assert sc.parse_value("app.x", "2024-01-01") == "2024-01-01"  # a date is no parameter
    assert sc.parse_value("app.x", "none") is None


def test_params_are_swept_and_reach_the_app(design: Path, tmp_path: Path) -> None:
    path = write(design, scenario(f"{design}/rooms.py:build", "{ work = 0.5 }"))
    out = tmp_path / "sweep.json"
    sweeping = ("--sweep", "app.workers=1..3", "--sweep", "app.work=0.05,0.15", "-j", "1")
    done = invoke("simulate", "-s", str(path), "-q", *sweeping, "--json", str(out))
    assert done.exit_code == 0, done.output
    points = json.loads(out.read_text(encoding="utf-8"))["points"]
    assert [point["values"] for point in points][:2] == [
        {"app.workers": 1, "app.work": 0.05},
        {"app.workers": 1, "app.work": 0.15},
    ]
    peaks = [point["figures"]["active.peak"]["mean"] for point in points]
    assert peaks == [1, 1, 2, 2, 3, 3]  # the instances each point's app defined
    slowest = [point["figures"]["max"]["mean"] for point in points]
    assert slowest[0] == pytest.approx(0.05)  # each event as long as its work ...
    assert slowest[1] > 1.0  # ... but one instance falls behind at 0.15 s an event
    assert slowest[2:] == pytest.approx([0.05, 0.15, 0.05, 0.15])


def test_a_swept_params_values() -> None:
    axis = parse_axis("app.mode=10,0.5,fast,true,none")
    assert axis.values == (10, 0.5, "fast", True, None)
    assert parse_axis("app.work=0.1..0.3+0.1").values == (0.1, 0.2, 0.3)
    assert parse_axis("app.workers=1..9x3").values == (1, 3, 9)
    for spec in ("app.mode=a..b", "app.work=0.1..0.3+fast"):
        with pytest.raises(SweepError, match="a number"):
            parse_axis(spec)
    with pytest.raises(ScenarioError, match=r"'app\.NAME'") as caught:
        parse_axis("app.a.b=1")
    assert caught.value.field == "app.a.b"


def test_a_parameter_the_app_does_not_take_is_refused_by_name_before_the_run(
    design: Path, tmp_path: Path
) -> None:
    path = write(design, scenario(f"{design}/rooms.py:build", "{ wrk = 0.5 }"))
    store = tmp_path / "store"
    with pytest.raises(ScenarioError, match="did you mean 'work'") as caught:
        run(sc.load_file(path), store=store)
    assert caught.value.field == "app.wrk"
    assert "(it takes work, workers, tags)" in caught.value.problem
    assert not store.exists()  # refused before a store was made
    assert_one_line_error(
        invoke("simulate", "-s", str(path), "-q"), 2, "field 'app.wrk' is not a parameter of"
    )
    path = write(design, scenario(f"{design}/rooms.py:build"))
    assert_one_line_error(
        invoke("simulate", "-s", str(path), "-q", "--sweep", "app.wrk=1,2", "-j", "2"),
        2,
        "--sweep app.wrk=",  # either point: both fail, and either may come back first
        ", seed 3: field 'app.wrk' is not a parameter of",
    )
    needing = sc.load_file(write(design, scenario(f"{design}/rooms.py:needs")))
    with pytest.raises(ScenarioError, match="is required by") as caught:
        run(needing)
    assert caught.value.field == "app.rooms"
    keywords = sc.with_overrides(needing, {"app": f"{design}/rooms.py:anything", "app.a": 1})
    assert len(run(keywords).result.instances) == 1  # **options takes any parameter


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("[app]\nparams = { x = 1 }\n", "app.x", "the scenario names none"),
        ('[app]\nfunction = "a.py:build"\nparams = { "a-b" = 1 }\n', "app.params", "'a-b'"),
        ('[app]\nfunction = "a.py:build"\nparams = 3\n', "app.params", "must be a table"),
        ('[app]\nfunction = "a.py:build"\nparams = { d = 2024-01-01 }\n', "app.d", "array or"),
        ('[app]\nfuncton = "a.py:build"\n', "app.functon", "did you mean 'function'"),
        ("[app]\n", "app.function", "is required"),
    ],
)
def test_bad_app_tables_are_named(text: str, field: str, words: str) -> None:
    with pytest.raises(ScenarioError, match=words) as caught:
        sc.loads(text)
    assert caught.value.field == field


def test_a_parameter_needs_an_app() -> None:
    assert_one_line_error(
        invoke("simulate", "-q", "--set", "app.x=1"),
        2,
        "--set app.x: field 'app.x' is a parameter of an app, and the scenario names none",
    )
    assert_one_line_error(
        invoke("simulate", "-q", "--sweep", "app.x=1,2"),
        2,
        "--sweep: field 'app.x' is a parameter of an app",
    )


# -- what an app's sweep refuses ----------------------------------------------------------
#: Every numeric field an app's run ignores, with values a sweep might give it.
IGNORED_BY_AN_APP: dict[str, tuple[Any, ...]] = {
    "instances": (1, 2),
    "max_queue_depth": (5, 10),
    "failure_probability": (0.0, 0.1),
    "alarm_retries": (1, 2),
    "dedup_window": (1.0, 2.0),
    "idle_timeout": (1.0, 2.0),
    "rate_limit": (5.0, 10.0),
    "service.mean": (0.1, 0.2),
    "service.sigma": (0.1, 0.2),
    "retry.max_attempts": (1, 2),
    "retry.initial_delay": (1.0, 2.0),
    "retry.multiplier": (1.0, 2.0),
    "retry.max_delay": (60.0, 70.0),
    "retry.jitter": (0.0, 0.1),
}


def test_every_numeric_field_an_app_defines_is_listed_here() -> None:
    numeric = set(sc.numeric_fields())
    assert {path for path in ignored.APP_DEFINES if path in numeric} == set(IGNORED_BY_AN_APP)


@pytest.mark.parametrize(("field", "values"), IGNORED_BY_AN_APP.items())
def test_a_field_an_app_ignores_is_refused_by_name_with_nothing_run(
    design: Path, field: str, values: tuple[Any, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep, "_execute", lambda *args: pytest.fail("a point ran"))
    loaded = sc.loads(scenario(f"{design}/rooms.py:build"))
    with pytest.raises(ScenarioError) as caught:
        run_sweep(loaded, [Axis(field, values)])
    assert (caught.value.field, caught.value.source) == (field, "--sweep")
    assert caught.value.problem.startswith(
        "changes nothing in this sweep's runs: the app's function defines the pools"
    )


def test_the_events_padding_and_poison_are_refused_only_when_the_app_makes_every_event(
    design: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = sc.loads(scenario(f"{design}/rooms.py:build", payload='payload = "message"\n'))
    plain = sc.loads(scenario(f"{design}/rooms.py:build"))  # {"id": n}, padded, poisoned
    why = "the app's payload functions make every arriving event"
    for field in ("payload_bytes", "poison_share"):
        assert field not in ignored.ignored(plain)
        assert ignored.ignored(made)[field] == why
    monkeypatch.setattr(sweep, "_execute", lambda *args: pytest.fail("a point ran"))
    assert_one_line_error(
        invoke("simulate", "-s", str(write(design, made.to_toml())), "--sweep", "poison_share=0,1"),
        2,
        "--sweep: field 'poison_share' changes nothing in this sweep's runs: the app's payload",
    )


def test_what_an_app_run_reads_may_be_swept(design: Path) -> None:
    loaded = sc.loads(scenario(f"{design}/rooms.py:build"))
    unread = ignored.ignored(loaded)
    read = ["seed", "duration", "arrivals.rate", "arrivals.total", "faults.crash_before_execute"]
    read += ["payload_bytes", "poison_share", "duplicate_share", "delayed_share", "routing"]
    assert [field for field in read if field in unread] == []
    keyed = sc.with_overrides(loaded, {"routing": "partition"})
    assert "partitions.keys" in unread
    assert "partitions.keys" not in ignored.ignored(keyed)  # the arrivals' keys


# -- the app's path -----------------------------------------------------------------------------
@pytest.mark.parametrize("params", ["", "{ workers = 1 }"])
def test_the_apps_file_is_relative_to_the_scenario(
    design: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, params: str
) -> None:
    path = write(design, scenario("rooms.py:build", params))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = sc.resolve(str(path))
    assert loaded.app == f"{design}/rooms.py:build"
    assert run(loaded).result.offered == 60
    monkeypatch.chdir(tmp_path)
    assert sc.resolve("design/s.toml").app == "design/rooms.py:build"  # as printed and in JSON
    done = invoke("simulate", "-s", "design/s.toml", "-q")
    assert done.exit_code == 0, done.output
    write(design, scenario("./lib/../rooms.py:build", params))
    assert sc.resolve("design/s.toml").app == "design/rooms.py:build"


def test_an_absolute_app_path_and_a_module_are_kept(design: Path) -> None:
    absolute = f"{design}/../design/rooms.py:build"
    assert sc.load_file(write(design, scenario(absolute))).app == absolute
    assert sc.load_file(write(design, scenario("shop.rooms:build"))).app == "shop.rooms:build"


def test_a_path_a_flag_gives_is_relative_to_the_working_directory(
    design: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write(design, scenario("rooms.py:build").replace('app = "rooms.py:build"\n', ""))
    assert_one_line_error(
        invoke("simulate", "-s", str(path), "-q", "--app", "rooms.py:build"),
        2,
        "field 'app' names no file: 'rooms.py'",
    )
    done = invoke("simulate", "-s", str(path), "-q", "--app", "design/rooms.py:build")
    assert done.exit_code == 0, done.output
    # A replay file too: the file's own is joined to its folder, a flag's is not.
    (design / "log.jsonl").write_text('{"time": 0.5}\n', encoding="utf-8")
    (tmp_path / "other.jsonl").write_text('{"time": 0.5}\n{"time": 1.0}\n', encoding="utf-8")
    replayed = textwrap.dedent(
        """
        [arrivals]
        process = "replay"
        file = "log.jsonl"
        """
    )
    write(design, replayed)
    assert sc.resolve("design/s.toml").arrivals[0].file == "design/log.jsonl"
    moved = sc.resolve("design/s.toml", {"arrivals.file": "other.jsonl"})
    assert moved.arrivals[0].file == "other.jsonl"
    assert run(moved).result.offered == 2
