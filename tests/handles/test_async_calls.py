"""The awaitable calls (docs/api.md, "Awaitable calls"): ``enqueue_async`` and the others a
web handler makes, on a ``WorkerPool`` and a ``ProducerPool``: the same results as the
blocking calls, the event loop running while a call waits for its commit, concurrent
awaits sharing commits, and under a simulated clock the calls made on the loop's thread."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import dopool
from dopool import EventContext, PoolStatus, Runtime
from writer_lock_support import held

TIMEOUT = 30.0


def test_a_worker_pools_awaited_calls_answer_as_the_blocking_ones(tmp_path: Path) -> None:
    seen: list[int] = []

    def record(ctx: EventContext) -> None:
        seen.append(ctx.event)

    async def main(runtime: Runtime) -> tuple[PoolStatus, bool, str | None]:
        pool = runtime.define("jobs", execute=record, concurrency=4)
        pool.pause()
        results = await asyncio.gather(*(pool.enqueue_async(n) for n in range(50)))
        more = await pool.enqueue_many_async([50, 51], partition_key="k")
        assert len({r.event_id for r in [*results, *more]}) == 52
        cancelled = await pool.cancel_async(results[0].event_id)
        info = await pool.event_async(results[1].event_id)
        status = await pool.status_async(limit=1)
        pool.resume()
        assert await asyncio.to_thread(pool.join, TIMEOUT)
        return status, cancelled, None if info is None else info.state

    with Runtime(tmp_path / "store") as runtime:
        status, cancelled, state = asyncio.run(main(runtime))
    assert (status.pending, len(status.instances), cancelled, state) == (51, 1, True, "pending")
    assert sorted(seen) == list(range(1, 52))


def test_concurrent_awaits_share_commits(tmp_path: Path) -> None:
    """200 enqueues awaited at once: each waits in a thread of the loop's executor, and the
    runtime's committer gathers those waiting, so fewer commits than events."""

    async def main(runtime: Runtime) -> None:
        pool = runtime.define("jobs", execute=lambda ctx: None)
        pool.pause()
        await asyncio.gather(*(pool.enqueue_async(n) for n in range(200)))

    with Runtime(tmp_path / "store") as runtime:
        before = runtime._store.commit_counts
        asyncio.run(main(runtime))
        after = runtime._store.commit_counts
        assert runtime.pools["jobs"].status().pending == 200
    assert after[0] - before[0] < 200  # one call after another: a commit each


def test_the_loop_runs_while_an_awaited_enqueue_waits_for_the_writer_lock(
    tmp_path: Path,
) -> None:
    """A producer's enqueue waits for the writer lock another process holds: meanwhile the
    coroutine that awaits it has let the loop go on (a call made on the loop's thread would
    hold it until the lock timed out, and the task would be done, refused)."""
    store = tmp_path / "store"
    with Runtime(store) as runtime:
        runtime.define("jobs", execute=lambda ctx: None)

    async def main(connection: dopool.Connection) -> str:
        pool = connection.pool("jobs")
        with held(store):
            task = asyncio.create_task(pool.enqueue_async({"n": 1}))
            for _ in range(5):
                await asyncio.sleep(0)  # the task starts, and its call waits in a thread
            assert not task.done()
        result = await asyncio.wait_for(task, TIMEOUT)
        return result.event_id

    with dopool.connect(store, lock_timeout=5.0) as connection:
        event_id = asyncio.run(main(connection))
        assert connection.pool("jobs").event(event_id) is not None


@pytest.mark.parametrize("backend", ["greenlet", "threads"])
def test_under_a_simulated_clock_the_calls_are_made_on_the_loops_thread(
    tmp_path: Path, backend: str
) -> None:
    """A greenlet-backed runtime answers only the thread that drives its clock, and a
    simulated run repeats only if its calls are ordered: both hold, awaited."""
    ran: list[tuple[float, int]] = []

    def record(ctx: EventContext) -> None:
        ran.append((ctx.started_at, ctx.event))

    async def main(runtime: Runtime) -> None:
        pool = runtime.define("jobs", execute=record, concurrency=2)
        await pool.enqueue_async(1, delay=5.0)
        await pool.enqueue_many_async([2, 3])
        assert (await pool.status_async()).pending == 3

    runs: list[list[tuple[float, int]]] = []
    for _ in range(2):
        ran.clear()
        with Runtime.simulated(tmp_path / f"store-{len(runs)}", backend=backend) as runtime:
            asyncio.run(main(runtime))
            assert runtime.pools["jobs"].join(timeout=TIMEOUT)
        runs.append(list(ran))
    assert runs[0] == runs[1]
    assert sorted(event for _, event in runs[0]) == [1, 2, 3]
    assert (5.0, 1) in runs[0]
