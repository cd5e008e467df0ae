"""The chaos harness: seeded random workloads under random fault plans, checked.

A scenario (:mod:`.scenario`) is generated from one integer seed: a pool of 1-4
instances, a retry policy, a fault plan, and steps — bursts of enqueues over skewed
partition keys, virtual time, pauses, resumes, drains, kills, redrives and
whole-runtime close-and-reopen. :mod:`.runner` runs it on a SimulatedClock (driven
as :mod:`.clockdriver` says) and records what it observes (:mod:`.history`);
:mod:`.checker` checks the guarantees of docs/guarantees.md after every step and at
the end, replaying that record (:mod:`.replay`) and comparing it with storage
(:mod:`.snapshot`). A failure (:mod:`.result`) prints the seed and the command that
replays it exactly.
:mod:`.harness` is the long mode behind ``dopool chaos`` and ``python -m chaos``;
``pytest chaos`` (in the repository) is the quick mode.
"""
