"""The public handles: ``Runtime``, ``WorkerPool``, ``Connection`` and ``ProducerPool``.

With what they read and control through the engine: filters, recurring schedules,
live control from another process.
"""
