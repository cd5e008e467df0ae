"""Per-attempt middleware (docs/api.md, "Middleware"): each hook, their order, what a
hook that raises does, and what is refused at ``define``."""

from __future__ import annotations

from pathlib import Path

import pytest

from dopool import (
    ConfigurationError,
    EventContext,
    Middleware,
    Outcome,
    PermanentError,
    RetryAfter,
    RetryPolicy,
    Runtime,
)

TIMEOUT = 30.0
RETRY = RetryPolicy(max_attempts=3, initial_delay=1.0, jitter=0.0)


class Recorder(Middleware):
    """Notes each hook it sees in a shared journal, under its name."""

    def __init__(self, name: str, journal: list[str]) -> None:
        self.name = name
        self.journal = journal
        self.outcomes: list[Outcome] = []

    def before(self, ctx: EventContext) -> None:
        self.journal.append(f"{self.name}.before")

    def on_error(self, ctx: EventContext, error: BaseException) -> BaseException:
        self.journal.append(f"{self.name}.on_error({type(error).__name__})")
        return error

    def after(self, ctx: EventContext, outcome: Outcome) -> None:
        self.journal.append(f"{self.name}.after({outcome.state})")
        self.outcomes.append(outcome)


def test_the_runtimes_middleware_wraps_the_pools_and_the_first_wraps_the_rest(
    store_path: Path,
) -> None:
    journal: list[str] = []

    def handle(ctx: EventContext) -> None:
        journal.append("handler")
        if ctx.event == "fail":
            raise KeyError("x")

    outer = [Recorder("r1", journal), Recorder("r2", journal)]
    with Runtime.simulated(store_path, middleware=outer) as runtime:
        assert runtime.middleware == tuple(outer)
        pool = runtime.define("p", execute=handle, middleware=[Recorder("p1", journal)])
        pool.enqueue("ok")
        assert pool.join(timeout=TIMEOUT)
        assert journal == [
            *("r1.before", "r2.before", "p1.before", "handler"),
            *("p1.after(succeeded)", "r2.after(succeeded)", "r1.after(succeeded)"),
        ]
        journal.clear()
        pool.enqueue("fail")
        assert pool.join(timeout=TIMEOUT)
    assert journal == [
        *("r1.before", "r2.before", "p1.before", "handler"),
        *("p1.on_error(KeyError)", "r2.on_error(KeyError)", "r1.on_error(KeyError)"),
        *("p1.after(dead_lettered)", "r2.after(dead_lettered)", "r1.after(dead_lettered)"),
    ]


def test_a_before_that_raises_fails_the_attempt_and_leaves_the_inner_ones_out(
    sim: Runtime,
) -> None:
    journal: list[str] = []

    class Refuse(Recorder):
        def before(self, ctx: EventContext) -> None:
            super().before(ctx)
            raise SystemExit("no tenant")  # a BaseException: a failure like any other

    chain = [Recorder("a", journal), Refuse("b", journal), Recorder("c", journal)]
    pool = sim.define("p", execute=lambda ctx: journal.append("handler"), middleware=chain)
    pool.enqueue("x")
    assert pool.join(timeout=TIMEOUT)
    assert journal == ["a.before", "b.before", "a.on_error(SystemExit)", "a.after(dead_lettered)"]
    (letter,) = pool.dead_letters()
    assert letter.error == "SystemExit: no tenant"
    assert letter.traceback is not None
    assert "in before" in letter.traceback
    assert pool.status().instances[0].restarts == 0


class Policy(Middleware):
    """Turns a ValueError into a dead letter, a LookupError into a retry after 7 s."""

    def on_error(self, ctx: EventContext, error: BaseException) -> BaseException:
        if isinstance(error, ValueError):
            return PermanentError(f"refused: {error}")
        if isinstance(error, LookupError):
            return RetryAfter(7.0)
        return error


def test_on_error_turns_a_failure_into_a_dead_letter_or_a_retry_after(sim: Runtime) -> None:
    journal: list[str] = []
    recorder = Recorder("outer", journal)
    starts: list[tuple[str, int, float]] = []

    def handle(ctx: EventContext) -> None:
        starts.append((ctx.event, ctx.attempt, ctx.started_at))
        if ctx.event == "bad":
            raise ValueError("no such field")
        if ctx.attempt == 1:
            raise KeyError("not yet")

    pool = sim.define("p", execute=handle, retry=RETRY, middleware=[recorder, Policy()])
    pool.enqueue("bad")
    pool.enqueue("late")
    assert pool.join(timeout=TIMEOUT)
    (letter,) = pool.dead_letters()
    assert (letter.error, letter.attempts) == ("PermanentError: refused: no such field", 1)
    assert [(event, attempt) for event, attempt, _ in starts] == [
        ("bad", 1),
        ("late", 1),
        ("late", 2),
    ]
    assert starts[2][2] - starts[1][2] == 7.0  # exactly RetryAfter's, not the policy's 1.0
    assert [(o.state, o.error) for o in recorder.outcomes] == [
        ("dead_lettered", "PermanentError: refused: no such field"),
        ("retried", "RetryAfter: retry after 7 s"),
        ("succeeded", None),
    ]
    assert recorder.outcomes[1].retry_at == starts[2][2]
    assert journal.count("outer.on_error(PermanentError)") == 1  # the inner one's answer


