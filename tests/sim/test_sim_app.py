"""``dopool simulate --app``: your own handlers on the simulated runtime (docs/simulate.md)."""

from __future__ import annotations

import json
import signal
import tempfile
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli_support import assert_one_line_error, invoke
from dopool._cli import cli
from dopool._errors import ScenarioError
from dopool._ops.app import AppError, load_app
from dopool._sim import loading
from dopool._sim.driver import run

APP = """
import random
import signal

from dopool import EventContext, RetryPolicy, Runtime


def resize(ctx: EventContext) -> None:
    rng = random.Random(f"{ctx.event['image']}/{ctx.attempt}")
    ctx.sleep(0.05 + ctx.event["megapixels"] * 0.02)
    if ctx.event["megapixels"] > 20 and ctx.attempt == 1:
        ctx.enqueue({"image": ctx.event["image"] + "-tile", "megapixels": 1})
    if rng.random() < 0.1:
        raise TimeoutError("storage timed out")


def build(runtime: Runtime) -> None:
    runtime.define(
        "thumbnails", execute=resize, concurrency=3, retry=RetryPolicy(initial_delay=0.5)
    )


async def resize_async(ctx: EventContext) -> None:
    rng = random.Random(f"{ctx.event['image']}/{ctx.attempt}")
    await ctx.sleep_async(0.05 + ctx.event["megapixels"] * 0.02)
    if ctx.event["megapixels"] > 20 and ctx.attempt == 1:
        ctx.enqueue({"image": ctx.event["image"] + "-tile", "megapixels": 1})
    if rng.random() < 0.1:
        raise TimeoutError("storage timed out")


def build_async(runtime: Runtime) -> None:
    runtime.define(
        "thumbnails", execute=resize_async, concurrency=3, retry=RetryPolicy(initial_delay=0.5)
    )


def scheduled(runtime: Runtime) -> None:
    build(runtime)
    runtime.pools["thumbnails"].schedule(
        "cleanup", {"image": "cleanup", "megapixels": 1}, every=60.0
    )


def interrupting(ctx: EventContext) -> None:
    if ctx.event["image"] == "img-5" and ctx.attempt == 1:
        signal.raise_signal(signal.SIGINT)  # Ctrl-C, in the middle of an attempt
    ctx.sleep(0.05)


def build_interrupted(runtime: Runtime) -> None:
    runtime.define("thumbnails", execute=interrupting, concurrency=3)


def with_timers(runtime: Runtime) -> None:
    build(runtime)
    for room in range(5):  # the app's own events, stored before the run
        runtime.pools["thumbnails"].enqueue({"image": f"room-{room}", "megapixels": 1})


def with_delayed_timers(runtime: Runtime) -> None:
    build(runtime)
    for room in range(5):  # the app's own events, due 30 virtual seconds into the run
        runtime.pools["thumbnails"].enqueue({"image": f"timer-{room}", "megapixels": 1}, delay=30.0)


def tick(ctx: EventContext) -> None:
    ctx.sleep(0.002)
    if ctx.event.get("ticks", 0) < 3:  # a timer: the handler enqueues itself again
        ctx.enqueue({**ctx.event, "ticks": ctx.event.get("ticks", 0) + 1}, delay=30.0)


def build_ticking(runtime: Runtime) -> None:
    runtime.define("thumbnails", execute=tick, concurrency=3)


def nothing(runtime: Runtime) -> None:
    pass


def broken(runtime: Runtime) -> None:
    raise RuntimeError("no database")


def upload(number: int, rng: random.Random) -> dict:
    return {"image": f"img-{number}", "megapixels": rng.choice([1, 4, 12, 24])}


def short_upload(number: int, rng: random.Random) -> dict:
    if number >= 150:
        raise ValueError("only 150 images")
    return upload(number, rng)


def bad_upload(number: int, rng: random.Random) -> dict:
    raise ValueError("no image")


def bad_event(number: int, rng: random.Random) -> object:
    return object()
"""


