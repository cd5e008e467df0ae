"""``--executor ray`` (:mod:`dopool._sim.executors`): a sweep's runs and the chaos harness's
seeds as Ray tasks, with the local executor's output byte for byte.

One local Ray serves the module (started once, two CPUs, no dashboard); the tests that
need it are marked ``ray`` and skip where Ray cannot be imported, and ``slow`` as the
other Ray tests are: CI runs them on its first Python only. Without Ray,
``--executor ray`` is one line naming the extra: that is tested everywhere.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from cli_support import assert_one_line_error, invoke
from dopool._chaos import harness
from dopool._chaos.result import Result as ChaosResult
from dopool._chaos.runner import run_seed_quietly
from dopool._errors import ConfigurationError, ScenarioError
from dopool._sim import loading
from dopool._sim.executors import CANCEL_GRACE, CONNECT_TIMEOUT, Executor, ray_map
from dopool._sim.interrupt import interruptible, worker_task
from dopool._sim.sweep import parse_axis, run_sweep

# The acceptance check, scaled down: 4 runs of 300 events.
SWEEP = ("simulate", "-q", "--events", "300", "--sweep", "instances=2..4x2", "--repeat", "2")
CHAOS = ("chaos", "--seeds", "4", "--start", "40", "--jobs", "2")
PLANTED = 41  # the seed planted_seeds breaks


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """A local Ray for the module; ``ray_map`` joins it (and leaves it running)."""
    ray = pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("RAY_ADDRESS", raising=False)  # a local Ray, whatever the shell says
        # "local": a Ray of the module's own, even beside one `ray start` left running;
        # an object store of 100 MiB (its floor is 75), not a share of the machine's memory
        ray.init(
            "local",
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=100 * 2**20,
            logging_level="WARNING",
        )
        try:
            yield ray
        finally:
            ray.shutdown()


def run(*args: str) -> Result:
    done = invoke(*args)
    assert done.exit_code in (0, 1), done.output
    return done


def without_times(text: str) -> str:
    """Chaos output with its wall times (``1.7s``, ``0.31 wall s``) blanked."""
    return re.sub(r"\d+(\.\d+)?(s| wall s)\b", r"#\2", text)


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweep_on_ray_writes_the_local_sweeps_json_byte_for_byte(
    local_ray: Any, tmp_path: Path
) -> None:
    local, remote = tmp_path / "local.json", tmp_path / "ray.json"
    assert run(*SWEEP, "--json", str(local)).exit_code == 0
    done = run(*SWEEP, "--json", str(remote), "--executor", "ray", "--jobs", "2")
    assert done.exit_code == 0
    assert remote.read_bytes() == local.read_bytes()
    title = "dopool simulate · steady · sweep instances · seeds 1..2, mean ± 95% interval"
    assert done.stdout.splitlines()[0] == title


@pytest.mark.ray
@pytest.mark.slow
def test_progress_counts_every_run_and_outcomes_keep_grid_order(local_ray: Any) -> None:
    scenario = loading.resolve("steady", {"arrivals.total": "100"})
    axes = [parse_axis("instances=1,2,3", scenario)]
    seen: list[tuple[int, int]] = []
    on_ray = run_sweep(
        scenario,
        axes,
        repeat=2,
        executor=Executor("ray"),
        progress=lambda done, total: seen.append((done, total)),
    )
    assert seen == [(done, 6) for done in range(7)]
    here = run_sweep(scenario, axes, repeat=2, jobs=1)
    assert json.dumps(on_ray.to_json_dict()) == json.dumps(here.to_json_dict())


@pytest.mark.ray
@pytest.mark.slow
def test_a_failing_point_is_named_with_its_seed(local_ray: Any, tmp_path: Path) -> None:
    app = tmp_path / "boom.py"
    app.write_text(
        "def build(runtime, bad=0):\n"
        "    if bad:\n"
        "        raise ValueError(f'no pool at {bad}')\n"
        "    runtime.define('p', execute=lambda ctx: None, concurrency=2)\n"
    )
    flags = ("--app", f"{app}:build", "--set", "arrivals.pool=p", "--events", "50")
    done = run(
        "simulate", "-q", *flags, "--sweep", "app.bad=0,1", "--repeat", "2", "--executor", "ray"
    )
    assert_one_line_error(done, 1, "--sweep app.bad=1, seed ", "raised ValueError: no pool at 1")
    assert re.search(r"seed [12]: app '.*boom\.py:build'", done.stderr)


@pytest.mark.ray
@pytest.mark.slow
def test_chaos_seeds_on_ray_print_what_the_local_pool_prints(local_ray: Any) -> None:
    local = run(*CHAOS)
    remote = run(*CHAOS, "--executor", "ray")
    assert (remote.exit_code, local.exit_code) == (0, 0)
    assert without_times(remote.stdout) == without_times(local.stdout)
    assert remote.stdout.startswith("chaos: seeds 40..43 (4 scenarios, 2 job(s))\n")


def planted_seeds(seed: int) -> ChaosResult:
    """:func:`run_seed_quietly`, with a violation planted in seed :data:`PLANTED`."""
    result = run_seed_quietly(seed)
    if seed == PLANTED:
        result.violations.append("planted: an event was lost")
    return result


@pytest.mark.ray
@pytest.mark.slow
def test_a_failing_chaos_seed_on_ray_prints_its_replay_command(
    local_ray: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tasks find the planted function by name: Ray's workers, like the local pool's
    spawned ones, have this process's ``sys.path``."""
    monkeypatch.setattr(harness, "run_seed_quietly", planted_seeds)
    local = run(*CHAOS)
    remote = run(*CHAOS, "--executor", "ray")
    assert (remote.exit_code, local.exit_code) == (1, 1)
    assert without_times(remote.stdout) == without_times(local.stdout)
    lines = remote.stdout.splitlines()
    assert lines[1] == f"FAIL seed {PLANTED}: planted: an event was lost  [dopool chaos --seed 41]"
    assert lines[-2:] == ["replay each failing seed with:", f"  dopool chaos --seed {PLANTED}"]