def test_an_on_error_that_raises_or_returns_no_exception_replaces_the_error(
    sim: Runtime,
) -> None:
    class Raises(Middleware):
        def on_error(self, ctx: EventContext, error: BaseException) -> BaseException:
            raise RuntimeError(f"while handling {type(error).__name__}")

    class Forgets(Middleware):
        def on_error(self, ctx: EventContext, error: BaseException) -> BaseException:
            return None  # type: ignore[return-value]  # the mistake under test

    def fail(ctx: EventContext) -> None:
        raise KeyError("x")

    raising = sim.define("raising", execute=fail, middleware=[Raises()])
    forgetting = sim.define("forgetting", execute=fail, middleware=[Forgets()])
    raising.enqueue(1)
    forgetting.enqueue(1)
    assert raising.join(timeout=TIMEOUT)
    assert forgetting.join(timeout=TIMEOUT)
    assert raising.dead_letters()[0].error == "RuntimeError: while handling KeyError"
    assert forgetting.dead_letters()[0].error == (
        "TypeError: Forgets.on_error returned None, not an exception (return the error "
        "given to leave the attempt's failure as it is)"
    )


def test_an_after_that_raises_is_logged_and_changes_nothing(
    sim: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(Middleware):
        def after(self, ctx: EventContext, outcome: Outcome) -> None:
            raise SystemExit("after")

    done: list[str] = []
    pool = sim.define("p", execute=lambda ctx: done.append(ctx.event), middleware=[Broken()])
    pool.enqueue_many(["a", "b"])
    assert pool.join(timeout=TIMEOUT)
    assert done == ["a", "b"]
    status = pool.status()
    assert (status.succeeded, status.instances[0].restarts) == (2, 0)
    logged = [r for r in caplog.records if "Broken.after raised" in r.getMessage()]
    assert [r.levelname for r in logged] == ["ERROR", "ERROR"]


def test_before_writes_are_committed_with_the_attempt_and_discarded_with_its_failure(
    sim: Runtime,
) -> None:
    class Audit(Middleware):
        def before(self, ctx: EventContext) -> None:
            ctx.storage.put(f"seen-{ctx.event}", ctx.attempt)
            ctx.enqueue({"audit": ctx.event}, pool="audit")

    audited: list[object] = []
    audit = sim.define("audit", execute=lambda ctx: audited.append(ctx.event))

    def handle(ctx: EventContext) -> None:
        if ctx.event == "fail":
            raise PermanentError("no")

    pool = sim.define("p", execute=handle, middleware=[Audit()])
    pool.enqueue("ok")
    pool.enqueue("fail")
    assert pool.join(timeout=TIMEOUT)
    assert audit.join(timeout=TIMEOUT)
    assert audited == [{"audit": "ok"}]
    stored = pool.storage(instance=0)
    assert (stored.get("seen-ok"), stored.get("seen-fail")) == (1, None)


def test_middleware_runs_under_the_real_clock(store_path: Path) -> None:
    journal: list[str] = []
    with Runtime(store_path, middleware=[Recorder("r", journal)]) as runtime:
        pool = runtime.define("p", execute=lambda ctx: journal.append("handler"))
        pool.enqueue("x")
        assert pool.join(timeout=TIMEOUT)
    assert journal == ["r.before", "handler", "r.after(succeeded)"]


class Async(Middleware):
    async def before(self, ctx: EventContext) -> None:  # type: ignore[override]
        """Never awaited: refused."""


@pytest.mark.parametrize(
    ("given", "words"),
    [
        (Recorder, "middleware must be a list of dopool.Middleware instances"),
        ([Recorder], "middleware[0] must be a dopool.Middleware instance, got"),
        ([object()], "middleware[0] must be a dopool.Middleware instance"),
        ([Async()], "middleware[0].before"),
    ],
    ids=["not-a-list", "a-class", "not-middleware", "async-hook"],
)
def test_bad_middleware_is_refused_by_name(sim: Runtime, given: object, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words.replace("[", r"\[").replace("]", r"\]")):
        sim.define("p", execute=lambda ctx: None, middleware=given)  # type: ignore[arg-type]
    assert "p" not in sim.pools


def test_a_runtime_with_bad_middleware_creates_no_store(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with pytest.raises(ConfigurationError, match=r"Runtime\(middleware=\)\[0\]"):
        Runtime(path, middleware=[Recorder])  # type: ignore[list-item]
    assert not path.exists()