@pytest.fixture
def app(tmp_path: Path) -> str:
    path = tmp_path / "thumbs.py"
    path.write_text(APP, encoding="utf-8")
    return str(path)


def scenario_text(app: str, function: str = "build", payload: str = "upload") -> str:
    return textwrap.dedent(
        f"""
        name = "thumbnails"
        app = "{app}:{function}"
        seed = 2

        [arrivals]
        pool = "thumbnails"
        payload = "{payload}"
        rate = 8.0
        total = 200

        [[kills]]
        at = 3.0
        pool = "thumbnails"
        instance = 2
        """
    )


def test_an_app_runs_its_own_handlers_on_the_simulated_runtime(app: str) -> None:
    result = run(loading.loads(scenario_text(app))).result
    assert result.passed, [check.detail for check in result.invariants]
    (pool,) = result.pools
    assert (pool.name, len(pool.instances)) == ("thumbnails", 3)
    assert result.offered == 200
    assert result.follow_ups > 0  # the tiles its handler enqueued, counted from the store
    assert result.succeeded == 200 + result.follow_ups
    assert result.retries > 0
    assert result.restarts == 1
    assert result.requests is None  # an app's events carry no request lineage


def test_what_an_app_stores_as_it_builds_is_counted_apart_and_every_event_run_is_counted(
    app: str,
) -> None:
    """An app's own events stored before the run (its timers, say) are neither arrivals
    nor follow-ups, and events per wall second counts every event run to an outcome."""
    finished = run(loading.loads(scenario_text(app, "with_timers")))
    result = finished.result
    assert result.passed, [check.detail for check in result.invariants]
    assert (result.offered, result.seeded) == (200, 5)
    assert result.succeeded + result.dead_lettered == 200 + result.follow_ups + 5
    assert result.to_json_dict()["events"]["seeded"] == 5
    (no_loss,) = [check for check in result.invariants if check.name == "no loss"]
    assert "+ 5 stored by the app before the run" in no_loss.detail
    done = result.succeeded + result.dead_lettered
    assert finished.events_per_wall_second == done / finished.wall_seconds


@pytest.mark.parametrize("function", ["with_delayed_timers", "build_ticking"])
def test_delayed_events_an_app_stores_start_by_due_time_and_wait_from_it(
    app: str, function: str
) -> None:
    """Delayed events the app stores as it builds, or its handlers enqueue (a timer),
    pass the order check, which knows their due times from their ``enqueued`` events,
    and their latency runs from their due time, not from their being stored."""
    result = run(loading.loads(scenario_text(app, function))).result
    assert result.passed, [check.detail for check in result.invariants if not check.passed]
    assert result.succeeded == result.offered + result.follow_ups + result.seeded
    assert result.latency.max < 30.0  # none counts the 30 s it was not due for
    if function == "build_ticking":
        assert result.follow_ups == 3 * 200


def test_an_app_run_is_byte_identical_for_the_same_seed(app: str) -> None:
    scenario = loading.loads(scenario_text(app))
    first = json.dumps(run(scenario).result.to_json_dict())
    assert json.dumps(run(scenario).result.to_json_dict()) == first


def test_an_apps_async_handler_runs_in_virtual_time_as_its_plain_twin(app: str) -> None:
    """``--app`` takes an ``async def`` handler: the run repeats to the byte, and matches
    the run of the same handler written with ``def`` and ``ctx.sleep``."""
    scenario = loading.loads(scenario_text(app, "build_async"))
    first = json.dumps(run(scenario).result.to_json_dict())
    assert json.dumps(run(scenario).result.to_json_dict()) == first
    plain = run(loading.loads(scenario_text(app))).result.to_json_dict()
    awaited = json.loads(first)
    assert awaited["scenario"].pop("app").endswith(":build_async")
    assert plain["scenario"].pop("app").endswith(":build")
    assert awaited == plain  # every figure, every latency, to the last bit


