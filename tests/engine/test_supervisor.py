"""The supervisor and the mailbox on their own: restarts, kept messages, counting, closing.

The engine's tests (test_restart_backoff.py, test_direct_enqueue.py, the chaos
harness) cover them through real actors; these pin each rule with stand-ins.
"""

from __future__ import annotations

from typing import Any, cast

import pykka
import pytest

from dopool import PoolClosedError, SimulatedClock
from dopool._clock.quiescence import Activity
from dopool._clock.threads import Inbox
from dopool._engine.mailbox import Mailbox
from dopool._engine.messages import Alarm, Control, Kill, Recover, Reply
from dopool._engine.supervisor import RESTARTS_AT_ONCE, KillFlag, Supervisor, restart_delay
from dopool._errors import InstanceCrashedError, NotLeasedError
from dopool._machine.types import Pause

KEY = "p:0"


class _Envelope:
    """What pykka puts in an inbox: a message, and the future of an ``ask``."""

    def __init__(self, message: Any, reply_to: pykka.Future[Any] | None = None) -> None:
        self.message = message
        self.reply_to = reply_to


class _Ref:
    """An actor reference that records what it is told.

    Given the ``activity``, it handles each message at once (counting it done, as an
    actor does); without, it handles nothing and the messages wait in its inbox.
    """

    def __init__(self, activity: Activity | None = None) -> None:
        self.actor_inbox = Inbox()
        self.told: list[Any] = []
        self._activity = activity

    def tell(self, message: Any) -> None:
        self.told.append(message)
        if self._activity is None:
            self.actor_inbox.put(_Envelope(message))
        else:
            self._activity.done(KEY)


def _ref(ref: _Ref) -> pykka.ActorRef[Any]:
    return cast(pykka.ActorRef[Any], ref)


def _mailbox(clock: SimulatedClock) -> tuple[Mailbox, _Ref]:
    """A mailbox with an actor behind it that handles nothing (it is about to die)."""
    mailbox = Mailbox("p", 0, KEY, clock.activity)
    first = _Ref()
    mailbox.attach(_ref(first))
    return mailbox, first


def test_a_successor_gets_its_first_messages_then_what_waited_in_order() -> None:
    clock = SimulatedClock()
    mailbox, dead = _mailbox(clock)
    alarm, pause = Alarm(), Control(Pause(), Reply())
    assert mailbox.send(alarm)
    assert mailbox.send(pause)
    recover = Recover(None, restarts=1)
    successor = _Ref(clock.activity)

    assert mailbox.replace(dead.actor_inbox, lambda: _ref(successor), [recover])

    assert successor.told == [recover, alarm, pause]
    assert not clock.activity.busy({KEY})  # each counted once, and done once
    assert mailbox.send(Alarm())
    assert len(successor.told) == 4


def test_without_an_actor_engine_messages_are_kept_and_callers_fail_at_once() -> None:
    clock = SimulatedClock()
    mailbox, dead = _mailbox(clock)
    waiting_alarm, waiting_pause = Alarm(), Control(Pause(), Reply())
    mailbox.send(waiting_alarm)
    mailbox.send(waiting_pause)
    recover = Recover(None, restarts=4)

    assert mailbox.replace(dead.actor_inbox, None, [recover])

    with pytest.raises(InstanceCrashedError):
        waiting_pause.reply.get(timeout=0)
    later_alarm, later_pause = Alarm(), Control(Pause(), Reply())
    assert mailbox.send(later_alarm)
    assert not mailbox.send(later_pause)
    with pytest.raises(InstanceCrashedError):
        later_pause.reply.get(timeout=0)
    # Busy for join, but asleep: the clock may be driven to the restart.
    assert clock.activity.busy({KEY})
    assert clock.activity.wait_quiet(timeout=0)

    successor = _Ref(clock.activity)
    assert mailbox.reattach(lambda: _ref(successor))
    assert successor.told == [recover, waiting_alarm, later_alarm]
    assert not clock.activity.busy({KEY})


def test_a_closed_mailbox_starts_no_successor_and_answers_what_waited() -> None:
    clock = SimulatedClock()
    mailbox, dead = _mailbox(clock)
    pause = Control(Pause(), Reply())
    mailbox.send(pause)
    stop: pykka.Future[Any] = pykka.ThreadingFuture()
    dead.actor_inbox.put(_Envelope(object(), reply_to=stop))  # close()'s stop request
    assert mailbox.close() is not None

    def never() -> pykka.ActorRef[Any]:
        raise AssertionError("a closed mailbox started a successor")

    assert not mailbox.replace(dead.actor_inbox, never, [Recover(None, restarts=1)])
    assert stop.get(timeout=0) is None
    with pytest.raises(PoolClosedError):
        pause.reply.get(timeout=0)
    assert not clock.activity.busy({KEY})
    assert not mailbox.send(Alarm())


def test_a_vacated_mailbox_tells_what_waited_that_another_worker_serves_it() -> None:
    """A lease lost mid-message closes the address as vacant: a caller's message that
    waited in the dying actor's inbox is answered NotLeasedError, as a later one is, so
    the caller stores its enqueue as a producer's instead of failing as if closed."""
    clock = SimulatedClock()
    mailbox, dead = _mailbox(clock)
    waited = Control(Pause(), Reply())
    mailbox.send(waited)
    assert mailbox.close(vacant=True) is not None

    assert not mailbox.replace(dead.actor_inbox, None, [])
    with pytest.raises(NotLeasedError):
        waited.reply.get(timeout=0)
    later = Control(Pause(), Reply())
    assert not mailbox.send(later)
    with pytest.raises(NotLeasedError):
        later.reply.get(timeout=0)
    assert not clock.activity.busy({KEY})


