"""The chaos harness for dopool: seeded random workloads under random fault plans.

A scenario (:mod:`chaos.scenario`) is generated from one integer seed: a pool of 1-4
instances, a retry policy, a fault plan, and steps — bursts of enqueues over skewed
partition keys, virtual time, pauses, resumes, drains, kills, redrives and whole-runtime
close-and-reopen. :mod:`chaos.runner` runs it on a SimulatedClock and
:mod:`chaos.checker` checks SPEC §4 after every step and at the end. A failure prints
the seed and ``python -m chaos --seed S``, which replays it exactly.

``pytest chaos`` is the quick mode; ``python -m chaos --seeds 5000`` the long one.
"""