@pytest.mark.ray
@pytest.mark.slow
def test_results_come_in_call_order_and_a_calls_error_comes_back_whole(local_ray: Any) -> None:
    calls = [(seed,) for seed in range(40, 44)]
    seeds = [
        result.seed
        for result in ray_map(run_seed_quietly, calls, executor=Executor("ray"), describe=str)
    ]
    assert seeds == [40, 41, 42, 43]
    with pytest.raises(ScenarioError) as caught:
        list(
            ray_map(
                loading.resolve, [("steady",), ("nosuch",)], executor=Executor("ray"), describe=str
            )
        )
    assert caught.value.field == ""  # the worker's error, its attributes kept
    assert "nosuch" in str(caught.value)


# -- without Ray, or without a cluster: no Ray is started ---------------------------------
@pytest.mark.ray
@pytest.mark.slow
def test_ctrl_c_stops_the_runs_out_on_ray_and_no_later_task(local_ray: Any) -> None:
    """A KeyboardInterrupt here (raised by the progress callback as the first run ends)
    cancels every task: a running one stops between two steps of its clock at once, not
    after :data:`CANCEL_GRACE`, when it would be killed (each run takes ~15 s whole)."""
    scenario = loading.resolve("steady")
    axes = [parse_axis("arrivals.total=100,200000,200001", scenario)]
    interrupted: list[float] = []

    def progress(done: int, total: int) -> None:
        if done == 1:
            interrupted.append(time.perf_counter())
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(scenario, axes, executor=Executor("ray"), progress=progress)
    assert time.perf_counter() - interrupted[0] < CANCEL_GRACE / 2
    # The workers that were told go on serving: Ctrl-C stopped those runs, not theirs.
    again = run_sweep(
        scenario, [parse_axis("arrivals.total=50,60", scenario)], executor=Executor("ray")
    )
    assert len(again.points) == 2


# Each command through the CLI in a process where ``import ray`` raises ImportError, as
# where Ray is not installed; a process of its own, as this one's Ray (the module's, once
# started) has threads that import from it. Prints each command's exit code and stderr.
WITHOUT_RAY = """
import json, sys
sys.modules["ray"] = None
from click.testing import CliRunner
from dopool._cli import cli
done = [CliRunner().invoke(cli, args) for args in json.loads(sys.argv[1])]
print(json.dumps([(result.exit_code, result.stderr) for result in done]))
"""