def test_closing_drops_the_messages_kept_for_a_restart() -> None:
    clock = SimulatedClock()
    mailbox, dead = _mailbox(clock)
    mailbox.send(Alarm())
    assert mailbox.replace(dead.actor_inbox, None, [Recover(None, restarts=1)])
    assert clock.activity.busy({KEY})

    mailbox.close()

    assert not clock.activity.busy({KEY})
    assert not mailbox.reattach(lambda: _ref(_Ref()))


class _Incarnations:
    """Starts stand-in actors for a supervisor, remembering each one's kill flag."""

    def __init__(self, activity: Activity) -> None:
        self.activity = activity
        self.refs: list[_Ref] = []
        self.flags: list[KillFlag] = []

    def __call__(self, kill: KillFlag) -> pykka.ActorRef[Any]:
        ref = _Ref(self.activity)
        self.refs.append(ref)
        self.flags.append(kill)
        return _ref(ref)

    def crash(self, supervisor: Supervisor, in_hand: Any = None) -> float | None:
        """The current incarnation dies handling ``in_hand``, as ``InstanceActor._crash`` does."""
        return supervisor.crashed(self.refs[-1].actor_inbox, in_hand)


def _supervised() -> tuple[Supervisor, _Incarnations, SimulatedClock]:
    clock = SimulatedClock()
    incarnations = _Incarnations(clock.activity)
    supervisor = Supervisor(Mailbox("p", 0, KEY, clock.activity), clock, incarnations)
    supervisor.activate()
    supervisor.recovered(0)  # as the actor's first recovery commits
    return supervisor, incarnations, clock


def test_kill_sets_the_current_incarnations_flag_and_its_successor_gets_a_fresh_one() -> None:
    supervisor, incarnations, _ = _supervised()
    assert supervisor.takes_direct_calls()

    supervisor.kill()

    assert incarnations.flags[0].raised
    assert isinstance(incarnations.refs[0].told[-1], Kill)
    assert not supervisor.takes_direct_calls()  # a call after kill() comes after the crash
    assert incarnations.crash(supervisor) is None
    assert len(incarnations.refs) == 2
    assert not incarnations.flags[1].raised
    assert not supervisor.takes_direct_calls()  # until the successor's recovery commits
    recover = incarnations.refs[1].told[0]
    assert isinstance(recover, Recover)
    assert recover.restarts == 1
    supervisor.recovered(recover.restarts)
    assert supervisor.takes_direct_calls()


def test_ordered_kills_never_back_off_but_crashes_in_a_row_do() -> None:
    supervisor, incarnations, clock = _supervised()
    for _ in range(RESTARTS_AT_ONCE + 2):  # runtime.kill's orders: not a sick instance
        supervisor.kill()
        assert incarnations.crash(supervisor) is None
    assert supervisor.crash_streak == 0

    for streak in range(1, RESTARTS_AT_ONCE + 1):
        assert incarnations.crash(supervisor, Alarm()) is None
        assert supervisor.crash_streak == streak
    started = len(incarnations.refs)
    alarm = Alarm()  # retried after a crash: kept for the successor
    delay = incarnations.crash(supervisor, alarm)

    assert delay == restart_delay(RESTARTS_AT_ONCE + 1) > 0
    due = supervisor.restart_at
    assert due == clock.now() + delay
    assert len(incarnations.refs) == started  # no successor yet
    supervisor.kill()  # nothing to kill while a restart waits
    supervisor.arm_restart()
    clock.run_until(clock.now() + delay)
    assert supervisor.restart_at is None
    successor = incarnations.refs[-1]
    assert len(incarnations.refs) == started + 1
    recover = successor.told[0]
    assert isinstance(recover, Recover)
    # Every restart since the last recorded one, the ordered ones included.
    assert recover.restarts == RESTARTS_AT_ONCE + 2 + RESTARTS_AT_ONCE + 1
    assert successor.told[1:] == [alarm]


def test_handling_a_message_ends_a_crash_streak_but_a_recovery_or_a_kill_does_not() -> None:
    supervisor, incarnations, _ = _supervised()
    incarnations.crash(supervisor)
    incarnations.crash(supervisor)
    supervisor.handled(Recover(None, restarts=2))
    supervisor.handled(Kill())
    assert supervisor.crash_streak == 2
    supervisor.handled(Alarm())
    assert supervisor.crash_streak == 0


def test_closing_cancels_a_waiting_restart() -> None:
    supervisor, incarnations, clock = _supervised()
    for _ in range(RESTARTS_AT_ONCE + 1):
        delay = incarnations.crash(supervisor)
    assert delay is not None
    supervisor.arm_restart()
    started = len(incarnations.refs)

    assert supervisor.close() is None  # no actor behind the address
    clock.run_until(clock.now() + delay + 1)

    assert len(incarnations.refs) == started
    assert supervisor.restart_at is None
    assert not clock.activity.busy({KEY})
    with pytest.raises(PoolClosedError):
        supervisor.kill()
