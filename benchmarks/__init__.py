"""Benchmarks: dopool on disk beside SqliteHuey, persist-queue and raw LMDB.

Run them with ``python -m benchmarks`` (``--quick`` for a smoke run, ``--help`` for the
options); ``python -m benchmarks.simulate`` times the simulator beside a SimPy model of the same
scenario (:mod:`benchmarks.simpy_model`).
"""