def test_an_app_with_a_recurring_schedule_ends_with_its_arrivals(app: str) -> None:
    # A schedule fires for ever: the run ends when only its fires are left, as
    # run_until_idle does, whether the driver steps the clock (a progress callback,
    # a trace: the command line) or drives it in one call.
    scenario = loading.loads(scenario_text(app, function="scheduled"))
    stepped = run(scenario, progress=lambda *_: None).result
    assert stepped.offered == 200
    assert stepped.virtual_time < 60.0
    assert json.dumps(stepped.to_json_dict()) == json.dumps(run(scenario).result.to_json_dict())


def test_ctrl_c_stops_a_run_and_removes_its_temporary_store(
    app: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SIGINT lands in a handler (as it mostly does): the engine would take the
    # KeyboardInterrupt for a failed attempt and go on; the driver stops instead.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        run(loading.loads(scenario_text(app, function="build_interrupted")))
    assert list(tmp_path.iterdir()) == [tmp_path / "thumbs.py"]  # no dopool-sim-* left
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("sweep", [(), ("--repeat", "2", "--jobs", "2")])
def test_ctrl_c_is_one_line_and_exit_130(app: str, tmp_path: Path, sweep: tuple[str, ...]) -> None:
    # A sweep's run is interrupted in a worker process, which tells its own.
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(app, function="build_interrupted"), "utf-8")
    what = "sweep" if sweep else "run"
    result = invoke("simulate", "-q", "--scenario", str(scenario), *sweep)
    assert_one_line_error(result, 130, f"interrupted: the {what} stopped before its end")


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_sweep_run_that_fails_is_one_line_naming_its_point(
    app: str, tmp_path: Path, jobs: str
) -> None:
    # In a worker process too: its error comes back whole (AppError did not unpickle,
    # and the sweep died of BrokenProcessPool's traceback).
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(app, payload="short_upload"), "utf-8")
    sweep = ("--sweep", "arrivals.total=100,200", "--jobs", jobs)
    assert_one_line_error(
        invoke("simulate", "-q", "--scenario", str(scenario), *sweep),
        1,
        "--sweep arrivals.total=200, seed 2: app ",
        "payload 'short_upload' raised ValueError: only 150 images",
    )
    scenario.write_text(scenario_text(app, payload="nothing_here"), "utf-8")
    assert_one_line_error(
        invoke("simulate", "-q", "--scenario", str(scenario), *sweep),
        2,
        "--sweep arrivals.total=",  # either point: both fail, and either may come back first
        ", seed 2: field 'payload' names no function",
    )


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("nocolon", "must be 'module:function'"),
        ("no_such_module_here:build", "names no importable module"),
        ("missing/file.py:build", "names no file"),
        ("json:no_such_function", "has no function"),
    ],
)
def test_a_bad_app_is_a_usage_error_naming_it(spec: str, words: str) -> None:
    with pytest.raises(ScenarioError, match=words) as caught:
        load_app(spec)
    assert caught.value.field == "app"


def test_an_app_that_fails_is_named_with_what_it_raised(app: str, tmp_path: Path) -> None:
    with pytest.raises(AppError, match="raised RuntimeError: no database"):
        run(loading.loads(scenario_text(app, function="broken")))
    with pytest.raises(AppError, match="defined no pool"):
        run(loading.loads(scenario_text(app, function="nothing")))
    with pytest.raises(AppError, match="payload 'bad_upload' raised ValueError: no image"):
        run(loading.loads(scenario_text(app, payload="bad_upload")))
    with pytest.raises(ScenarioError, match="names no function of the app's module"):
        run(loading.loads(scenario_text(app, payload="nope")))
    crashing = tmp_path / "crashing.py"
    crashing.write_text("raise ImportError('half installed')\n", encoding="utf-8")
    with pytest.raises(AppError, match="importing it raised ImportError"):
        load_app(f"{crashing}:build")


