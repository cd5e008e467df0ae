"""Seeded random streams that are cheap to make: one per attempt, per follow-up, per payload.

A simulated handler draws each attempt's service time (and whether it fails)
from a stream of its own, named by the scenario's seed, the event and the
attempt, so an attempt behaves the same whatever ran before it. Making a
``random.Random`` costs ~7 µs (it fills the Mersenne Twister's 2.5 KB state);
a run of 100,000 events makes as many streams, which was a twentieth of its
wall time. :class:`Draws` is a ``random.Random`` whose state is one 64-bit
word: seeded from the name's BLAKE2b digest, stepped by SplitMix64 (Steele,
Lea and Flood, 2014; the generator Java's ``SplittableRandom`` uses), ~2 µs to
make. Every method of ``random.Random`` that builds on ``random()``
(``expovariate``, ``lognormvariate``, ``choice``...) works on it unchanged.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / the golden ratio: SplitMix64's increment
_TO_UNIT = 2.0**-53


class Draws(random.Random):
    """A seeded stream of uniform draws in [0, 1), named by a string (see the module)."""

    _state: int

    def __init__(self, name: str | int) -> None:
        """``name``: a string (hashed), or a 64-bit state to start from (see
        :func:`attempt_draws`)."""
        # What random.Random.__init__ does, without the call to seed(): one stream
        # is made per attempt.
        self._state = name & _MASK if type(name) is int else _digest(str(name))
        self.gauss_next = None

    def seed(self, a: Any = None, version: int = 2) -> None:
        self._state = _digest(str(a))

    def random(self) -> float:
        state = self._state = (self._state + _GOLDEN) & _MASK
        mixed = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        mixed = ((mixed ^ (mixed >> 27)) * 0x94D049BB133111EB) & _MASK
        return ((mixed ^ (mixed >> 31)) >> 11) * _TO_UNIT

    def getrandbits(self, k: int) -> int:
        """``k`` random bits (``randrange``, ``choice`` and ``shuffle`` use them)."""
        if k < 0:
            raise ValueError("number of bits must be non-negative")
        bits, have = 0, 0
        while have < k:
            bits = (bits << 53) | int(self.random() * 2.0**53)
            have += 53
        return bits >> (have - k)

    def getstate(self) -> tuple[int]:
        return (self._state,)

    def setstate(self, state: Any) -> None:
        (self._state,) = state


def _digest(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def attempt_draws(seed: int, identity: object, attempt: int) -> Draws:
    """The stream an attempt of event ``identity`` draws its service time and failure from.

    An arrival's identity is its number: the stream then starts from a state made of
    the three numbers with odd 64-bit multipliers (as Java's ``SplittableRandom``
    derives its seeds), which SplitMix64's output function scrambles; no string is
    made or hashed. A follow-up's identity is a string, hashed with the rest.
    """
    if type(identity) is int and type(seed) is int:
        return Draws(seed * _SEED_MIX + identity * _ID_MIX + attempt * _GOLDEN)
    return Draws(f"{seed}/{identity}/{attempt}")


# Odd 64-bit multipliers for attempt_draws: MurmurHash3's and SplitMix64's constants.
_SEED_MIX = 0xFF51AFD7ED558CCD
_ID_MIX = 0xC4CEB9FE1A85EC53
