"""``dopool chaos``: the long mode of the chaos harness, and the replay of one seed.

    dopool chaos --seeds 5000 [--start N] [--jobs J]   # run seeds N .. N+4999
    dopool chaos --seeds 5000 --executor ray[=ADDRESS] # the same, as Ray tasks
    dopool chaos --seed S [--trace FILE] [--verbose]  # replay one seed exactly
    dopool chaos --processes --seeds 40 [--start N] [--jobs J]  # real processes
    dopool chaos --processes --seed S [--keep]        # one seed's plan again

The command, :func:`chaos`, is a click command like every ``dopool`` command; ``dopool
chaos`` registers it, and ``python -m chaos`` in the repository runs it through
:func:`main`. ``--processes`` runs the multi-process mode (:mod:`dopool._chaos.procs`):
producer processes, ``dopool worker`` processes SIGKILLed and restarted, writers frozen
holding the store's writer lock; a replay runs the same plan, not the same interleavings.

Prints a progress line now and then and a summary of scenarios, events,
executions, crashes, restarts and violations (with ``--processes``, also the big
family's seeds and the frozen-writer faults that landed). Exits 1 if any scenario
broke an invariant, after printing, for each such seed, the command that replays it.
With ``--executor ray`` the long mode's seeds are Ray tasks
(:func:`dopool._sim.executors.ray_map`), their results taken in seed order as from the
local pool, so it prints the same lines.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import NoReturn

import click

from dopool._chaos.procs import seed as procs
from dopool._chaos.procs.plan import draw as draw_plan
from dopool._chaos.result import Result, replay_command
from dopool._chaos.runner import run_seed, run_seed_quietly
from dopool._chaos.scenario import generate
from dopool._errors import ConfigurationError
from dopool._sim.executors import (
    LOCAL,
    Executor,
    RayConnectError,
    RayRunError,
    RayUnavailableError,
    check_available,
    ray_map,
)
from dopool._sim.interrupt import interruptible

PROGRESS_EVERY = 5.0  # wall seconds between progress lines
USAGE_EXIT = 2  # a bad flag, as every dopool command exits
INTERRUPTED_EXIT = 128 + 2  # as a shell reports a process that SIGINT ended


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--seeds",
    type=int,
    default=200,
    show_default=True,
    metavar="N",
    help="how many scenarios to run",
)
@click.option("--start", type=int, default=0, show_default=True, metavar="S", help="the first seed")
@click.option("--seed", type=int, default=None, metavar="S", help="run only this seed (a replay)")
@click.option(
    "--trace",
    type=click.Path(path_type=Path),
    default=None,
    metavar="FILE",
    help="with --seed: write the runtime trace here",
)
@click.option(
    "--jobs",
    type=int,
    default=None,
    metavar="J",
    help="worker processes (long mode) [default: 1]; with --executor ray, seeds out at once "
    "[default: all]",
)
@click.option(
    "--executor",
    default="local",
    show_default=True,
    metavar="local|ray[=ADDRESS]",
    help="where the long mode's seeds run: local processes, or Ray tasks on a local Ray "
    "or the cluster at ADDRESS (the ray extra)",
)
@click.option("--verbose", is_flag=True, help="with --seed: print the scenario and its history")
@click.option(
    "--processes",
    is_flag=True,
    help="the multi-process mode: producer processes and dopool workers, SIGKILLed",
)
@click.option("--keep", is_flag=True, help="with --processes --seed: keep the run's directory")
@click.pass_context
def chaos(
    ctx: click.Context,
    seeds: int,
    start: int,
    seed: int | None,
    trace: Path | None,
    jobs: int | None,
    executor: str,
    verbose: bool,
    processes: bool,
    keep: bool,
) -> None:
    """Run the chaos harness: seeded scenarios under fault plans, invariants checked.

    \b
    dopool chaos --seeds N [--start S] [--jobs J]     runs seeds S .. S+N-1
    dopool chaos --seeds N --executor ray[=ADDRESS]   the same as Ray tasks
    dopool chaos --seed S [--trace FILE] [--verbose]  replays one seed exactly
    dopool chaos --processes --seeds N [--start S] [--jobs J]
                                     the same with producer and worker processes
    dopool chaos --processes --seed S [--keep]        one seed's plan again

    Prints progress, then a summary of scenarios, events, executions, crashes,
    restarts and violations. Exits 1 if a scenario broke an invariant, after the
    command that replays each such seed.
    """

    def refuse(message: str) -> NoReturn:
        raise click.UsageError(message, ctx)

    if processes and trace is not None:
        refuse("--trace is for the in-process mode (--processes keeps records instead)")
    if keep and not (processes and seed is not None):
        refuse("--keep needs --processes --seed")
    if trace is not None and (trace.is_dir() or not trace.resolve().parent.is_dir()):
        refuse(f"--trace {str(trace)!r}: not a file in a directory that exists")
    if seed is None and trace is not None:
        refuse("--trace needs --seed")
    if seed is None and (seeds < 1 or (jobs is not None and jobs < 1)):
        refuse("--seeds and --jobs must be at least 1")
    try:
        where = Executor.parse(executor)
    except ConfigurationError as exc:
        refuse(f"Invalid value for '--executor': {exc}")
    if processes and where.ray:
        refuse("--executor ray runs the in-process mode's seeds (--processes runs its own here)")
    ctx.exit(_run(range(start, start + seeds), seed, trace, jobs, verbose, processes, keep, where))


def main(argv: list[str] | None = None) -> int:
    """``python -m chaos``: :func:`chaos` on ``argv`` (the process's arguments if None);
    its exit status. A bad flag is one ``Error: ...`` line on stderr and ``SystemExit(2)``,
    as ``dopool chaos`` has it."""
    try:
        code = chaos.main(argv, prog_name="dopool chaos", standalone_mode=False)
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        print(f"Error: {exc.format_message()}{hint}", file=sys.stderr)
        raise SystemExit(USAGE_EXIT) from None
    return int(code or 0)


def _run(
    seeds: range,
    seed: int | None,
    trace: Path | None,
    jobs: int | None,
    verbose: bool,
    processes: bool,
    keep: bool,
    executor: Executor = LOCAL,
) -> int:
    """The run the flags ask for, its exit status: 0 passed, 1 an invariant broke (or
    Ray failed, after one line on stderr), 130 stopped by Ctrl-C (after one line)."""
    try:
        if seed is not None:
            if processes:
                return _replay_processes(seed, keep=keep, verbose=verbose)
            with interruptible() as interrupt:
                code = _replay(seed, trace, verbose=verbose)
            interrupt.check()
            return code
        check_available(executor)
        # A process (or a Ray task out) per seed at most, not --jobs of them; on Ray, as
        # many as there are seeds unless --jobs says fewer.
        jobs = min(jobs or (len(seeds) if executor.ray else 1), len(seeds))
        return _long(seeds, jobs, processes=processes, executor=executor)
    except KeyboardInterrupt:
        print("Error: interrupted: the chaos run stopped before its end", file=sys.stderr)
        return INTERRUPTED_EXIT
    except (RayUnavailableError, RayConnectError, RayRunError) as exc:
        print(f"Error: {exc}", file=sys.stderr)  # Ray missing, unreachable, a task lost
        return 1


def _replay_processes(seed: int, *, keep: bool, verbose: bool) -> int:
    if verbose:
        print(draw_plan(seed).describe())
    result = procs.run_seed(seed, keep=keep)
    if verbose:
        print("the runner did: " + " ".join(result.log))
    print(_one_line(result))
    if result.kept:
        print(f"kept: {result.kept}")
    if not result.ok:
        print(result.report())
        return 1
    return 0


def _replay(seed: int, trace: Path | None, *, verbose: bool) -> int:
    result = run_seed(seed, keep_log=verbose)
    if verbose:
        print(generate(seed).describe())
        print("history:")
        for line in result.log:
            print(f"  {line}")
    if trace is not None:
        try:
            trace.write_bytes(result.trace)
        except OSError as exc:
            print(f"Error: cannot write --trace {str(trace)!r}: {exc.strerror}", file=sys.stderr)
            return 1
        print(f"trace: {trace} ({len(result.trace)} bytes)")
    print(_one_line(result))
    if not result.ok:
        print(result.report())
        return 1
    return 0


def _one_line(result: Result) -> str:
    if result.processes:
        big = " (big family)" if result.big else ""
        return (
            f"seed {result.seed}{big}: {result.acknowledged} events stored, {result.duplicates} "
            f"duplicates answered, {result.executions} executions, {result.crashes} SIGKILLs, "
            f"{result.restarts} restarts, {_freezes(result)}, "
            f"{result.wall_time:.2f} wall s: "
            + ("ok" if result.ok else f"{len(result.violations)} violation(s)")
        )
    return (
        f"seed {result.seed}: {result.steps} steps, {result.enqueued} events, "
        f"{result.executions} executions, {result.crashes} crashes, {result.restarts} restarts, "
        f"{result.reopens} reopens, {result.virtual_time:.1f} virtual s, "
        f"{result.wall_time:.2f} wall s: "
        + ("ok" if result.ok else f"{len(result.violations)} violation(s)")
    )


def _freezes(result: Result) -> str:
    """The frozen-writer faults of a multi-process run (or the sum of several)."""
    refused = f", {result.refused} enqueues refused" if result.refused else ""
    return (
        f"{result.frozen_producers + result.frozen_workers} frozen writers "
        f"({result.frozen_producers} producers, {result.frozen_workers} workers, "
        f"{result.freezes_missed} missed{refused})"
    )


def _results(
    seeds: range, jobs: int, *, processes: bool, executor: Executor = LOCAL
) -> Generator[Result, None, None]:
    if executor.ray:
        calls = [(seed,) for seed in seeds]
        yield from ray_map(
            run_seed_quietly,
            calls,
            executor=executor,
            describe=lambda position: (
                f"seed {seeds[position]} (replay: {replay_command(seeds[position])})"
            ),
            limit=jobs,
        )
        return
    if jobs == 1:
        # Ctrl-C ends the seed in hand (a fraction of a second), then the run: raised in
        # an actor, the KeyboardInterrupt would be taken for a crash, and the seed go on.
        with interruptible() as interrupt:
            for seed in seeds:
                yield procs.run_seed(seed) if processes else run_seed(seed)
                interrupt.check()
        return
    # spawn, not fork: the parent may hold actor threads and LMDB handles.
    context = multiprocessing.get_context("spawn")
    with context.Pool(jobs) as workers:
        if processes:
            yield from workers.imap(procs.run_seed, seeds, chunksize=1)
        else:
            yield from workers.imap(run_seed_quietly, seeds, chunksize=8)


def _long(seeds: range, jobs: int, *, processes: bool = False, executor: Executor = LOCAL) -> int:
    started = last = time.perf_counter()
    totals = dict.fromkeys(
        (
            "events",
            "acknowledged",
            "scheduled",
            "duplicates",
            "executions",
            "crashes",
            "restarts",
            "reopens",
            "violations",
        ),
        0,
    )
    failures: list[Result] = []
    scenarios = 0
    faults = Result(seed=-1, violations=[], processes=True)  # the freezes' totals
    big, bigs = 0, 0.0  # the big family: seeds, and their wall time
    mode = ", processes" if processes else ""
    print(
        f"chaos: seeds {seeds.start}..{seeds.stop - 1} ({len(seeds)} scenarios, {jobs} job(s)"
        f"{mode})"
    )
    results = _results(seeds, jobs, processes=processes, executor=executor)
    with contextlib.closing(results):  # Ctrl-C in this loop cancels Ray's tasks too
        for result in results:
            scenarios += 1
            totals["events"] += result.enqueued
            totals["acknowledged"] += result.acknowledged
            totals["scheduled"] += result.scheduled
            totals["duplicates"] += result.duplicates
            totals["executions"] += result.executions
            totals["crashes"] += result.crashes
            totals["restarts"] += result.restarts
            totals["reopens"] += result.reopens
            totals["violations"] += len(result.violations)
            faults.frozen_producers += result.frozen_producers
            faults.frozen_workers += result.frozen_workers
            faults.freezes_missed += result.freezes_missed
            faults.refused += result.refused
            if result.big:
                big += 1
                bigs += result.wall_time
            if not result.ok:
                failures.append(result)
                replay = replay_command(result.seed, processes=processes)
                kept = f" (kept: {result.kept})" if result.kept else ""
                print(f"FAIL seed {result.seed}: {result.violations[0]}  [{replay}]{kept}")
            now = time.perf_counter()
            if now - last >= PROGRESS_EVERY:
                last = now
                print(
                    f"  {scenarios}/{len(seeds)} scenarios, {totals['events']} events, "
                    f"{totals['crashes']} crashes, {len(failures)} failing, {now - started:.0f}s",
                    flush=True,
                )
    elapsed = time.perf_counter() - started
    print(
        f"chaos summary: {scenarios} scenarios, {totals['events']} events "
        f"({totals['acknowledged']} acknowledged enqueues, {totals['scheduled']} of them "
        f"scheduled, {totals['duplicates']} duplicates answered), "
        f"{totals['executions']} executions, "
        f"{totals['crashes']} crashes, {totals['restarts']} restarts, {totals['reopens']} reopens, "
        f"{totals['violations']} violations in {len(failures)} scenarios, {elapsed:.1f}s"
    )
    if processes:
        family = f"{big:.0f} of the big family ({bigs / big:.1f} wall s each)" if big else "none"
        print(f"  processes: {_freezes(faults)}; seeds {family}")
    if failures:
        print("replay each failing seed with:")
        for result in failures:
            print(f"  {replay_command(result.seed, processes=processes)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