def test_arrivals_and_kills_must_name_the_apps_pools(app: str) -> None:
    text = scenario_text(app).replace('pool = "thumbnails"\npayload', 'pool = "thumbs"\npayload')
    with pytest.raises(ScenarioError, match="did you mean 'thumbnails'") as caught:
        run(loading.loads(text))
    assert caught.value.field == "arrivals.pool"
    text = scenario_text(app).replace("instance = 2", "instance = 3")
    with pytest.raises(ScenarioError, match="must be < instances") as caught:
        run(loading.loads(text))
    assert caught.value.field == "kills[0].instance"


def test_an_app_defines_the_pools_so_pool_tables_are_refused(app: str) -> None:
    with pytest.raises(ScenarioError, match="it defines the pools"):
        loading.loads(scenario_text(app) + '\n[[pools]]\nname = "x"\n')


def test_the_app_flag_and_its_errors(app: str, tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(app).replace(f'app = "{app}:build"\n', ""), "utf-8")
    runner = CliRunner()
    done = runner.invoke(cli, ["simulate", "--scenario", str(scenario), "--app", f"{app}:build"])
    assert done.exit_code == 0, done.output
    assert "(3 instances)" in done.output
    bad = runner.invoke(cli, ["simulate", "--scenario", str(scenario), "--app", "nope:build"])
    assert bad.exit_code == 2
    assert bad.output.strip().splitlines()[-1].startswith("Error: ")
    assert "names no importable module" in bad.output


def test_an_app_that_exits_or_makes_bad_events_is_an_error_naming_it(
    app: str, tmp_path: Path
) -> None:
    exiting = tmp_path / "exiting.py"
    exiting.write_text(
        "import sys\n\ndef build(runtime):\n    sys.exit(3)\n\n"
        "def bad(number, rng):\n    return object()\n",
        encoding="utf-8",
    )
    with pytest.raises(AppError, match="raised SystemExit: 3"):
        run(loading.loads(scenario_text(str(exiting)).replace('payload = "upload"\n', "")))
    with pytest.raises(AppError, match="pool 'thumbnails' refused an arriving event"):
        run(loading.loads(scenario_text(app, payload="bad_event")))


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (
            "class Stop(BaseException):\n    pass\n\nraise Stop('halt')\n",
            "importing it raised Stop: halt",
        ),
        ("raise KeyboardInterrupt\n", "importing it raised KeyboardInterrupt"),
        ("def build(runtime):\n    raise KeyboardInterrupt\n", "raised KeyboardInterrupt"),
        (
            "class Odd(Exception):\n    def __str__(self):\n        raise TypeError\n\n"
            "def build(runtime):\n    raise Odd()\n",
            "raised Odd: (its message could not be made)",
        ),
    ],
)
def test_whatever_an_apps_code_raises_is_one_line_naming_it(
    tmp_path: Path, code: str, words: str
) -> None:
    # A BaseException of its own, or an exception whose message raises, was a traceback.
    path = tmp_path / "odd.py"
    path.write_text(code, encoding="utf-8")
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(str(path)).replace('payload = "upload"\n', ""), "utf-8")
    result = invoke("simulate", "-q", "--scenario", str(scenario))
    assert_one_line_error(result, 1, f"app '{path}:build': {words}")


def test_an_apps_schema_checks_the_arriving_events(tmp_path: Path) -> None:
    path = tmp_path / "strict.py"
    path.write_text(
        "def check(event):\n"
        "    if 'image' not in event:\n"
        "        raise ValueError('no image')\n"
        "    return {**event, 'checked': True}\n\n"
        "def handle(ctx):\n"
        "    assert ctx.event['checked']\n\n"
        "def build(runtime):\n"
        "    runtime.define('thumbnails', execute=handle, schema=check, concurrency=3)\n\n"
        "def upload(number, rng):\n"
        "    return {'image': number}\n",
        encoding="utf-8",
    )
    result = run(loading.loads(scenario_text(str(path)))).result
    assert (result.succeeded, result.dead_lettered) == (200, 0)  # every event checked
    text = scenario_text(str(path)).replace('payload = "upload"\n', "")
    with pytest.raises(AppError, match=r"refused an arriving event.*no image"):
        run(loading.loads(text))
