"""``dopool chaos``: the long mode of the chaos harness, and the replay of one seed.

    dopool chaos --seeds 5000 [--start N] [--jobs J]   # run seeds N .. N+4999
    dopool chaos --seed S [--trace FILE] [--verbose]  # replay one seed exactly
    dopool chaos --processes --seeds 40 [--start N] [--jobs J]  # real processes
    dopool chaos --processes --seed S [--keep]        # one seed's plan again

(``python -m chaos`` in the repository is the same.) ``--processes`` runs the
multi-process mode (:mod:`dopool._chaos.procs`): producer processes, ``dopool
worker`` processes SIGKILLed and restarted, writers frozen holding the store's writer
lock; a replay runs the same plan, not the same interleavings.

Prints a progress line now and then and a summary of scenarios, events,
executions, crashes, restarts and violations (with ``--processes``, also the big
family's seeds and the frozen-writer faults that landed). Exits 1 if any scenario
broke an invariant, after printing, for each such seed, the command that replays it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from dopool._chaos.procs import seed as procs
from dopool._chaos.procs.plan import draw as draw_plan
from dopool._chaos.result import Result, replay_command
from dopool._chaos.runner import run_seed, run_seed_quietly
from dopool._chaos.scenario import generate
from dopool._sim.interrupt import interruptible

PROGRESS_EVERY = 5.0  # wall seconds between progress lines


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, as every dopool command has them (not usage, then error)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"Error: {message} (see '{self.prog} --help')\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="dopool chaos", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=200, help="how many scenarios to run")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="run only this seed (a replay)")
    parser.add_argument("--trace", type=Path, help="with --seed: write the runtime trace here")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (long mode)")
    parser.add_argument(
        "--verbose", action="store_true", help="with --seed: print the scenario and its history"
    )
    parser.add_argument(
        "--processes",
        action="store_true",
        help="the multi-process mode: producer processes and dopool workers, SIGKILLed",
    )
    parser.add_argument(
        "--keep", action="store_true", help="with --processes --seed: keep the run's directory"
    )
    args = parser.parse_args(argv)
    if args.processes and args.trace is not None:
        parser.error("--trace is for the in-process mode (--processes keeps records instead)")
    if args.keep and not (args.processes and args.seed is not None):
        parser.error("--keep needs --processes --seed")
    if args.trace is not None and (args.trace.is_dir() or not args.trace.resolve().parent.is_dir()):
        parser.error(f"--trace {str(args.trace)!r}: not a file in a directory that exists")
    if args.seed is None and args.trace is not None:
        parser.error("--trace needs --seed")
    if args.seed is None and (args.seeds < 1 or args.jobs < 1):
        parser.error("--seeds and --jobs must be at least 1")
    try:
        if args.seed is not None:
            if args.processes:
                return _replay_processes(args.seed, keep=args.keep, verbose=args.verbose)
            with interruptible() as interrupt:
                code = _replay(args.seed, args.trace, verbose=args.verbose)
            interrupt.check()
            return code
        jobs = min(args.jobs, args.seeds)  # a process per seed at most, not --jobs of them
        return _long(range(args.start, args.start + args.seeds), jobs, processes=args.processes)
    except KeyboardInterrupt:
        print("Error: interrupted: the chaos run stopped before its end", file=sys.stderr)
        return 128 + 2  # as a shell reports a process that SIGINT ended


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


def _results(seeds: range, jobs: int, *, processes: bool) -> Iterator[Result]:
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


def _long(seeds: range, jobs: int, *, processes: bool = False) -> int:
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
    for result in _results(seeds, jobs, processes=processes):
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