def test_without_ray_the_error_names_the_extra() -> None:
    commands = [
        [*SWEEP, "--executor", "ray"],
        ["chaos", "--seeds", "2", "--executor", "ray=head:6379"],
        list(SWEEP),  # the local executor needs no Ray
        ["chaos", "--seed", "3", "--executor", "ray"],  # a replay runs here, as ever
    ]
    script = [sys.executable, "-c", WITHOUT_RAY, json.dumps(commands)]
    done = subprocess.run(script, capture_output=True, text=True, check=True)
    extra = "dopool's 'ray' extra (pip install '.[ray]' in dopool's source tree)"
    error = f"Error: --executor ray needs Ray (ray is missing), {extra}\n"
    assert json.loads(done.stdout) == [[1, error], [1, error], [0, ""], [0, ""]]


def test_an_address_nothing_listens_at_fails_at_once() -> None:
    """Ray itself would retry for minutes. In a process of its own: in this one, Ray may
    be initialized already (the module's), and a caller's Ray is what ``ray_map`` joins."""
    pytest.importorskip("ray")
    command = [sys.executable, "-m", "dopool", *SWEEP, "--executor", "ray=127.0.0.1:1"]
    environment = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    assert time.perf_counter() - started < CONNECT_TIMEOUT
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        "Error: --executor ray: cannot join the Ray cluster at '127.0.0.1:1': Connection refused\n"
    )


@pytest.mark.parametrize(
    ("text", "executor"),
    [
        ("local", Executor()),
        ("ray", Executor("ray")),
        ("ray=head:6379", Executor("ray", "head:6379")),
        (" ray = ray://head:10001 ", Executor("ray", "ray://head:10001")),
    ],
)
def test_an_executor_is_read_from_its_flag(text: str, executor: Executor) -> None:
    assert Executor.parse(text) == executor
    assert Executor.parse(str(executor)) == executor


@pytest.mark.parametrize("text", ["", "dask", "ray=", "local=x", "rays"])
def test_a_bad_executor_is_a_usage_error(text: str) -> None:
    with pytest.raises(ConfigurationError, match="expected local, ray or ray=ADDRESS"):
        Executor.parse(text)
    assert_one_line_error(invoke(*SWEEP, "--executor", text), 2, "Invalid value for '--executor'")
    assert_one_line_error(invoke(*CHAOS, "--executor", text), 2, "Invalid value for '--executor'")


def test_the_flags_that_do_not_go_with_ray_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray")  # refused before Ray is reached, but after it is found
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert_one_line_error(invoke("simulate", "-q", "--executor", "ray"), 2, "--executor needs")
    done = invoke("chaos", "--processes", "--seeds", "2", "--executor", "ray")
    assert_one_line_error(done, 2, "--executor ray runs the in-process mode's seeds")
    store = ("--store", str(tmp_path / "stores"))
    done = invoke(*SWEEP, *store, "--executor", "ray=head:6379")
    assert_one_line_error(done, 1, "--store cannot be used with --executor ray=head:6379")
    replay = tmp_path / "log.csv"
    replay.write_text("time\n0.5\n")
    replaying = ("--set", "arrivals.process=replay", "--set", f"arrivals.file={replay}")
    done = invoke(*SWEEP, *replaying, "--executor", "ray=head:6379")
    assert_one_line_error(done, 2, "field 'arrivals.file' is an absolute path")


def test_a_ray_task_takes_sigint_as_a_sweeps_worker_does_for_that_task_only() -> None:
    """Ray's cancel reaches a running task as SIGINT in its thread: noted, not raised, and
    the run inside (``interruptible``) stops on the task's own note; the next task starts
    clean. Chaos seeds, which have no ``interruptible`` of their own, rely on this."""
    before = signal.getsignal(signal.SIGINT)
    with worker_task() as task:
        with interruptible() as inner:
            assert inner is task
            signal.raise_signal(signal.SIGINT)
            assert inner.asked()
        with pytest.raises(KeyboardInterrupt):
            task.check()
    assert signal.getsignal(signal.SIGINT) is before
    with worker_task() as task, interruptible() as inner:
        assert inner is task
        assert not task.asked()
